// The MPI transport moves bytes as its contract says: ring point-to-point, allgatherv and
// alltoallv with uneven (and zero) block sizes, u64 metadata, f32 sums, splits, and a clear
// error for a message longer than the receive buffer.
#include <gtest/gtest.h>

#include <mpi.h>

#include <numeric>
#include <vector>

#include "collectives/transport/mpi/mpi_transport.h"
#include "gradzip/error.h"
#include "tests/multirank/multirank_support.h"

namespace gradzip {
namespace {

using collectives::MpiTransport;

std::byte byte_of(int source, std::size_t i) { return std::byte(static_cast<unsigned char>(source * 31 + i * 7)); }

TEST(MpiTransport, RingExchangeDeliversEachNeighboursBytes) {
  MpiTransport transport(MPI_COMM_WORLD);
  const int rank = transport.rank(), size = transport.size();
  const int right = (rank + 1) % size, left = (rank + size - 1) % size;
  std::vector<std::byte> out(1000 + rank), in(2000);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = byte_of(rank, i);
  auto recv = transport.irecv(left, 7, in);
  auto send = transport.isend(right, 7, out);
  EXPECT_EQ(transport.wait(send), out.size());
  ASSERT_EQ(transport.wait(recv), static_cast<std::size_t>(1000 + left));
  for (std::size_t i = 0; i < static_cast<std::size_t>(1000 + left); ++i)
    ASSERT_EQ(in[i], byte_of(left, i)) << "byte " << i;
}

TEST(MpiTransport, AllgathervConcatenatesUnevenBlocksInRankOrder) {
  MpiTransport transport(MPI_COMM_WORLD);
  const int size = transport.size();
  std::vector<std::size_t> counts(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) counts[static_cast<std::size_t>(r)] = static_cast<std::size_t>(r % 3) * 5;
  std::vector<std::byte> mine(counts[static_cast<std::size_t>(transport.rank())]);
  for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = byte_of(transport.rank(), i);
  std::vector<std::byte> all(std::accumulate(counts.begin(), counts.end(), std::size_t{0}));
  transport.allgatherv(mine, all, counts);
  std::size_t offset = 0;
  for (int r = 0; r < size; ++r) {
    for (std::size_t i = 0; i < counts[static_cast<std::size_t>(r)]; ++i)
      ASSERT_EQ(all[offset + i], byte_of(r, i)) << "rank " << r << " byte " << i;
    offset += counts[static_cast<std::size_t>(r)];
  }
}

TEST(MpiTransport, AlltoallvDeliversBlockDToRankD) {
  MpiTransport transport(MPI_COMM_WORLD);
  const int rank = transport.rank(), size = transport.size();
  // Rank s sends (s + d) % 4 bytes to rank d, each byte = byte_of(s * 100 + d, i).
  std::vector<std::size_t> send_counts(static_cast<std::size_t>(size)), recv_counts(static_cast<std::size_t>(size));
  std::vector<std::byte> send;
  for (int d = 0; d < size; ++d) {
    send_counts[static_cast<std::size_t>(d)] = static_cast<std::size_t>((rank + d) % 4);
    recv_counts[static_cast<std::size_t>(d)] = static_cast<std::size_t>((d + rank) % 4);
    for (std::size_t i = 0; i < send_counts[static_cast<std::size_t>(d)]; ++i) send.push_back(byte_of(rank * 100 + d, i));
  }
  std::vector<std::byte> recv(std::accumulate(recv_counts.begin(), recv_counts.end(), std::size_t{0}));
  transport.alltoallv(send, send_counts, recv, recv_counts);
  std::size_t offset = 0;
  for (int s = 0; s < size; ++s) {
    for (std::size_t i = 0; i < recv_counts[static_cast<std::size_t>(s)]; ++i)
      ASSERT_EQ(recv[offset + i], byte_of(s * 100 + rank, i)) << "from rank " << s;
    offset += recv_counts[static_cast<std::size_t>(s)];
  }
}

TEST(MpiTransport, MetadataSumsAndSplits) {
  MpiTransport transport(MPI_COMM_WORLD);
  const int rank = transport.rank(), size = transport.size();
  const std::uint64_t mine[2] = {static_cast<std::uint64_t>(rank), 1ull << 40};
  std::vector<std::uint64_t> all(2 * static_cast<std::size_t>(size));
  transport.allgather_u64(mine, all);
  for (int r = 0; r < size; ++r) {
    EXPECT_EQ(all[2 * static_cast<std::size_t>(r)], static_cast<std::uint64_t>(r));
    EXPECT_EQ(all[2 * static_cast<std::size_t>(r) + 1], 1ull << 40);
  }
  std::vector<float> values = {1.0f, static_cast<float>(rank)};
  transport.allreduce_f32_sum(values);
  EXPECT_EQ(values[0], static_cast<float>(size));
  EXPECT_EQ(values[1], static_cast<float>(size * (size - 1) / 2));

  // Even and odd ranks form two groups ordered by old rank.
  auto half = transport.split(rank % 2, rank);
  EXPECT_EQ(half->rank(), rank / 2);
  EXPECT_EQ(half->size(), (size - rank % 2 + 1) / 2);
  auto node = transport.split_by_node();  // one host: every rank shares the node
  EXPECT_EQ(node->size(), size);
  EXPECT_EQ(node->rank(), rank);
}

TEST(MpiTransport, TooLongMessageIsAnErrorNotAnOverflow) {
  MpiTransport transport(MPI_COMM_WORLD);
  const int rank = transport.rank(), size = transport.size();
  const int right = (rank + 1) % size, left = (rank + size - 1) % size;
  std::vector<std::byte> out(64, std::byte{1}), in(16, std::byte{0});
  auto send = transport.isend(right, 9, out);
  auto recv = transport.irecv(left, 9, in);
  try {
    transport.wait(recv);
    ADD_FAILURE() << "a 64-byte message fit a 16-byte buffer";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::malformed_message) << error.what();
  }
  transport.wait(send);
}

TEST(MpiTransport, RejectsPeersOutsideTheGroup) {
  MpiTransport transport(MPI_COMM_WORLD);
  std::vector<std::byte> buffer(4);
  EXPECT_THROW(transport.isend(transport.size(), 0, buffer), Error);
  EXPECT_THROW(transport.irecv(-1, 0, buffer), Error);
}

}  // namespace
}  // namespace gradzip
