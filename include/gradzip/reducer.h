// The Reducer: what a training loop talks to. Gradients are registered once, marked ready as
// backward produces them, and come back averaged (in place) after wait(); compression and
// communication run on background threads while backward goes on.
//
//   gradzip::Reducer reducer(communicator, {.spec = "topk:ratio=0.01;dims<=1->none"});
//   for (auto& p : params) reducer.add(p.name, p.grad_view, p.shape);   // forward order
//   for (each step) {
//     backward: after each layer's gradient exists -> reducer.mark_ready(name);
//     reducer.wait();          // every gradient is now the average over ranks
//     optimizer step; reducer.step();
//   }
//
// Buckets (packed in reverse registration order, first_bucket_bytes then bucket_bytes), groups
// (tensors of one bucket with the same rule and spec, reduced in chunks of chunk_bytes, one
// compressed all-reduce with ReduceOp::average each), lanes (threads with their own duplicate
// transport: lanes > 1 needs MPI_THREAD_MULTIPLE), steps (seed, warm-up, ratio ramp), errors
// (kept on the lanes, rethrown by wait() naming bucket, chunk and tensor; no rank left waiting),
// timeouts and CUDA tensors (one device, packed on it, events on cuda_stream): docs/reducer.md.
//
// Thread safety: add, mark_ready, wait, step, stats and the checkpoint calls are for one thread
// (the training loop's). The tensors handed to add() must stay valid, and must not be written
// by the caller between their mark_ready and the end of wait().
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gradzip/communicator.h"
#include "gradzip/tensor_view.h"

namespace gradzip {

struct ReducerOptions {
  // The model spec: a compression spec for the whole model, then rules by name and size, each
  // after a ';':
  //
  //   model_spec := spec { ';' rule }
  //   rule       := condition '->' spec
  //   condition  := 'dims<=1'       tensors registered with a shape of at most one dimension
  //               | 'bytes<' N      tensors of fewer than N f32 bytes (count * 4 < N)
  //               | 'name=' GLOB    tensor names matching GLOB ('*' any run, '?' one char)
  //               | '*'             every tensor
  //
  // e.g. "topk:ratio=0.01,warmup=100; name=*.bias->none; dims<=1->fp16". Spaces around the
  // parts are ignored. The first rule whose condition holds gives a tensor its spec; with
  // default_rules the rules "dims<=1->none" and "bytes<MIN->none" (MIN: the model spec's
  // min_bytes) follow the given ones; a tensor no rule takes gets the model spec. Empty: the
  // communicator's default spec. Parsed at construction (ErrorCode::invalid_spec naming the
  // rule and what is accepted). powersgd applies to tensors with a shape of two or more
  // dimensions (rows = shape[0]); others in a powersgd rule are reduced uncompressed.
  std::string spec;
  bool default_rules = true;

  std::size_t first_bucket_bytes = std::size_t{1} << 20;  // 1 MiB
  std::size_t bucket_bytes = std::size_t{25} << 20;       // 25 MiB
  std::size_t chunk_bytes = std::size_t{4} << 20;         // 4 MiB
  int lanes = 2;                                          // communication threads, >= 1
  // CUDA tensors: the stream (a cudaStream_t) whose work produces the gradients; mark_ready
  // records an event on it. nullptr: the legacy default stream.
  void* cuda_stream = nullptr;

  // A timeline of steps [timeline_first_step, timeline_first_step + timeline_steps) as a Chrome
  // trace / Perfetto JSON file (tracks, spans and args: docs/reducer.md, "Timeline"), written
  // when the last of those steps' wait() ends (returns or throws), else by the destructor. Rank r
  // writes timeline_path with "{rank}" replaced by r; a path without "{rank}" gets ".rank<r>"
  // before its extension when there is more than one rank. Empty: no timeline. The environment
  // overrides these: GRADZIP_TIMELINE (a path), GRADZIP_TIMELINE_STEPS ("COUNT" or
  // "FIRST:COUNT"). Step 1 by default: step 0 also pays one-time costs (buffers, first calls).
  std::string timeline_path;
  std::uint64_t timeline_first_step = 1;
  std::uint64_t timeline_steps = 1;
};

// One group of one bucket as run in a step.
struct ReducerGroupStats {
  std::string spec;                // effective spec of the step (warm-up and ramp applied)
  std::string rule;                // the rule that chose it, e.g. "dims<=1->none" or "model"
  std::vector<std::string> tensors;
  std::size_t count = 0;           // elements
  std::size_t chunks = 0;
  std::vector<std::string> algorithms;  // distinct CollectiveStats::algorithm of its calls
  std::uint64_t sent_bytes = 0;
  std::uint64_t encoded_input_bytes = 0;
  std::uint64_t encoded_message_bytes = 0;
};

struct ReducerBucketStats {
  std::size_t index = 0;
  std::size_t bytes = 0;  // f32 bytes of its tensors
  std::vector<ReducerGroupStats> groups;
  double launch_seconds = 0;  // since the step's first bucket launch
  double done_seconds = 0;    // since the step's first bucket launch
  std::uint64_t sent_bytes = 0;
};

// The last completed step.
struct ReducerStats {
  std::uint64_t step = 0;
  std::uint64_t sent_bytes = 0;     // all lanes, all buckets (MPI's own all-reduce of
                                    // uncompressed chunks counted as 2(P-1)/P of their bytes)
  std::uint64_t gradient_bytes = 0; // f32 bytes of all registered tensors
  // f32 bytes encoded over message bytes, over all chunks whose codec is not `none` (1 when
  // there were none: uncompressed steps, warm-up).
  double compression_ratio = 1.0;
  // Wall time from the first bucket's launch to the last bucket's completion.
  double communication_seconds = 0;
  // Time the caller spent blocked in wait(): communication that backward did not hide.
  double exposed_seconds = 0;
  // communication_seconds - exposed_seconds (never negative).
  double hidden_seconds = 0;
  // When the step's last mark_ready (or mark_all_ready) marked its tensor, in seconds since the
  // step's first bucket launch. Positive when communication started while the caller was still
  // marking gradients (overlap with backward was possible). At or just below 0 when nothing went
  // out before the last mark: one bucket, mark_all_ready (whose marking launches every bucket at
  // once), or a Reducer that held its buckets back until wait().
  double last_ready_seconds = 0;
  // Chunk calls of this step skipped under nonfinite=skip (compression_spec.h): some rank's
  // gradient held NaN or Inf, so those chunks are zeros on every rank. A training loop should
  // skip its optimizer step when this is non-zero: every rank sees the same value, but buckets
  // reduced earlier in the step ran normally (and updated their error-feedback residuals).
  std::uint64_t skipped_chunks = 0;
  // Chunk calls of this step that fallback=dense sent uncompressed (CollectiveStats::fallback):
  // the cost model predicted the dense all-reduce no slower on this link. Their groups list
  // "mpi" among their algorithms.
  std::uint64_t fallback_chunks = 0;
  std::vector<ReducerBucketStats> buckets;

  // One JSON object: the fields above, buckets and groups included.
  std::string to_json() const;
};

namespace pipeline {
class ReducerState;  // internal
}

class Reducer {
 public:
  // The Reducer runs on duplicates of `communicator`'s transport, one per lane (made here: a
  // collective call, every rank constructs its Reducer together). `communicator` must outlive
  // the Reducer; its own calls do not share state with the Reducer's.
  Reducer(Communicator& communicator, ReducerOptions options = {});
  ~Reducer();  // waits for running buckets (errors are dropped), then stops the lanes
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Registers a gradient (f32, f16 or bf16, in host memory or, for every tensor of the Reducer,
  // on one CUDA device). `shape` (optional) must multiply to
  // tensor.count (else ErrorCode::size_mismatch); rules and PowerSGD use it. Other bad
  // arguments throw ErrorCode::invalid_argument. Names are unique and non-empty. Only before the
  // first mark_ready.
  void add(std::string name, TensorView tensor, std::vector<std::size_t> shape = {});

  // The gradient `name` holds this step's value: its bucket is launched when complete.
  void mark_ready(std::string_view name);
  // Marks every registered tensor not marked yet (for loops that do not track readiness).
  void mark_all_ready();

  // Returns when every bucket of the step is reduced and written back; rethrows lane errors
  // (see above). The next step's mark_ready may follow.
  void wait();

  // Advances the step counter (after wait(); during a step: ErrorCode::invalid_argument).
  // load_state restores it from a checkpoint; set_step sets it. Every rank must be at the same
  // step.
  void step();
  void set_step(std::uint64_t step);
  std::uint64_t current_step() const noexcept;

  // The buckets as frozen: bucket b holds names()[b] in launch order. Empty before freezing.
  std::vector<std::vector<std::string>> buckets() const;

  const ReducerStats& stats() const noexcept;

  // Checkpoint of every lane's error-feedback state (residuals and PowerSGD's Q) and the step,
  // one file per rank in the residual store's format (counter "step"). Valid for the same
  // registrations, options and world size (another world size or rank is refused). After
  // load_state the next steps give the bytes an uninterrupted run would have given (the random
  // streams depend only on the spec's seed, the step and the chunk).
  void save_state(const std::string& path) const;
  void load_state(const std::string& path);

 private:
  std::unique_ptr<pipeline::ReducerState> state_;
};

}  // namespace gradzip
