// One collective call's checks and bookkeeping (collectives/call.h).
#include "collectives/call.h"

#include <algorithm>
#include <exception>
#include <string>

#include "collectives/device_memory.h"
#include "collectives/json_text.h"
#include "collectives/nonfinite_policy.h"
#include "collectives/random_streams.h"
#include "collectives/transport/nccl_transport_factory.h"
#include "gradzip/error.h"
#include "kernels/cpu/nonfinite_cpu.h"

namespace gradzip::collectives {

Call describe_call(CollectiveKind kind, TensorView tensor, std::string_view name, ReduceOp op,
                   const CompressionSpec& spec, SpecCache& specs) {
  return Call{kind, tensor, name, op, spec, specs.canonical_text(spec), std::nullopt,
              std::nullopt, {}, false, 0, nullptr};
}

Call describe_call(CollectiveKind kind, TensorView tensor, std::string_view name, ReduceOp op,
                   std::string_view spec_text, SpecCache& specs) {
  Call call{kind, tensor, name, op, std::nullopt, std::string(spec_text), std::nullopt,
            std::nullopt, {}, false, 0, nullptr};
  try {
    const SpecCache::Parsed& parsed = specs.parse(spec_text);
    call.spec = parsed.spec;
    call.spec_text = parsed.canonical;
  } catch (const Error& error) {
    call.error = error;
  }
  return call;
}

namespace {

void check_arguments(const Call& call) {
  const std::string_view op = collective_kind_name(call.kind);
  const TensorView& tensor = call.tensor;
  GZ_REQUIRE(!call.name.empty(), ErrorCode::invalid_argument, op,
             ": the tensor name is empty (it keys error feedback and the mismatch check)");
  // Checkpoints store call numbers under the tensor names, next to algo=auto's inputs.
  GZ_REQUIRE(!call.name.starts_with(kAutoModelPrefix), ErrorCode::invalid_argument, op,
             ": the tensor name '", call.name, "' starts with '", kAutoModelPrefix,
             "', which checkpoints reserve for algo=auto's model inputs");
  if (tensor.device.kind == DeviceKind::cuda && tensor.count > 0) {
    GZ_REQUIRE(device_memory_built(), ErrorCode::unsupported, op, " of '", call.name,
               "': the tensor is on CUDA device ", tensor.device.index,
               "; this gradzip was built without CUDA (GRADZIP_WITH_CUDA)");
    require_device_pointer(tensor.data, tensor.device.index, std::string(op) + " of '" +
                           std::string(call.name) + "'", "the tensor");
  }
  GZ_REQUIRE(tensor.dtype == DType::f32 || tensor.dtype == DType::f16 || tensor.dtype == DType::bf16,
             ErrorCode::invalid_argument, op, " of '", call.name, "': dtype ",
             static_cast<int>(tensor.dtype), " is not f32, f16 or bf16");
  GZ_REQUIRE(tensor.data != nullptr || tensor.count == 0, ErrorCode::invalid_argument, op,
             " of '", call.name, "': null data for ", tensor.count, " elements");
}

// The call check's memory field (collectives/call_check.h).
std::uint64_t memory_field(const CommunicatorState& state, const TensorView& tensor) {
  if (tensor.device.kind == DeviceKind::cpu) return 0;
  return 1 + static_cast<std::uint64_t>(state.transports().cuda_path());
}

// A CUDA tensor's call that may run stream-ordered (over NCCL): its input check is deferred.
// The route is picked later, with the algorithm; one that is not stream-ordered settles the
// check before it runs (settle_input_check).
bool may_run_stream_ordered(const CommunicatorState& state, const Call& call) {
  return call.tensor.device.kind == DeviceKind::cuda && call.spec &&
         state.transports().cuda_path() != CudaPath::staged && nccl_transport_built();
}

// This rank's counts to every rank: Call::nonfinite and beyond_wire_range as the call check
// would have set them. `mine.first` is relative to the counted range's begin.
void exchange_input_counts(CommunicatorState& state, Call& call, const NonfiniteOnDevice& mine) {
  const DeferredInput& deferred = *call.deferred_input;
  Transport& transport = state.transport();
  const std::size_t ranks = static_cast<std::size_t>(transport.size());
  const std::uint64_t record[3] = {mine.count, mine.count == 0 ? 0 : deferred.begin + mine.first,
                                   mine.beyond};
  std::vector<std::uint64_t> all(3 * ranks);
  if (ranks == 1) std::copy(record, record + 3, all.begin());
  else transport.allgather_u64(record, all);
  call.nonfinite.clear();
  call.beyond_wire_range = 0;
  for (std::size_t r = 0; r < ranks; ++r) {
    if (all[3 * r] != 0)
      call.nonfinite.push_back(NonfiniteInput{static_cast<int>(r), all[3 * r], all[3 * r + 1]});
    call.beyond_wire_range += all[3 * r + 2];
  }
  call.deferred_input.reset();
}

}  // namespace

void settle_input_check(CommunicatorState& state, Call& call, bool stream_ordered_route) {
  if (!call.deferred_input || stream_ordered_route) return;
  const DeferredInput& deferred = *call.deferred_input;
  const NonfiniteOnDevice mine =
      count_nonfinite_on_device(call.tensor, deferred.begin, deferred.end, deferred.wire_limit);
  call.device_work_finished = mine.work_stream_drained;
  exchange_input_counts(state, call, mine);
}

bool end_speculation(CommunicatorState& state, Call& call) {
  error_feedback::ResidualStore& residuals = state.residuals();
  const std::shared_ptr<DeferredInput> deferred = call.deferred_input;
  const bool undo = deferred && deferred->check && deferred->flagged;
  residuals.end_journal(undo);
  if (!undo) return false;
  deferred->check->restore();  // after the residuals' copies, in the work stream's order
  exchange_input_counts(state, call, deferred->check->counts());
  return true;
}

void keep_speculation(CommunicatorState& state) noexcept { state.residuals().end_journal(false); }

std::uint32_t begin_call(CommunicatorState& state, Call& call) {
  if (!call.error) {
    try {
      check_arguments(call);
      const int only = state.transport().device_only();
      GZ_REQUIRE(only < 0 || (call.tensor.device.kind == DeviceKind::cuda &&
                              call.tensor.device.index == only),
                 ErrorCode::invalid_argument, collective_kind_name(call.kind), " of '", call.name,
                 "': this communicator was made from an ncclComm_t of cuda:", only,
                 " and reduces tensors of that device only; the tensor is ",
                 call.tensor.device.kind == DeviceKind::cpu
                     ? std::string("in host memory")
                     : detail::concat("on cuda:", call.tensor.device.index));
      if (const std::optional<std::string> other = state.names().claim_random_stream(call.spec->seed, call.name)) {
        GZ_THROW(ErrorCode::invalid_argument, collective_kind_name(call.kind), " of '", call.name,
                 "': ", stream_conflict(call.spec->seed, call.name, *other));
      }
    } catch (const Error& error) {
      call.error = error;
    }
  }
  // This rank's non-finite input, counted only when its arguments are valid (a bad pointer
  // must not be read): the whole tensor, or for an all-gather the rank's own shard.
  NonfiniteInput mine;
  // Elements a narrowing wire type would saturate (host and CUDA tensors alike).
  std::uint64_t beyond = 0;
  if (!call.error && call.tensor.count > 0) {
    try {
      const Transport& transport = state.transport();
      const bool shard_only = call.kind == CollectiveKind::allgather;
      const std::size_t begin =
          shard_only ? shard_begin(call.tensor.count, transport.size(), transport.rank()) : 0;
      const std::size_t end = shard_only ? shard_begin(call.tensor.count, transport.size(),
                                                       transport.rank() + 1)
                                         : call.tensor.count;
      const float limit = call.spec ? wire_range_limit(*call.spec, call.kind, call.op,
                                                       transport.size())
                                    : 0.0f;
      if (may_run_stream_ordered(state, call)) {
        // Counted on the device during the call instead (DeferredInput): no wait here.
        call.deferred_input = std::make_shared<DeferredInput>();
        call.deferred_input->begin = begin;
        call.deferred_input->end = end;
        call.deferred_input->wire_limit = limit;
      } else if (call.tensor.device.kind == DeviceKind::cuda) {
        const NonfiniteOnDevice found = count_nonfinite_on_device(call.tensor, begin, end, limit);
        mine = NonfiniteInput{0, found.count, begin + found.first};
        beyond = found.beyond;
        call.device_work_finished = found.work_stream_drained;
      } else {
        if (limit > 0.0f) {
          const kernels::cpu::RangeCount found =
              kernels::cpu::count_nonfinite_and_beyond(call.tensor, begin, end - begin, limit);
          mine = NonfiniteInput{0, found.nonfinite.count, begin + found.nonfinite.first};
          beyond = found.beyond;
        } else {
          const kernels::cpu::NonfiniteCount found =
              kernels::cpu::count_nonfinite(call.tensor, begin, end - begin);
          mine = NonfiniteInput{0, found.count, begin + found.first};
        }
      }
    } catch (const Error& error) {
      call.error = error;
    }
  }
  state.names().start_call();
  const std::uint32_t step = call.explicit_step ? *call.explicit_step : state.names().call_number_of(call.name);
  call.nonfinite =
      check_call(state.transport(),
                 CallDescription{call.kind, call.name, call.tensor.count, call.tensor.dtype, call.op,
                                 call.spec_text, step, memory_field(state, call.tensor),
                                 call.error ? &*call.error : nullptr, mine.count, mine.first,
                                 beyond},
                 &call.beyond_wire_range);
  if (!call.explicit_step) state.names().count_call(call.name);
  return step;
}

CallSpan::CallSpan(const Call& call, const CollectiveStats& stats)
    : call_(call), stats_(stats), timeline_(current_thread_timeline()) {
  if (timeline_.timeline == nullptr) return;  // no clock read on calls that record nothing
  begin_ = TimelineClock::now();
  exceptions_at_begin_ = std::uncaught_exceptions();
}

CallSpan::~CallSpan() {
  if (timeline_.timeline == nullptr) return;
  const TimelineClock::time_point end = TimelineClock::now();
  try {
    std::string args = detail::concat(
        "\"spec\":", json_quoted(stats_.spec), ",\"algorithm\":", json_quoted(stats_.algorithm),
        ",\"count\":", stats_.count, ",\"ranks\":", stats_.ranks,
        ",\"sent_bytes\":", stats_.sent_bytes(), ",\"sent_index_bytes\":", stats_.sent_index_bytes,
        ",\"received_bytes\":", stats_.received_bytes,
        ",\"encoded_input_bytes\":", stats_.encoded_input_bytes,
        ",\"encoded_message_bytes\":", stats_.encoded_message_bytes);
    if (step_) args += detail::concat(",\"step\":", *step_);
    if (!stats_.note.empty()) args += ",\"note\":" + json_quoted(stats_.note);
    if (std::uncaught_exceptions() > exceptions_at_begin_) args += ",\"failed\":true";
    timeline_.timeline->span(timeline_.track,
                             detail::concat(collective_kind_name(call_.kind), " ", call_.name),
                             "call", begin_, end, args);
  } catch (...) {  // NOLINT(bugprone-empty-catch): out of memory for a trace event; drop it
  }
}

CollectiveStats start_stats(const Call& call, const Transport& transport) {
  CollectiveStats stats;
  stats.spec = call.spec_text;
  stats.count = call.tensor.count;
  stats.ranks = transport.size();
  return stats;
}

CompressionSpec warmup_spec(const CompressionSpec& spec) {
  CompressionSpec dense;
  dense.codec = CodecKind::none;
  dense.error_feedback = false;
  dense.seed = spec.seed;
  return dense;
}

CompressionSpec sharded_spec(const ShardedChoice& choice, const CompressionSpec& spec,
                             CollectiveStats& stats) {
  stats.algorithm = choice.name;
  stats.note = choice.note;
  return choice.warmup ? warmup_spec(spec) : spec;
}

}  // namespace gradzip::collectives
