// The communicator: compressed collectives over a group of ranks.
//
// Every collective is called by all ranks of the communicator, in the same order, with the same
// element count, dtype, spec and reduce op for the same tensor name (a mismatch is detected and
// every rank throws gradzip::Error(size_mismatch) naming the ranks and what differed).
// Buffers are host memory or CUDA memory (TensorView::device); every call is blocking and runs
// in place. CUDA tensors (CommunicatorOptions::cuda_path):
//   - over NCCL, on device memory, when the build has NCCL: the uncompressed path
//     (ncclAllReduce), the ring (every codec but approximate top-k, whose message sizes vary),
//     SRA, the sparse all-gather, reduce-scatter and all-gather, error feedback included (its
//     residuals stay in host memory, copied per encode); the NCCL communicator of a device is
//     made at the first such call (a collective; rank 0's unique id travels over the host
//     transport); stats.note says "over NCCL";
//   - in a build without NCCL, the same calls over MPI on device memory when Open MPI reports
//     itself CUDA-aware (MPIX_Query_cuda_support); stats.note says "over CUDA-aware MPI";
//   - otherwise (random-k's shared-index path, algo=hier, cuda_path staged, neither NCCL nor
//     CUDA-aware MPI) staged: copied to host memory, reduced like host tensors, copied back
//     (stats.note says "staged through host memory" and why).
// Device work runs on the legacy default stream of the tensor's device (after all earlier work
// of blocking streams). A build without CUDA refuses CUDA tensors with ErrorCode::unsupported on
// every rank. Every rank of a call must pass the same kind of memory (the mismatch check
// compares it, and the cuda_path option).
// Results are byte-identical on every rank.
//
// The mismatch check costs one extra all-gather of 96 bytes per rank on every call (with more
// than one rank). A rank whose own arguments are bad (empty name, device memory, a spec that
// does not parse) throws its error after that exchange, and the other ranks throw the same
// error code naming that rank, so no rank is left waiting.
// When a call throws, the tensor's contents are unspecified (except nonfinite=error, below).
//
// Non-finite input (the spec's nonfinite= key, compression_spec.h): before the mismatch check
// every rank counts the NaN / Inf elements of its input (an all-gather: of its own shard), and
// the check tells every rank who has any. When some rank does:
//   propagate (default): the call runs uncompressed ("mpi" for all-reduce, the ring with codec
//              none for reduce-scatter / all-gather) on the raw input, without adding or updating
//              any error-feedback residual: the NaN / Inf land where a plain all-reduce puts them,
//              the same bytes on every rank; stats.note names the ranks;
//   skip:      no data moves; the tensor is zeros on every rank (a finite, identical result),
//              residuals untouched, stats.skipped is true, stats.note names the ranks;
//   error:     every rank throws ErrorCode::nonfinite naming the ranks, their counts and first
//              indices; the tensor is left as passed.
// The name's call number advances in every case. Independently of the policy, error-feedback
// residuals never hold non-finite values (an element that comes out NaN or Inf is stored as 0),
// and narrowing to f16 / bf16 saturates finite values at the format's largest finite value, so
// finite inputs give finite results and finite residuals on every codec.
//
// A tensor's name keys its error-feedback residuals, its random streams and the check. The
// random streams use (spec seed, the name's call number, a hash of the name); the call number
// counts the calls of that name on this communicator (all collectives and specs together) and
// starts at 0 in a new communicator. save_residuals / load_residuals checkpoint the residuals,
// the call numbers and algo=auto's model inputs (the link and the codecs' γ, as counters named
// "gradzip.auto/...": tensor names starting so are reserved), so that a run restarted from a
// checkpoint chooses the same algorithms and continues byte-identically.
// The state of names that stop being used is released (CommunicatorOptions).
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
  // "ring", "sra", "allgather", "randk", "hier/<inner>", or "mpi": the transport's own
  // uncompressed all-reduce (small tensors, warm-up, non-finite input under
  // nonfinite=propagate), whose bytes are MPI's business and are not counted below; "skip":
  // skipped under nonfinite=skip.
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
  // Per-name state follows the live tensor set: the state of a name (its error-feedback
  // residuals, worker and server side, all-gather and hierarchical ones included, and its call
  // number) that no call has used for a whole window of this many calls of the communicator is
  // released at the end of that window, i.e. after between N and 2N - 1 unused calls. Windows
  // are counted in calls (every collective of the communicator, failed ones included), so every
  // rank releases the same names at the same call. A released name that comes back starts
  // anew: zero residuals, call number 0 (so warm-up runs again). The first release that drops
  // residuals writes one warning to stderr naming them (once per communicator): a name only
  // paused, e.g. by a long evaluation loop of other all-reduces on the same communicator, would
  // otherwise restart error feedback silently; use a communicator of its own for such calls,
  // or 0. 0: keep everything.
  std::uint64_t release_unused_after_calls = 10000;
  // Deadline of every blocking wait (each transport completion: point-to-point waits and the
  // collectives the algorithms run; Reducer::wait), in seconds. GRADZIP_TIMEOUT_S, when set,
  // overrides it (fractional seconds allowed; a value that is not a finite positive number
  // throws invalid_argument naming the variable when the communicator is made); <= 0 means
  // GRADZIP_TIMEOUT_S if set, else 600. Splits and the Reducer's lanes inherit the deadline.
  // On expiry the rank writes one block to stderr, starting "gradzip: timeout", naming this
  // rank, the operation (the call, its tensor name, step and the communicator's call sequence
  // number), how long it waited, the peers and bytes of every request still pending, and the
  // ranks that never reached the operation (or are dead), also as MPI_COMM_WORLD ranks; ranks
  // that timed out too are named as such (they tell each other over a side communicator during
  // a grace window of min(5% of the timeout, 5 s), so a rank fails within 1.05 x timeout).
  // Then it acts per on_timeout. With throw_error, the transport that timed out is dead: every
  // later call on it throws ErrorCode::timeout ("this communicator timed out earlier") without
  // calling MPI, and gradzip's own MPI_Finalize at exit is skipped (it could wait for the
  // operation that never finished). After a timeout the application should end the job (exit
  // without MPI_Finalize, or MPI_Abort); the communicator cannot be used again.
  // NCCL transports time out the same way without naming missing ranks; they abort an NCCL
  // communicator they own (ncclCommAbort) first, and in abort mode end this process
  // (std::abort; the launcher then ends the job).
  double timeout_seconds = 0;
  TimeoutAction on_timeout = TimeoutAction::abort;
  // The link algo=auto's cost model assumes (collectives/cost_model.h, docs/cost-model.md).
  // link_gbps > 0 gives it: link_latency_us is α (>= 0), link_gbps the rate of each rank's
  // link in each direction, link_exchange_gbps the rate of a pairwise exchange (0: the same as
  // link_gbps). link_gbps = 0 (the default) measures it instead: the first algo=auto call
  // that needs the model runs collectives::measure_link on the communicator (every rank takes
  // part, as they all make that call; about 0.2 s at 1 Gbit/s) and keeps the result; the
  // other two fields must then be 0 too. GRADZIP_LINK="LATENCY_US,GBPS[,EXCHANGE_GBPS]", when
  // set, overrides all three. Bad values (negative, not finite, latency without a rate) throw
  // invalid_argument when the communicator is made, naming the field or the variable.
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

  // A communicator over the application's NCCL communicator (an ncclComm_t, passed as void*
  // so that this header needs no NCCL header). It reduces CUDA tensors of that communicator's
  // device, over NCCL; host tensors, tensors of another device and the calls that need host
  // memory (random-k's shared-index path, algo=hier) are refused with ErrorCode::invalid_argument
  // or unsupported on every rank. The application keeps ownership: the NCCL communicator must
  // outlive this one. A build without NCCL throws ErrorCode::unsupported.
  static Communicator from_nccl(void* nccl_comm, CommunicatorOptions options = {});

  ~Communicator();
  Communicator(Communicator&&) noexcept;
  Communicator& operator=(Communicator&&) noexcept;

  int rank() const noexcept;
  int size() const noexcept;

  // In-place all-reduce of `tensor` (f32, f16 or bf16; f16 / bf16 are reduced in f32 and
  // rounded to nearest even on the way back). `name` identifies the tensor across calls: it
  // keys the error-feedback residuals (when the spec has ef=on), the random streams (with the
  // name's call number as the step) and the mismatch check. The algorithm follows the spec:
  //   algo=auto: tensors under min_bytes (count * 4 < min_bytes) go uncompressed through MPI's
  //              all-reduce ("mpi", no error feedback); random-k runs its shared-index path;
  //              the others run the algorithm the cost model predicts fastest for this size,
  //              rank count, link (CommunicatorOptions::link_*, measured when not given) and
  //              codec (its γ measured on this CPU once per spec), among those that compress
  //              no more often than the codec's default: ring / SRA / rhd / tree for none,
  //              fp16 and bf16, SRA / tree for qsgd and sign, the sparse all-gather / tree for
  //              topk, and hier when the ranks form two or more nodes of one size (the
  //              spec's ranks_per_node, or with 0 the ranks that share memory, detected at
  //              the first such call) (collectives/algorithm_choice.h); stats.note gives the
  //              predicted times.
  //              CUDA tensors and one-rank communicators take the codec's default (ring, SRA,
  //              the sparse all-gather) without the model;
  //   algo=ring|sra|allgather|rhd|tree: that algorithm at every size;
  //   algo=hier: hierarchical (uncompressed inside nodes of ranks_per_node ranks, or of shared
  //              memory when 0; the codec's default algorithm across nodes);
  //   warmup=N:  the first N calls of a name run uncompressed ("mpi");
  //   powersgd:  ErrorCode::unsupported (a Reducer-level compressor).
  // stats.algorithm says which ran. Returns what this rank did.
  CollectiveStats allreduce(TensorView tensor, std::string_view name, const CompressionSpec& spec,
                            ReduceOp op = ReduceOp::sum);
  CollectiveStats allreduce(TensorView tensor, std::string_view name, std::string_view spec,
                            ReduceOp op = ReduceOp::sum);
  // The same with default_spec().
  CollectiveStats allreduce(TensorView tensor, std::string_view name, ReduceOp op = ReduceOp::sum);

  // Compressed reduce-scatter: `tensor` holds this rank's full contribution; on return, this
  // rank's shard [shard_begin(rank), shard_begin(rank + 1)) of `tensor` holds the reduced shard
  // (the rest of `tensor` is unspecified). Shards are as even as possible: shard r starts at
  // floor(r * count / size). SRA's first half for qsgd and sign (or algo=sra), the ring's
  // first half otherwise; warm-up calls use the ring without compression.
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

  // Checkpoint the error-feedback residuals (worker and server side) and the per-name call
  // numbers of this rank (error_feedback/residual_store.h has the file format and the refusals
  // of load; a checkpoint of another world size or rank is refused). Loading replaces every
  // call number with the file's (a version 1 file has none: all restart at 0). Local: no
  // communication; every rank loads its own file at the same point of the call sequence.
  void save_residuals(const std::string& path) const;
  void load_residuals(const std::string& path);

 private:
  friend struct collectives::CommunicatorAccess;
  explicit Communicator(std::unique_ptr<collectives::CommunicatorState> state);
  std::unique_ptr<collectives::CommunicatorState> state_;
};

}  // namespace gradzip
