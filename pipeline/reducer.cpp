// The Reducer (contract in include/gradzip/reducer.h).
//
// Structure: the training-loop thread registers tensors, freezes the layout
// (pipeline/bucket_layout.h) at the first mark_ready, and launches buckets in order by pushing
// one task per chunk (or per PowerSGD group) onto the queue of the chunk's lane. Each lane is a
// thread with its own Communicator over a duplicate of the user's transport; it packs its
// chunk's tensor slices into the group's f32 buffer, runs the compressed all-reduce
// (collectives::allreduce_at_step, with the Reducer's step) and writes the average back. The
// training-loop thread learns about completions through one mutex and condition variable.
#include "gradzip/reducer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>

#include "collectives/communicator_internal.h"
#include "collectives/device_memory.h"
#include "collectives/json_text.h"
#include "collectives/timeline.h"
#include "gradzip/error.h"
#include "kernels/cpu/convert.h"
#include "pipeline/bucket_layout.h"
#include "pipeline/model_spec.h"
#include "pipeline/powersgd.h"

namespace gradzip {
namespace pipeline {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// Top-k / random-k ratio after warm-up: geometric from kRampStartRatio to the target over
// spec.ramp steps (DGC's exponential sparsity warm-up).
constexpr double kRampStartRatio = 0.25;

// The spec a group runs with at `step`: warm-up makes it `none` (no error feedback); the ramp
// raises the ratio of top-k / random-k.
CompressionSpec spec_at_step(const CompressionSpec& spec, std::uint64_t step) {
  if (spec.codec == CodecKind::none) return spec;
  if (step < spec.warmup) {
    CompressionSpec dense;
    dense.seed = spec.seed;
    dense.min_bytes = spec.min_bytes;
    return dense;
  }
  CompressionSpec result = spec;
  const std::uint64_t since = step - spec.warmup;
  const bool ramps = (spec.codec == CodecKind::topk || spec.codec == CodecKind::randk) &&
                     spec.k == 0 && spec.ramp > 0 && since < spec.ramp &&
                     spec.ratio < kRampStartRatio;
  if (ramps) {
    const double progress = static_cast<double>(since + 1) / static_cast<double>(spec.ramp);
    result.ratio = std::pow(kRampStartRatio, 1.0 - progress) * std::pow(spec.ratio, progress);
    result.ratio = std::clamp(result.ratio, spec.ratio, kRampStartRatio);
  }
  return result;
}

// Bytes one rank sends in a ring all-reduce of `bytes` over `ranks` ranks: 2 (P - 1) / P of
// them. Stands in for MPI's own all-reduce, which does not say what it sent.
std::uint64_t ring_bytes_estimate(std::uint64_t bytes, int ranks) {
  if (ranks <= 1) return 0;
  const auto p = static_cast<std::uint64_t>(ranks);
  return 2 * (p - 1) * bytes / p;
}

}  // namespace

// One unit of lane work: a chunk of a dense group, or a whole PowerSGD group.
struct Task {
  std::size_t bucket = 0;
  std::size_t group = 0;
  std::optional<std::size_t> chunk;  // empty: the PowerSGD step of the whole group
  CompressionSpec spec;              // effective at this step
  std::uint32_t step = 0;
  std::optional<Error> preset_error;  // this rank cannot take part (see allreduce_at_step)
};

class ReducerState {
 public:
  ReducerState(Communicator& communicator, ReducerOptions options);
  ~ReducerState();

  void add(std::string name, TensorView tensor, std::vector<std::size_t> shape);
  void mark_ready(std::string_view name);
  void mark_all_ready();
  void wait();
  void set_step(std::uint64_t step) {
    require_idle("step / set_step");
    step_ = step;
  }
  std::uint64_t step() const noexcept { return step_; }
  // After wait() itself timed out, lanes may never finish: the destructor must not wait for
  // them (Reducer::~Reducer then leaks this state instead of destroying it).
  bool timed_out() const noexcept { return !timed_out_.empty(); }
  std::vector<std::vector<std::string>> bucket_names() const;
  const ReducerStats& stats() const noexcept { return stats_; }
  // Not const: it reads the lanes' stores through their (non-const) communicator states.
  void save(const std::string& path);
  void load(const std::string& path);

 private:
  struct Lane {
    Communicator communicator;
    std::thread thread;
    std::deque<Task> queue;  // guarded by ReducerState::mutex_
    const Task* running = nullptr;  // the task the lane runs now, guarded by mutex_
  };
  // A group's packing buffer: host memory, or device memory for CUDA tensors (PowerSGD groups
  // are packed on the host in either case). Empty when every chunk is reduced in place.
  struct GroupBuffer {
    std::vector<float> host;
    std::unique_ptr<collectives::DeviceAllocation> device;
    float* data() const noexcept {
      return device ? reinterpret_cast<float*>(device->data()) : const_cast<float*>(host.data());
    }
  };
  // Per step, per group: what its tasks did (guarded by mutex_).
  struct GroupProgress {
    CollectiveStats total;
    std::uint64_t skipped_chunks = 0;  // chunk calls skipped under nonfinite=skip
    std::uint64_t fallback_chunks = 0;  // chunk calls fallback=dense sent uncompressed
    std::set<std::string> algorithms;
    std::string spec;
  };

  void freeze();
  void launch_ready_buckets();
  void launch(std::size_t bucket, const std::optional<Error>& preset_error);
  void lane_loop(std::size_t lane_index);
  void run(Lane& lane, const Task& task);
  void run_chunk(Lane& lane, const Task& task, const GroupLayout& group, const ChunkLayout& chunk);
  void run_powersgd(Lane& lane, const Task& task, const GroupLayout& group);
  // Adds one call's algorithm and bytes to its group's progress (under mutex_); `compressed`:
  // its encoded bytes count towards the compression ratio.
  void record_progress(const Task& task, const CollectiveStats& stats, std::uint64_t sent,
                       bool compressed);
  // Elements [begin, begin + count) of a group's buffer from (pack) or to (unpack) its tensors.
  // `buffer` is host memory, or device memory when `on_device` (the Reducer's CUDA device).
  void pack(const GroupLayout& group, std::size_t begin, std::size_t count, float* buffer,
            bool on_device) const;
  void unpack(const GroupLayout& group, std::size_t begin, std::size_t count, const float* buffer,
              bool on_device) const;
  bool on_cuda() const noexcept { return memory_.kind == DeviceKind::cuda; }
  // CUDA tensors: waits until the gradients of `group`'s elements [begin, begin + count) have
  // been produced (their mark_ready events).
  void wait_for_gradients(const GroupLayout& group, std::size_t begin, std::size_t count) const;
  // When a chunk lies inside one f32 tensor, that tensor's memory (reduced in place, no copy).
  float* in_place_span(const GroupLayout& group, std::size_t begin, std::size_t count) const;
  // The task's chunk name (or "<group> (powersgd)"); describe_task adds its tensors' names.
  std::string task_label(const Task& task) const;
  std::string describe_task(const Task& task) const;
  void finish_step_stats(Clock::time_point wait_begin, Clock::time_point wait_end);
  // Waits (holding `lock` on mutex_) until every task is done, or times out (see wait_for_tasks'
  // definition): reports, then aborts the job or throws ErrorCode::timeout per the policy.
  void wait_for_tasks(std::unique_lock<std::mutex>& lock);
  void require_idle(const char* op) const;

  Communicator& user_communicator_;
  ReducerOptions options_;
  ModelSpec model_;
  LayoutOptions layout_options_;
  std::vector<RegisteredTensor> tensors_;
  // Transparent hash: mark_ready looks names up without building a std::string.
  struct NameHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view name) const noexcept {
      return std::hash<std::string_view>{}(name);
    }
  };
  std::unordered_map<std::string, std::size_t, NameHash, std::equal_to<>> index_of_;
  std::vector<BucketLayout> layout_;       // empty until frozen
  std::vector<std::size_t> bucket_of_;     // tensor -> bucket
  // [bucket][group]: packing buffers, empty for groups whose chunks are all reduced in place.
  std::vector<std::vector<GroupBuffer>> group_buffers_;
  // Where the registered tensors live (all alike), set by the first add.
  Device memory_{};
  bool memory_known_ = false;
  // CUDA tensors: per tensor, the event mark_ready records on options_.cuda_stream.
  std::vector<std::unique_ptr<collectives::DeviceEvent>> ready_events_;
  bool frozen_ = false;

  // Step state (training-loop thread only).
  std::uint64_t step_ = 0;
  std::vector<bool> ready_;
  std::vector<std::size_t> ready_in_bucket_;
  std::size_t next_launch_ = 0;
  bool step_started_ = false;
  Clock::time_point first_launch_{};
  Clock::time_point last_ready_{};  // this step's last mark_ready / mark_all_ready
  bool launched_any_ = false;
  std::vector<Clock::time_point> launch_time_;

  // Shared with the lanes.
  mutable std::mutex mutex_;
  std::condition_variable lane_wakeup_;
  std::condition_variable task_done_;
  bool stopping_ = false;
  std::size_t tasks_pending_ = 0;
  std::vector<std::size_t> tasks_left_in_bucket_;
  std::vector<Clock::time_point> bucket_done_time_;
  std::vector<std::vector<GroupProgress>> progress_;  // [bucket][group]
  std::vector<std::string> errors_;
  std::optional<ErrorCode> first_error_code_;

  std::vector<Lane> lanes_;
  ReducerStats stats_;

  // The timeline (ReducerOptions::timeline_path): null when none was asked for. Track 0 is the
  // training loop's (mark_ready, launches, wait), track 1 + l lane l's.
  collectives::TimelineRequest timeline_request_;
  std::unique_ptr<collectives::Timeline> timeline_;
  std::string timeline_file_;  // this rank's file
  bool timeline_written_ = false;
  Clock::time_point step_begin_{};  // this step's first mark_ready / launch
  std::uint64_t next_bucket_span_id_ = 0;
  bool recording() const noexcept { return timeline_ && timeline_request_.records(step_); }
  // A lane's task as a span on its track (args bucket, group, step, spec; failed).
  void record_task(const Task& task, int track, Clock::time_point begin, bool failed) noexcept;
  // Records this step's wait and buckets; writes the file after the last recorded step.
  void record_step_end(Clock::time_point wait_begin, Clock::time_point wait_end);
  void write_timeline();
  // The report of a timeout of wait() itself (throw mode); empty while none happened.
  std::string timed_out_;
};

ReducerState::ReducerState(Communicator& communicator, ReducerOptions options)
    : user_communicator_(communicator), options_(std::move(options)) {
  GZ_REQUIRE(options_.lanes >= 1 && options_.lanes <= 64, ErrorCode::invalid_argument,
             "Reducer: lanes = ", options_.lanes, " (accepted: 1 to 64)");
  GZ_REQUIRE(options_.chunk_bytes >= 4, ErrorCode::invalid_argument, "Reducer: chunk_bytes = ",
             options_.chunk_bytes, " (at least one f32 element, 4 bytes)");
  GZ_REQUIRE(options_.first_bucket_bytes > 0 && options_.bucket_bytes > 0,
             ErrorCode::invalid_argument, "Reducer: first_bucket_bytes = ",
             options_.first_bucket_bytes, " and bucket_bytes = ", options_.bucket_bytes,
             " (both must be positive)");
  model_ = ModelSpec::parse(options_.spec, options_.default_rules, communicator.default_spec());
  timeline_request_ = collectives::timeline_request_from_environment(collectives::TimelineRequest{
      options_.timeline_path, options_.timeline_first_step, options_.timeline_steps});
  layout_options_ = LayoutOptions{options_.first_bucket_bytes, options_.bucket_bytes,
                                  options_.chunk_bytes, options_.lanes};

  // The lanes: communicators over duplicates of the user's transport, with algo=auto's link
  // and node structures measured once for the model's specs (a collective: every rank
  // constructs its Reducer in the same order).
  std::vector<const CompressionSpec*> specs{&model_.model};
  for (const TensorRule& rule : model_.rules) specs.push_back(&rule.spec);
  std::vector<Communicator> lane_communicators =
      collectives::make_lane_communicators(communicator, options_.lanes, specs, "Reducer");
  lanes_.reserve(lane_communicators.size());
  for (Communicator& lane : lane_communicators) lanes_.push_back(Lane{std::move(lane), {}, {}});
  if (!timeline_request_.path.empty()) {
    timeline_ = std::make_unique<collectives::Timeline>(communicator.rank());
    timeline_file_ = collectives::timeline_path_for_rank(timeline_request_.path,
                                                         communicator.rank(), communicator.size());
    timeline_->name_track(0, "training loop");
    for (std::size_t l = 0; l < lanes_.size(); ++l)
      timeline_->name_track(static_cast<int>(1 + l), detail::concat("lane ", l));
  }
  for (std::size_t l = 0; l < lanes_.size(); ++l)
    lanes_[l].thread = std::thread([this, l] { lane_loop(l); });
}

ReducerState::~ReducerState() {
  {
    std::unique_lock lock(mutex_);
    task_done_.wait(lock, [&] { return tasks_pending_ == 0; });
    stopping_ = true;
  }
  lane_wakeup_.notify_all();
  for (Lane& lane : lanes_) lane.thread.join();
  // A program that ended before the last recorded step still gets what was recorded.
  if (timeline_ && !timeline_written_ && timeline_->event_count() > 0) {
    try {
      write_timeline();
    } catch (const std::exception& error) {
      std::fprintf(stderr, "gradzip: Reducer: %s\n", error.what());
    }
  }
}

void ReducerState::require_idle(const char* op) const {
  std::lock_guard lock(mutex_);
  GZ_REQUIRE(tasks_pending_ == 0 && !step_started_, ErrorCode::invalid_argument, "Reducer::", op,
             ": a step is in flight (call wait() first)");
}

void ReducerState::add(std::string name, TensorView tensor, std::vector<std::size_t> shape) {
  GZ_REQUIRE(!frozen_, ErrorCode::invalid_argument, "Reducer::add('", name,
             "'): tensors are registered before the first mark_ready; the buckets are frozen");
  GZ_REQUIRE(!name.empty(), ErrorCode::invalid_argument, "Reducer::add: empty tensor name");
  GZ_REQUIRE(!index_of_.contains(name), ErrorCode::invalid_argument, "Reducer::add('", name,
             "'): a tensor with this name is already registered");
  GZ_REQUIRE(tensor.dtype == DType::f32 || tensor.dtype == DType::f16 || tensor.dtype == DType::bf16,
             ErrorCode::invalid_argument, "Reducer::add('", name, "'): dtype ",
             static_cast<int>(tensor.dtype), " is not f32, f16 or bf16");
  GZ_REQUIRE(tensor.data != nullptr || tensor.count == 0, ErrorCode::invalid_argument,
             "Reducer::add('", name, "'): null data for ", tensor.count, " elements");
  const auto describe_memory = [](Device device) {
    return device.kind == DeviceKind::cpu ? std::string("host memory")
                                          : detail::concat("cuda:", device.index);
  };
  GZ_REQUIRE(!memory_known_ || (tensor.device.kind == memory_.kind &&
                                (tensor.device.kind == DeviceKind::cpu || tensor.device.index == memory_.index)),
             ErrorCode::invalid_argument, "Reducer::add('", name, "'): the tensor is in ",
             describe_memory(tensor.device), ", the tensors added before it in ",
             describe_memory(memory_), "; a Reducer holds tensors of one place");
  if (tensor.device.kind == DeviceKind::cuda && tensor.count > 0) {
    collectives::require_device_pointer(tensor.data, tensor.device.index,
                                        detail::concat("Reducer::add('", name, "')"), "the tensor");
  }
  memory_ = tensor.device;
  memory_known_ = true;
  const bool has_shape = !shape.empty();
  if (has_shape) {
    std::size_t product = 1;
    std::string text;
    for (const std::size_t extent : shape) {
      product *= extent;
      text += (text.empty() ? "" : "x") + std::to_string(extent);
    }
    GZ_REQUIRE(product == tensor.count, ErrorCode::size_mismatch, "Reducer::add('", name,
               "'): shape ", text, " holds ", product, " elements, the tensor ", tensor.count);
  }
  index_of_.emplace(name, tensors_.size());
  tensors_.push_back(RegisteredTensor{std::move(name), tensor, has_shape, std::move(shape)});
}

void ReducerState::freeze() {
  // Every rank must have the same layout, or their chunk calls would not pair up: check it
  // with one all-gather on lane 0's transport (its thread is idle until the first launch).
  Communicator& lane0 = lanes_[0].communicator;
  const std::uint64_t mine[2] = {layout_fingerprint(tensors_, model_, layout_options_),
                                 static_cast<std::uint64_t>(tensors_.size())};
  const std::vector<std::uint64_t> all = collectives::allgather_u64(lane0, mine);
  std::string differing;
  for (int r = 0; r < lane0.size(); ++r) {
    if (all[2 * static_cast<std::size_t>(r)] != all[0])
      differing += detail::concat(differing.empty() ? "" : ", ", "rank ", r, " (",
                                  all[2 * static_cast<std::size_t>(r) + 1], " tensors)");
  }
  GZ_REQUIRE(differing.empty(), ErrorCode::size_mismatch, "Reducer (rank ", lane0.rank(),
             "): the registrations or options differ from rank 0's (", all[1],
             " tensors): ", differing,
             "; every rank must add the same names, counts, dtypes and shapes in the same order "
             "with the same options");

  layout_ = make_layout(tensors_, model_, layout_options_);
  bucket_of_.assign(tensors_.size(), 0);
  group_buffers_.resize(layout_.size());
  for (std::size_t b = 0; b < layout_.size(); ++b) {
    for (const std::size_t t : layout_[b].tensors) bucket_of_[t] = b;
    for (const GroupLayout& group : layout_[b].groups) {
      // A group needs its packing buffer when some chunk spans tensors or is not f32, and
      // always for PowerSGD (which packs whole matrices); chunks that lie inside one f32
      // tensor are reduced in place, so a model of large f32 tensors costs no extra memory.
      const bool powersgd = group.spec.codec == CodecKind::powersgd;
      bool needs_buffer = powersgd;
      for (const ChunkLayout& chunk : group.chunks)
        needs_buffer = needs_buffer || in_place_span(group, chunk.group_begin, chunk.count) == nullptr;
      GroupBuffer& buffer = group_buffers_[b].emplace_back();
      if (!needs_buffer) continue;
      if (on_cuda() && !powersgd) {
        buffer.device = std::make_unique<collectives::DeviceAllocation>(
            group.count * sizeof(float), memory_.index, "Reducer: a group's packing buffer");
      } else {
        buffer.host.resize(group.count);
      }
    }
  }
  if (on_cuda()) {
    // Every lane's NCCL communicator is made and connected here, collectively and in lane order,
    // while no lane runs: made lazily inside a lane's first call, its set-up (ncclCommInitRank,
    // NCCL's device allocations) could run while another lane's kernel waits for a peer.
    for (Lane& lane : lanes_) collectives::prepare_device_transport(lane.communicator, memory_.index);
    for (std::size_t t = 0; t < tensors_.size(); ++t)
      ready_events_.push_back(std::make_unique<collectives::DeviceEvent>(memory_.index, "Reducer"));
  }
  ready_.assign(tensors_.size(), false);
  ready_in_bucket_.assign(layout_.size(), 0);
  launch_time_.assign(layout_.size(), Clock::time_point{});
  std::lock_guard lock(mutex_);
  tasks_left_in_bucket_.assign(layout_.size(), 0);
  bucket_done_time_.assign(layout_.size(), Clock::time_point{});
  progress_.resize(layout_.size());
  for (std::size_t b = 0; b < layout_.size(); ++b) progress_[b].resize(layout_[b].groups.size());
  frozen_ = true;
}

void ReducerState::mark_ready(std::string_view name) {
  const auto found = index_of_.find(name);
  GZ_REQUIRE(found != index_of_.end(), ErrorCode::invalid_argument, "Reducer::mark_ready('",
             name, "'): no tensor with this name was added");
  if (!frozen_) freeze();
  const std::size_t index = found->second;
  GZ_REQUIRE(!ready_[index], ErrorCode::invalid_argument, "Reducer::mark_ready('", name,
             "'): already marked ready in step ", step_);
  if (on_cuda()) ready_events_[index]->record(options_.cuda_stream, "Reducer::mark_ready");
  ready_[index] = true;
  last_ready_ = Clock::now();
  if (!step_started_) step_begin_ = last_ready_;
  step_started_ = true;
  if (recording()) {
    timeline_->instant(0, detail::concat("mark_ready ", name), "ready", last_ready_,
                       detail::concat("\"bucket\":", bucket_of_[index], ",\"step\":", step_));
  }
  ++ready_in_bucket_[bucket_of_[index]];
  launch_ready_buckets();
}

void ReducerState::mark_all_ready() {
  if (!frozen_) freeze();
  for (std::size_t t = 0; t < tensors_.size(); ++t) {
    if (ready_[t]) continue;
    if (on_cuda()) ready_events_[t]->record(options_.cuda_stream, "Reducer::mark_all_ready");
    ready_[t] = true;
    ++ready_in_bucket_[bucket_of_[t]];
  }
  last_ready_ = Clock::now();
  if (!step_started_) step_begin_ = last_ready_;
  step_started_ = true;
  if (recording())
    timeline_->instant(0, "mark_all_ready", "ready", last_ready_, detail::concat("\"step\":", step_));
  launch_ready_buckets();
}

void ReducerState::launch_ready_buckets() {
  while (next_launch_ < layout_.size() &&
         ready_in_bucket_[next_launch_] == layout_[next_launch_].tensors.size()) {
    launch(next_launch_, std::nullopt);
    ++next_launch_;
  }
}

void ReducerState::launch(std::size_t bucket, const std::optional<Error>& preset_error) {
  const Clock::time_point now = Clock::now();
  if (!launched_any_) {
    first_launch_ = now;
    launched_any_ = true;
  }
  launch_time_[bucket] = now;
  const BucketLayout& layout = layout_[bucket];
  if (recording()) {
    timeline_->instant(0, detail::concat("launch bucket ", bucket), "launch", now,
                       detail::concat("\"bucket\":", bucket, ",\"step\":", step_,
                                      ",\"bytes\":", layout.bytes,
                                      preset_error ? ",\"failed\":true" : ""));
  }
  std::vector<std::pair<int, Task>> tasks;
  std::vector<std::string> group_specs;  // for the stats, made once per group and launch
  for (std::size_t g = 0; g < layout.groups.size(); ++g) {
    const GroupLayout& group = layout.groups[g];
    const CompressionSpec spec = spec_at_step(group.spec, step_);
    group_specs.push_back(spec.to_string());
    if (group.chunks.empty()) continue;
    Task base{bucket, g, std::nullopt, spec, static_cast<std::uint32_t>(step_), preset_error};
    if (spec.codec == CodecKind::powersgd) {
      tasks.emplace_back(group.chunks.front().lane, std::move(base));
      continue;
    }
    for (std::size_t c = 0; c < group.chunks.size(); ++c) {
      Task task = base;
      task.chunk = c;
      tasks.emplace_back(group.chunks[c].lane, std::move(task));
    }
  }
  {
    std::lock_guard lock(mutex_);
    tasks_left_in_bucket_[bucket] = tasks.size();
    tasks_pending_ += tasks.size();
    for (std::size_t g = 0; g < layout.groups.size(); ++g) {
      progress_[bucket][g] = GroupProgress{};
      progress_[bucket][g].spec = std::move(group_specs[g]);
    }
    if (tasks.empty()) bucket_done_time_[bucket] = now;
    for (auto& [lane, task] : tasks) lanes_[static_cast<std::size_t>(lane)].queue.push_back(std::move(task));
  }
  lane_wakeup_.notify_all();
}

void ReducerState::lane_loop(std::size_t lane_index) {
  Lane& lane = lanes_[lane_index];
  // CUDA tensors: the lane's device work runs on a non-blocking stream of its own (made at its
  // first task, once the tensors' device is known), so it overlaps backward's kernels.
  std::optional<collectives::DeviceStream> stream;
  for (;;) {
    Task task;
    {
      std::unique_lock lock(mutex_);
      lane_wakeup_.wait(lock, [&] { return stopping_ || !lane.queue.empty(); });
      if (lane.queue.empty()) return;  // stopping, nothing left
      task = std::move(lane.queue.front());
      lane.queue.pop_front();
      lane.running = &task;
    }
    std::optional<std::string> failure;
    std::optional<ErrorCode> code;
    // Recording: the task as a span on the lane's track, its calls and stages inside it.
    const bool record = timeline_ && timeline_request_.records(task.step);
    const int track = static_cast<int>(1 + lane_index);
    const Clock::time_point begin = record ? Clock::now() : Clock::time_point{};
    try {
      if (on_cuda() && !stream) stream.emplace(memory_.index, "Reducer lane");
      const collectives::ThreadStreamScope scope(stream ? stream->get() : nullptr);
      const collectives::TimelineScope timeline_scope(record ? timeline_.get() : nullptr, track);
      run(lane, task);
    } catch (const Error& error) {
      failure = error.what();
      code = error.code();
    } catch (const std::exception& error) {
      failure = error.what();
      code = ErrorCode::internal;
    }
    if (record) record_task(task, track, begin, failure.has_value());
    {
      std::lock_guard lock(mutex_);
      if (failure) {
        errors_.push_back(describe_task(task) + ": " + *failure);
        if (!first_error_code_) first_error_code_ = code;
      }
      if (--tasks_left_in_bucket_[task.bucket] == 0) bucket_done_time_[task.bucket] = Clock::now();
      --tasks_pending_;
      lane.running = nullptr;
    }
    task_done_.notify_all();
  }
}

void ReducerState::record_task(const Task& task, int track, Clock::time_point begin,
                               bool failed) noexcept {
  try {
    timeline_->span(track, task_label(task), "task", begin, Clock::now(),
                    detail::concat("\"bucket\":", task.bucket, ",\"group\":", task.group,
                                   ",\"step\":", task.step, ",\"spec\":",
                                   collectives::json_quoted(task.spec.to_string()),
                                   failed ? ",\"failed\":true" : ""));
  } catch (...) {  // NOLINT(bugprone-empty-catch): out of memory for a trace event; drop it
  }
}

std::string ReducerState::task_label(const Task& task) const {
  const GroupLayout& group = layout_[task.bucket].groups[task.group];
  return task.chunk ? group.chunks[*task.chunk].name : group.name + " (powersgd)";
}

std::string ReducerState::describe_task(const Task& task) const {
  const GroupLayout& group = layout_[task.bucket].groups[task.group];
  std::string text = task_label(task) + " [";
  for (std::size_t i = 0; i < group.tensors.size(); ++i)
    text += (i == 0 ? "" : ", ") + tensors_[group.tensors[i]].name;
  return text + "]";
}

void ReducerState::run(Lane& lane, const Task& task) {
  const GroupLayout& group = layout_[task.bucket].groups[task.group];
  if (task.chunk)
    run_chunk(lane, task, group, group.chunks[*task.chunk]);
  else
    run_powersgd(lane, task, group);
}

float* ReducerState::in_place_span(const GroupLayout& group, std::size_t begin,
                                   std::size_t count) const {
  const auto after = std::upper_bound(group.tensor_offsets.begin(), group.tensor_offsets.end(), begin);
  const std::size_t i = static_cast<std::size_t>(after - group.tensor_offsets.begin()) - 1;
  const TensorView& view = tensors_[group.tensors[i]].view;
  const std::size_t offset = begin - group.tensor_offsets[i];
  if (view.dtype != DType::f32 || offset + count > view.count) return nullptr;
  return static_cast<float*>(view.data) + offset;
}

namespace {

// Elements [begin, begin + count) of `view` as a view of their own.
TensorView slice_of(const TensorView& view, std::size_t begin, std::size_t count) {
  return TensorView{static_cast<std::byte*>(view.data) + begin * dtype_size(view.dtype), count,
                    view.dtype, view.device};
}

// A CUDA slice's f32 values into host memory (PowerSGD packs on the host), or back.
void download_as_f32(const TensorView& slice, float* host) {
  if (slice.dtype == DType::f32) {
    collectives::copy_device_to_host(host, slice.data, slice.size_bytes(), slice.device.index,
                                     "Reducer: packing on the host");
    return;
  }
  std::vector<std::uint16_t> half(slice.count);
  collectives::copy_device_to_host(half.data(), slice.data, slice.size_bytes(), slice.device.index,
                                   "Reducer: packing on the host");
  kernels::cpu::load_as_f32(TensorView{half.data(), slice.count, slice.dtype, Device{}}, 0,
                            slice.count, host);
}

void upload_from_f32(const float* host, const TensorView& slice) {
  if (slice.dtype == DType::f32) {
    collectives::copy_host_to_device(slice.data, host, slice.size_bytes(), slice.device.index,
                                     "Reducer: unpacking from the host");
    return;
  }
  std::vector<std::uint16_t> half(slice.count);
  kernels::cpu::store_from_f32(host, slice.count, TensorView{half.data(), slice.count, slice.dtype, Device{}}, 0);
  collectives::copy_host_to_device(slice.data, half.data(), slice.size_bytes(), slice.device.index,
                                   "Reducer: unpacking from the host");
}

}  // namespace

void ReducerState::pack(const GroupLayout& group, std::size_t begin, std::size_t count,
                        float* buffer, bool on_device) const {
  for (std::size_t i = 0; i < group.tensors.size(); ++i) {
    const TensorView& view = tensors_[group.tensors[i]].view;
    const std::size_t lo = std::max(begin, group.tensor_offsets[i]);
    const std::size_t hi = std::min(begin + count, group.tensor_offsets[i] + view.count);
    if (lo >= hi) continue;
    float* const to = buffer + (lo - begin);
    const std::size_t from = lo - group.tensor_offsets[i];
    if (view.device.kind == DeviceKind::cpu) {
      kernels::cpu::load_as_f32(view, from, hi - lo, to);
    } else if (on_device) {
      collectives::widen_on_device(slice_of(view, from, hi - lo), 0, hi - lo, to);
    } else {
      download_as_f32(slice_of(view, from, hi - lo), to);
    }
  }
}

void ReducerState::unpack(const GroupLayout& group, std::size_t begin, std::size_t count,
                          const float* buffer, bool on_device) const {
  for (std::size_t i = 0; i < group.tensors.size(); ++i) {
    const TensorView& view = tensors_[group.tensors[i]].view;
    const std::size_t lo = std::max(begin, group.tensor_offsets[i]);
    const std::size_t hi = std::min(begin + count, group.tensor_offsets[i] + view.count);
    if (lo >= hi) continue;
    const float* const from = buffer + (lo - begin);
    const std::size_t to = lo - group.tensor_offsets[i];
    if (view.device.kind == DeviceKind::cpu) {
      kernels::cpu::store_from_f32(from, hi - lo, view, to);
    } else if (on_device) {
      collectives::narrow_on_device(from, 0, hi - lo, slice_of(view, to, hi - lo));
    } else {
      upload_from_f32(from, slice_of(view, to, hi - lo));
    }
  }
}

void ReducerState::wait_for_gradients(const GroupLayout& group, std::size_t begin,
                                      std::size_t count) const {
  if (!on_cuda()) return;
  for (std::size_t i = 0; i < group.tensors.size(); ++i) {
    const std::size_t tensor_begin = group.tensor_offsets[i];
    const std::size_t tensor_end = tensor_begin + tensors_[group.tensors[i]].view.count;
    if (tensor_end <= begin || tensor_begin >= begin + count) continue;
    ready_events_[group.tensors[i]]->synchronize("Reducer: waiting for a gradient");
  }
}

void ReducerState::run_chunk(Lane& lane, const Task& task, const GroupLayout& group,
                             const ChunkLayout& chunk) {
  wait_for_gradients(group, chunk.group_begin, chunk.count);
  float* data = in_place_span(group, chunk.group_begin, chunk.count);
  const bool packed = data == nullptr;
  // Recording a timeline: the packing copies as spans (category "copy") beside the call's.
  const collectives::ThreadTimeline timeline = collectives::current_thread_timeline();
  // The clock is read only while recording (begin is unused otherwise).
  const auto copy_begin = [&] { return timeline.timeline ? Clock::now() : Clock::time_point{}; };
  const auto record_copy = [&](const char* name, Clock::time_point begin) {
    if (timeline.timeline == nullptr) return;
    timeline.timeline->span(timeline.track, name, "copy", begin, Clock::now(),
                            detail::concat("\"bytes\":", chunk.count * sizeof(float)));
  };
  if (packed) {
    data = group_buffers_[task.bucket][task.group].data() + chunk.group_begin;
    const Clock::time_point begin = copy_begin();
    pack(group, chunk.group_begin, chunk.count, data, on_cuda());
    record_copy("pack", begin);
  }
  const CollectiveStats stats = collectives::allreduce_at_step(
      lane.communicator, TensorView{data, chunk.count, DType::f32, on_cuda() ? memory_ : Device{}}, chunk.name,
      task.spec, ReduceOp::average, task.step, task.preset_error ? &*task.preset_error : nullptr);
  if (packed) {
    const Clock::time_point begin = copy_begin();
    unpack(group, chunk.group_begin, chunk.count, data, on_cuda());
    record_copy("unpack", begin);
  }

  // MPI's own all-reduce does not report its bytes: count what a ring would send.
  const std::uint64_t sent = collectives::ran_transport_sum(stats) ? ring_bytes_estimate(chunk.count * 4, stats.ranks)
                                                      : stats.sent_bytes();
  // The ring's `none` messages carry headers too; they are not compression.
  record_progress(task, stats, sent, task.spec.codec != CodecKind::none);
}

void ReducerState::record_progress(const Task& task, const CollectiveStats& stats,
                                   std::uint64_t sent, bool compressed) {
  std::lock_guard lock(mutex_);
  GroupProgress& progress = progress_[task.bucket][task.group];
  progress.algorithms.insert(stats.algorithm);
  if (stats.skipped) ++progress.skipped_chunks;
  if (stats.fallback) ++progress.fallback_chunks;
  progress.total.sent_payload_bytes += sent;
  if (compressed) {
    progress.total.encoded_input_bytes += stats.encoded_input_bytes;
    progress.total.encoded_message_bytes += stats.encoded_message_bytes;
  }
}

void ReducerState::run_powersgd(Lane& lane, const Task& task, const GroupLayout& group) {
  // PowerSGD's products run on the host: its buffer is host memory, CUDA tensors included.
  wait_for_gradients(group, 0, group.count);
  std::vector<float>& buffer = group_buffers_[task.bucket][task.group].host;
  pack(group, 0, group.count, buffer.data(), false);
  std::vector<PowerSgdMatrix> matrices;
  for (std::size_t i = 0; i < group.tensors.size(); ++i) {
    const RegisteredTensor& tensor = tensors_[group.tensors[i]];
    const std::size_t rows = tensor.shape.front();
    matrices.push_back(PowerSgdMatrix{tensor.name,
                                      {buffer.data() + group.tensor_offsets[i], tensor.view.count},
                                      rows, rows == 0 ? 0 : tensor.view.count / rows});
  }
  const CollectiveStats stats =
      powersgd_allreduce(lane.communicator, matrices, task.spec, group.name,
                         task.step, task.preset_error ? &*task.preset_error : nullptr);
  unpack(group, 0, group.count, buffer.data(), false);

  // Small P and Q go through MPI's own all-reduce, which reports no bytes: count what a ring
  // would send for both (an undercount when only one of the two took that path).
  const std::uint64_t sent = stats.sent_bytes() != 0
                                ? stats.sent_bytes()
                                : ring_bytes_estimate(stats.encoded_message_bytes, stats.ranks);
  record_progress(task, stats, sent, true);
}

void ReducerState::wait_for_tasks(std::unique_lock<std::mutex>& lock) {
  // The lanes' transports time out each of their waits within the deadline and report it as
  // the task's error; this bounds what lies outside those waits (a lane stuck elsewhere, a
  // transport without deadlines): wait fails when no task has finished for 1.2 x timeout + 1 s.
  const collectives::DeadlinePolicy& policy =
      collectives::deadline_policy_of(user_communicator_);
  const auto patience = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(policy.seconds * 1.2 + 1.0));
  std::size_t last_pending = tasks_pending_;
  Clock::time_point last_progress = Clock::now();
  while (tasks_pending_ != 0) {
    task_done_.wait_until(lock, last_progress + patience);
    if (tasks_pending_ != last_pending) {
      last_pending = tasks_pending_;
      last_progress = Clock::now();
    } else if (Clock::now() - last_progress >= patience) {
      break;
    }
  }
  if (tasks_pending_ == 0) return;

  std::string report = detail::concat(
      "gradzip: timeout in Reducer::wait (step ", step_, ", rank ", user_communicator_.rank(),
      " of ", user_communicator_.size(), "): no chunk finished for ",
      std::chrono::duration<double>(Clock::now() - last_progress).count(), " s (limit 1.2 x ",
      policy.seconds, " s + 1 s); ", tasks_pending_, " task(s) unfinished\n");
  for (std::size_t l = 0; l < lanes_.size(); ++l) {
    const Lane& lane = lanes_[l];
    report += detail::concat("  lane ", l, ": ",
                             lane.running ? "running " + describe_task(*lane.running) : "idle");
    if (!lane.queue.empty()) {
      report += detail::concat("; ", lane.queue.size(), " queued, next ",
                               describe_task(lane.queue.front()));
    }
    report += "\n";
  }
  collectives::note_timeout();
  collectives::write_timeout_report(report);
  if (policy.action == TimeoutAction::abort) {
    collectives::abort_job(user_communicator_);
  }
  timed_out_ = report;
  throw Error(ErrorCode::timeout, report);
}

void ReducerState::wait() {
  GZ_REQUIRE(timed_out_.empty(), ErrorCode::timeout, "Reducer::wait: this Reducer timed out "
             "earlier; end the job (", timed_out_.substr(0, timed_out_.find('\n')), ")");
  const Clock::time_point wait_begin = Clock::now();
  if (!step_started_) step_begin_ = wait_begin;  // a step with no mark_ready
  if (!frozen_) freeze();
  // Tensors never marked: their buckets still run, as calls this rank fails on purpose, so that
  // every rank's calls pair up and every rank hears about it (no rank waits forever).
  std::vector<std::string> missing;
  for (std::size_t t = 0; t < tensors_.size(); ++t)
    if (!ready_[t]) missing.push_back(tensors_[t].name);
  std::optional<Error> missing_error;
  if (!missing.empty()) {
    std::string names;
    for (std::size_t i = 0; i < missing.size(); ++i) names += (i == 0 ? "'" : ", '") + missing[i] + "'";
    missing_error = Error(ErrorCode::invalid_argument,
                          detail::concat("Reducer::wait (step ", step_, "): ", missing.size(),
                                         " tensor(s) never marked ready: ", names));
    for (; next_launch_ < layout_.size(); ++next_launch_) {
      const bool complete = ready_in_bucket_[next_launch_] == layout_[next_launch_].tensors.size();
      launch(next_launch_, complete ? std::nullopt : missing_error);
    }
  }
  std::vector<std::string> errors;
  std::optional<ErrorCode> code;
  {
    std::unique_lock lock(mutex_);
    wait_for_tasks(lock);
    errors.swap(errors_);
    code = first_error_code_;
    first_error_code_.reset();
  }
  const Clock::time_point wait_end = Clock::now();
  finish_step_stats(wait_begin, wait_end);
  std::optional<Error> timeline_error;  // thrown after the step's own errors
  if (recording()) {
    try {
      record_step_end(wait_begin, wait_end);
    } catch (const Error& error) {
      timeline_error = error;
    }
  }
  // The next step starts clean whatever happened in this one.
  std::fill(ready_.begin(), ready_.end(), false);
  std::fill(ready_in_bucket_.begin(), ready_in_bucket_.end(), 0);
  next_launch_ = 0;
  step_started_ = false;
  launched_any_ = false;

  if (missing_error) throw *missing_error;
  if (!errors.empty()) {
    std::string message = detail::concat("Reducer step ", step_, ": ", errors.front());
    if (errors.size() > 1)
      message += detail::concat(" (and ", errors.size() - 1, " more failed call(s) in this step)");
    throw Error(*code, message);
  }
  if (timeline_error) throw *timeline_error;
}

void ReducerState::record_step_end(Clock::time_point wait_begin, Clock::time_point wait_end) {
  timeline_->span(0, "wait", "wait", wait_begin, wait_end, detail::concat("\"step\":", step_));
  timeline_->span(0, detail::concat("step ", step_), "step", step_begin_, wait_end,
                  detail::concat("\"step\":", step_, ",\"sent_bytes\":", stats_.sent_bytes,
                                 ",\"exposed_seconds\":", collectives::json_number(stats_.exposed_seconds)));
  // Buckets overlap one another: async spans, from launch to done.
  for (std::size_t b = 0; launched_any_ && b < layout_.size(); ++b) {
    timeline_->async_span(detail::concat("bucket ", b), "bucket", next_bucket_span_id_++,
                          launch_time_[b], std::max(launch_time_[b], bucket_done_time_[b]),
                          detail::concat("\"bucket\":", b, ",\"step\":", step_,
                                         ",\"bytes\":", layout_[b].bytes,
                                         ",\"sent_bytes\":", stats_.buckets[b].sent_bytes));
  }
  if (timeline_request_.is_last(step_)) write_timeline();
}

void ReducerState::write_timeline() {
  timeline_written_ = true;  // once, even when it fails: the error is reported once
  timeline_->write(timeline_file_);
}

void ReducerState::finish_step_stats(Clock::time_point wait_begin, Clock::time_point wait_end) {
  ReducerStats stats;
  stats.step = step_;
  std::uint64_t encoded_input = 0, encoded_message = 0;
  Clock::time_point last_done = first_launch_;
  for (std::size_t b = 0; b < layout_.size(); ++b) {
    const BucketLayout& layout = layout_[b];
    ReducerBucketStats bucket;
    bucket.index = b;
    bucket.bytes = layout.bytes;
    // Buckets finish in launch order: a bucket counts as done when it and every earlier one is.
    last_done = std::max(last_done, bucket_done_time_[b]);
    bucket.launch_seconds = launched_any_ ? seconds_between(first_launch_, launch_time_[b]) : 0.0;
    bucket.done_seconds = launched_any_ ? seconds_between(first_launch_, last_done) : 0.0;
    for (std::size_t g = 0; g < layout.groups.size(); ++g) {
      const GroupLayout& group = layout.groups[g];
      const GroupProgress& progress = progress_[b][g];
      ReducerGroupStats out;
      out.spec = progress.spec;
      out.rule = group.rule;
      for (const std::size_t t : group.tensors) out.tensors.push_back(tensors_[t].name);
      out.count = group.count;
      out.chunks = group.chunks.size();
      out.algorithms.assign(progress.algorithms.begin(), progress.algorithms.end());
      out.sent_bytes = progress.total.sent_payload_bytes;
      out.encoded_input_bytes = progress.total.encoded_input_bytes;
      out.encoded_message_bytes = progress.total.encoded_message_bytes;
      bucket.sent_bytes += out.sent_bytes;
      stats.skipped_chunks += progress.skipped_chunks;
      stats.fallback_chunks += progress.fallback_chunks;
      encoded_input += out.encoded_input_bytes;
      encoded_message += out.encoded_message_bytes;
      bucket.groups.push_back(std::move(out));
    }
    stats.sent_bytes += bucket.sent_bytes;
    stats.gradient_bytes += bucket.bytes;
    stats.buckets.push_back(std::move(bucket));
  }
  stats.compression_ratio =
      encoded_message > 0 ? static_cast<double>(encoded_input) / static_cast<double>(encoded_message) : 1.0;
  stats.communication_seconds = launched_any_ ? seconds_between(first_launch_, last_done) : 0.0;
  stats.exposed_seconds = std::min(seconds_between(wait_begin, wait_end), stats.communication_seconds);
  stats.hidden_seconds = stats.communication_seconds - stats.exposed_seconds;
  stats.last_ready_seconds = launched_any_ ? seconds_between(first_launch_, last_ready_) : 0.0;
  stats_ = std::move(stats);
}

std::vector<std::vector<std::string>> ReducerState::bucket_names() const {
  std::vector<std::vector<std::string>> names;
  for (const BucketLayout& bucket : layout_) {
    names.emplace_back();
    for (const std::size_t t : bucket.tensors) names.back().push_back(tensors_[t].name);
  }
  return names;
}

// What the checkpoint holds (each lane's residuals, the step, the model inputs) and how it maps
// onto the file is collectives/checkpoint.h's.
void ReducerState::save(const std::string& path) {
  require_idle("save_state");
  Communicator& first = lanes_.front().communicator;
  std::vector<const error_feedback::ResidualStore*> stores;
  // The lanes' model inputs (every lane has the same link; γ measured by any lane).
  collectives::AutoModelInputs auto_model;
  for (Lane& lane : lanes_) {
    stores.push_back(&collectives::residuals_of(lane.communicator));
    auto_model.merge(collectives::auto_model_inputs(lane.communicator));
  }
  collectives::save_reducer_checkpoint(path, static_cast<std::uint32_t>(first.size()),
                                       static_cast<std::uint32_t>(first.rank()), stores, auto_model,
                                       step_);
}

void ReducerState::load(const std::string& path) {
  require_idle("load_state");
  const Communicator& first = lanes_.front().communicator;
  // Read and checked whole before any lane changes.
  const collectives::ReducerCheckpoint checkpoint = collectives::load_reducer_checkpoint(
      path, static_cast<std::uint32_t>(first.size()), static_cast<std::uint32_t>(first.rank()),
      lanes_.size(), "Reducer::load_state");
  for (std::size_t l = 0; l < lanes_.size(); ++l) {
    collectives::adopt_auto_model_inputs(lanes_[l].communicator, checkpoint.auto_model);
    error_feedback::ResidualStore& store = collectives::residuals_of(lanes_[l].communicator);
    store.clear();
    for (const auto& [key, values] : checkpoint.lane_residuals[l]) {
      const std::span<float> destination = store.residual(key, values.size());
      std::copy(values.begin(), values.end(), destination.begin());
    }
  }
  // A version 1 file has no step: the caller restores it with set_step, as before.
  if (checkpoint.step) step_ = *checkpoint.step;
}

}  // namespace pipeline

// ---- the public face ------------------------------------------------------------------------

Reducer::Reducer(Communicator& communicator, ReducerOptions options)
    : state_(std::make_unique<pipeline::ReducerState>(communicator, std::move(options))) {}
Reducer::~Reducer() {
  // A Reducer whose wait() timed out may have lanes stuck for good: joining them would hang,
  // destroying their state under them would crash. The job is ending (see
  // CommunicatorOptions::timeout_seconds); leak it.
  if (state_ != nullptr && state_->timed_out()) static_cast<void>(state_.release());
}

void Reducer::add(std::string name, TensorView tensor, std::vector<std::size_t> shape) {
  state_->add(std::move(name), tensor, std::move(shape));
}
void Reducer::mark_ready(std::string_view name) { state_->mark_ready(name); }
void Reducer::mark_all_ready() { state_->mark_all_ready(); }
void Reducer::wait() { state_->wait(); }
void Reducer::step() { state_->set_step(state_->step() + 1); }
void Reducer::set_step(std::uint64_t step) { state_->set_step(step); }
std::uint64_t Reducer::current_step() const noexcept { return state_->step(); }
std::vector<std::vector<std::string>> Reducer::buckets() const { return state_->bucket_names(); }
const ReducerStats& Reducer::stats() const noexcept { return state_->stats(); }
void Reducer::save_state(const std::string& path) const { state_->save(path); }
void Reducer::load_state(const std::string& path) { state_->load(path); }

std::string ReducerStats::to_json() const {
  using collectives::json_number;
  using collectives::json_quoted;
  std::string out = detail::concat(
      "{\"step\":", step, ",\"sent_bytes\":", sent_bytes, ",\"gradient_bytes\":", gradient_bytes,
      ",\"compression_ratio\":", json_number(compression_ratio), ",\"skipped_chunks\":", skipped_chunks,
      ",\"fallback_chunks\":", fallback_chunks,
      ",\"communication_seconds\":", json_number(communication_seconds),
      ",\"exposed_seconds\":", json_number(exposed_seconds), ",\"hidden_seconds\":",
      json_number(hidden_seconds), ",\"last_ready_seconds\":", json_number(last_ready_seconds),
      ",\"buckets\":[");
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    const ReducerBucketStats& bucket = buckets[b];
    out += detail::concat(b == 0 ? "" : ",", "{\"index\":", bucket.index, ",\"bytes\":", bucket.bytes,
                          ",\"launch_seconds\":", json_number(bucket.launch_seconds),
                          ",\"done_seconds\":", json_number(bucket.done_seconds),
                          ",\"sent_bytes\":", bucket.sent_bytes, ",\"groups\":[");
    for (std::size_t g = 0; g < bucket.groups.size(); ++g) {
      const ReducerGroupStats& group = bucket.groups[g];
      out += detail::concat(g == 0 ? "" : ",", "{\"spec\":", json_quoted(group.spec),
                            ",\"rule\":", json_quoted(group.rule), ",\"count\":", group.count,
                            ",\"chunks\":", group.chunks, ",\"sent_bytes\":", group.sent_bytes,
                            ",\"encoded_input_bytes\":", group.encoded_input_bytes,
                            ",\"encoded_message_bytes\":", group.encoded_message_bytes,
                            ",\"algorithms\":[");
      const auto append_list = [&](const std::vector<std::string>& items) {
        for (std::size_t i = 0; i < items.size(); ++i) {
          if (i > 0) out += ',';
          out += json_quoted(items[i]);
        }
      };
      append_list(group.algorithms);
      out += "],\"tensors\":[";
      append_list(group.tensors);
      out += "]}";
    }
    out += "]}";
  }
  return out + "]}";
}

}  // namespace gradzip
