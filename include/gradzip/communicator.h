// The communicator: compressed collectives over a group of ranks.
//
// Every collective is called by all ranks, in the same order, with the same count, dtype, kind
// of memory, spec and op for the same tensor name; a mismatch makes every rank throw
// size_mismatch, and a rank's own bad argument makes every rank throw, so none is left waiting.
// Calls are blocking and in place; results are byte-identical on every rank; after a throw the
// tensor's contents are unspecified. Buffers are host or CUDA memory (TensorView::device).
// A tensor's name keys its error-feedback residuals, its random streams (with the name's call
// number) and the check. docs/communicator.md has the policies: CUDA paths, non-finite input,
// names and checkpoints, release of unused names, timeouts, algo=auto.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "gradzip/compression_spec.h"
#include "gradzip/tensor_view.h"

namespace gradzip {

enum class ReduceOp : std::uint8_t {
  sum,      // like MPI_SUM
  average,  // sum / ranks; each contribution is divided before it is encoded
};

// What one collective call did on this rank.
struct CollectiveStats {
  // "ring", "sra", "sparse" (or "sparse->ring", its dense switch), "randk", "hier/<inner>",
  // "allgather" (the all-gather collective), or "mpi": the transport's own
  // uncompressed all-reduce (small tensors, warm-up, non-finite input under
  // nonfinite=propagate, fallback=dense), whose bytes are MPI's business and are not counted
  // below; "skip": skipped under nonfinite=skip.
  std::string algorithm;
  std::string spec;       // canonical spec string
  std::size_t count = 0;  // elements of the tensor
  int ranks = 1;
  // Bytes this rank sent and received, split by what they carry. `index` is top-k indices,
  // `header` the 32-byte message headers, `payload` everything else (values, scales, codes).
  std::uint64_t sent_header_bytes = 0;
  std::uint64_t sent_index_bytes = 0;
  std::uint64_t sent_payload_bytes = 0;
  std::uint64_t received_bytes = 0;
  // f32 input bytes of all messages this rank encoded over those messages' bytes: the codec's
  // compression ratio as used by this call (1 for uncompressed paths).
  double compression_ratio = 1.0;
  std::uint64_t encoded_input_bytes = 0;
  std::uint64_t encoded_message_bytes = 0;
  double encode_seconds = 0;
  double communicate_seconds = 0;
  double decode_seconds = 0;
  double total_seconds = 0;
  // Why the algorithm was chosen or changed (e.g. sparse union too dense -> dense ring; "non-finite
  // input on rank(s) 1,3: ..." when the nonfinite= policy decided).
  std::string note;
  // True when some rank's input held NaN or Inf and the spec says nonfinite=skip: no data
  // moved, the tensor is zeros on every rank and no residual changed.
  bool skipped = false;
  // True when the spec's fallback=dense sent this tensor through the transport's uncompressed
  // all-reduce ("mpi") because the cost model predicted it no slower than the compressed path;
  // the note gives both predictions. With error feedback the residual went into that sum.
  bool fallback = false;

  std::uint64_t sent_bytes() const noexcept {
    return sent_header_bytes + sent_index_bytes + sent_payload_bytes;
  }
  // One line: algorithm, sizes, bytes by kind, ratio, times.
  std::string to_string() const;
};

// How collectives move CUDA tensors.
enum class CudaPath : std::uint8_t {
  automatic,  // NCCL for the calls it serves when the build has NCCL, else CUDA-aware MPI, else staged
  nccl,       // as automatic, but a build without NCCL refuses CUDA tensors (unsupported)
  staged,     // always through host memory and the host transport
};

// What a rank does when one of its blocking waits passes the deadline.
enum class TimeoutAction : std::uint8_t {
  abort,        // print the report to stderr and end the whole job (MPI_Abort, exit code 124)
  throw_error,  // print the report and throw gradzip::Error(ErrorCode::timeout) with its text
};

struct CommunicatorOptions {
  // Spec used when a call passes none. GRADZIP_COMPRESSOR, when set, overrides it. Parsed when
  // the communicator is made (a bad spec throws invalid_spec there).
  std::string default_spec = "none";
  CudaPath cuda_path = CudaPath::automatic;
  // The state of a name (residuals, call number) unused for a whole window of this many calls
  // is released at the window's end, on every rank alike; a warning names released residuals
  // once. 0: keep everything. (docs/communicator.md, "Releasing the state".)
  std::uint64_t release_unused_after_calls = 10000;
  // Deadline of every blocking wait, in seconds; <= 0: GRADZIP_TIMEOUT_S if set, else 600
  // (GRADZIP_TIMEOUT_S overrides it when set). On expiry the rank writes a "gradzip: timeout"
  // report to stderr naming the pending peers and the missing ranks, then acts per on_timeout;
  // after throw_error the communicator cannot be used again. (docs/communicator.md.)
  double timeout_seconds = 0;
  TimeoutAction on_timeout = TimeoutAction::abort;
  // The link algo=auto's cost model assumes: α in µs, the per-direction rate and the pairwise
  // exchange rate (0: the same) in Gbit/s. link_gbps = 0 measures it at the first call that
  // needs it (a collective); GRADZIP_LINK="LATENCY_US,GBPS[,EXCHANGE_GBPS]" overrides all
  // three. Bad values throw invalid_argument naming the field. (docs/communicator.md.)
  double link_latency_us = 0;
  double link_gbps = 0;
  double link_exchange_gbps = 0;
};

namespace collectives {
class CommunicatorState;   // the implementation (internal)
struct CommunicatorAccess;  // how gradzip's own layers reach it (internal)
}  // namespace collectives

class Communicator {
 public:
  // A communicator over MPI_COMM_WORLD. Calls MPI_Init_thread first if the application has not
  // initialised MPI. Throws ErrorCode::unsupported in a build without MPI.
  static Communicator world(CommunicatorOptions options = {});
  // A communicator over an application communicator, given as its Fortran handle so that this
  // header needs no MPI header: Communicator::from_mpi(MPI_Comm_c2f(comm)). gradzip duplicates
  // the communicator; its traffic never matches the application's.
  static Communicator from_mpi(int fortran_comm_handle, CommunicatorOptions options = {});

  // A communicator over the application's NCCL communicator (an ncclComm_t as void*), which
  // must outlive it: CUDA tensors of its device only, over NCCL; other calls are refused on
  // every rank. A build without NCCL throws ErrorCode::unsupported.
  static Communicator from_nccl(void* nccl_comm, CommunicatorOptions options = {});

  ~Communicator();
  Communicator(Communicator&&) noexcept;
  Communicator& operator=(Communicator&&) noexcept;

  int rank() const noexcept;
  int size() const noexcept;

  // In-place all-reduce of `tensor` (f32, f16 or bf16; halves are reduced in f32 and rounded
  // to nearest even). The spec's algo= picks the algorithm: auto (tensors under min_bytes go
  // uncompressed, "mpi"; otherwise the cost model's fastest candidate, docs/communicator.md),
  // ring, sra, sparse, rhd, tree or hier; warmup=N runs a name's first N calls uncompressed;
  // powersgd is refused (unsupported: a Reducer compressor). stats.algorithm says which ran.
  CollectiveStats allreduce(TensorView tensor, std::string_view name, const CompressionSpec& spec,
                            ReduceOp op = ReduceOp::sum);
  CollectiveStats allreduce(TensorView tensor, std::string_view name, std::string_view spec,
                            ReduceOp op = ReduceOp::sum);
  // The same with default_spec().
  CollectiveStats allreduce(TensorView tensor, std::string_view name, ReduceOp op = ReduceOp::sum);

  // Compressed reduce-scatter: `tensor` holds this rank's full contribution; on return, this
  // rank's shard [shard_begin(rank), shard_begin(rank + 1)) of `tensor` holds the reduced shard
  // (the rest of `tensor` is unspecified). Shards are as even as possible: shard r starts at
  // floor(r * count / size). SRA's first half for qsgd, sign and terngrad (or algo=sra),
  // the ring's first half otherwise; warm-up calls use the ring without compression.
  CollectiveStats reduce_scatter(TensorView tensor, std::string_view name,
                                 const CompressionSpec& spec, ReduceOp op = ReduceOp::sum);
  // Compressed all-gather: on entry this rank's shard of `tensor` (same partition) holds its
  // data; on return every shard holds its owner's data after compression (D(C(shard)), the
  // same bytes on every rank, the owner's shard included). With ef=on its residual is kept
  // under "allgather:<name>", apart from the reductions of a tensor with the same name.
  CollectiveStats allgather(TensorView tensor, std::string_view name, const CompressionSpec& spec);

  // The spec calls without one use: CommunicatorOptions::default_spec or GRADZIP_COMPRESSOR.
  const CompressionSpec& default_spec() const noexcept;

  // First element of rank r's shard of a tensor of `count` elements (r in [0, size()]).
  std::size_t shard_begin(std::size_t count, int r) const noexcept;

  // This rank's checkpoint: residuals, call numbers and algo=auto's model inputs, so that a
  // restarted run continues byte-identically. Local (no communication); loading refuses
  // another world size or rank and replaces every call number. (docs/communicator.md.)
  void save_residuals(const std::string& path) const;
  void load_residuals(const std::string& path);

 private:
  friend struct collectives::CommunicatorAccess;
  explicit Communicator(std::unique_ptr<collectives::CommunicatorState> state);
  std::unique_ptr<collectives::CommunicatorState> state_;
};

}  // namespace gradzip
