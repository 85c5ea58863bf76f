// gradzip._gradzip: the Python binding (pybind11). python/gradzip/__init__.py re-exports it;
// python/gradzip/torch.py builds the DDP communication hook on it.
//
// Tensors: any contiguous f32 / f16 NumPy array (buffer protocol) or torch tensor (f32, f16,
// bf16; CPU, or CUDA in builds with CUDA), used in place without a copy. Anything else raises
// TypeError (not an array, a dtype gradzip does not reduce) or ValueError (not contiguous, not
// writable) naming what was wrong. gradzip's own errors raise gradzip.Error (a RuntimeError) with
// the library's message; its `code` attribute is the error code's name.
// Collective calls release the GIL while they run, so a Python thread can drive them while others
// keep going (the DDP hook's communication thread does).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "collectives/communicator_internal.h"
#include "collectives/timeline.h"
#ifdef GRADZIP_HAVE_NCCL
#include "collectives/transport/nccl/nccl_library.h"
#endif
#include "gradzip/codec.h"
#include "gradzip/communicator.h"
#include "gradzip/compression_spec.h"
#include "gradzip/error.h"
#include "gradzip/version.h"
#include "pipeline/powersgd.h"
#include "process_group_transport.h"

namespace py = pybind11;

namespace gradzip {
namespace {

// The TensorView of a torch tensor, read through its Python attributes (no torch headers).
TensorView torch_view(py::handle tensor, const char* what) {
  if (!tensor.attr("is_contiguous")().cast<bool>()) {
    throw py::value_error(std::string(what) +
                          " is a non-contiguous torch tensor; pass tensor.contiguous() (gradzip "
                          "reduces contiguous memory in place)");
  }
  const std::string dtype = py::str(tensor.attr("dtype"));
  DType kind;
  if (dtype == "torch.float32") kind = DType::f32;
  else if (dtype == "torch.float16") kind = DType::f16;
  else if (dtype == "torch.bfloat16") kind = DType::bf16;
  else throw py::type_error(std::string(what) + " has dtype " + dtype +
                            "; gradzip reduces torch.float32, torch.float16 and torch.bfloat16");
  const py::object device = tensor.attr("device");
  const std::string device_type = py::str(device.attr("type"));
  Device where{};
  if (device_type == "cuda") {
    const py::object index = device.attr("index");
    where = Device{DeviceKind::cuda, index.is_none() ? 0 : index.cast<int>()};
  } else if (device_type != "cpu") {
    throw py::type_error(std::string(what) + " is on device '" + device_type +
                         "'; gradzip takes CPU and CUDA tensors");
  }
  const auto address = tensor.attr("data_ptr")().cast<std::uintptr_t>();
  const auto count = tensor.attr("numel")().cast<std::size_t>();
  return TensorView{reinterpret_cast<void*>(address), count, kind, where};
}

// The TensorView of an object with the buffer protocol (NumPy arrays): C-contiguous f32 or f16.
TensorView buffer_view(py::handle object, bool writable, const char* what) {
  if (!PyObject_CheckBuffer(object.ptr())) {
    throw py::type_error(std::string(what) + " is a " + std::string(py::str(py::type::of(object).attr("__name__"))) +
                         "; gradzip takes NumPy arrays and torch tensors");
  }
  py::buffer buffer = py::reinterpret_borrow<py::buffer>(object);
  py::buffer_info info;
  try {
    info = buffer.request(writable);
  } catch (const py::error_already_set&) {
    throw py::value_error(std::string(what) + " is read-only; gradzip writes the result in place");
  }
  DType kind;
  if (info.format == py::format_descriptor<float>::format() && info.itemsize == 4) kind = DType::f32;
  else if (info.format == "e" && info.itemsize == 2) kind = DType::f16;
  else throw py::type_error(std::string(what) + " has element format '" + info.format +
                            "'; gradzip reduces float32 and float16 arrays (bfloat16 through torch)");
  // C-contiguous: each stride is the product of the later extents times the element size.
  py::ssize_t expected = info.itemsize;
  for (py::ssize_t d = info.ndim; d-- > 0;) {
    if (info.shape[d] > 1 && info.strides[d] != expected) {
      throw py::value_error(std::string(what) +
                            " is not C-contiguous; pass numpy.ascontiguousarray(...) (gradzip "
                            "reduces contiguous memory in place)");
    }
    expected *= info.shape[d];
  }
  return TensorView{info.ptr, static_cast<std::size_t>(info.size), kind, Device{}};
}

// A new float32 NumPy array of `count` elements, and the address of its data. Made through
// NumPy's Python API and the buffer protocol, never pybind11's NumPy C-API wrappers: those read
// NumPy's structs, whose layout changed in NumPy 2 (pybind11 before 2.12, as Debian ships,
// computes zero strides there), and users of a current PyTorch from PyPI get NumPy 2.
py::object numpy_f32_array(std::size_t count) {
  return py::module_::import("numpy").attr("empty")(count, py::arg("dtype") = "float32");
}
void* writable_f32_buffer(const py::object& array, std::size_t count) {
  const py::buffer_info info = py::reinterpret_borrow<py::buffer>(array).request(/*writable=*/true);
  if (info.itemsize != 4 || static_cast<std::size_t>(info.size) != count)
    throw std::logic_error("numpy.empty did not return " + std::to_string(count) + " float32 values");
  return info.ptr;
}

TensorView view_of(py::handle object, bool writable, const char* what) {
  const bool is_torch = py::hasattr(object, "data_ptr") && py::hasattr(object, "is_contiguous");
  return is_torch ? torch_view(object, what) : buffer_view(object, writable, what);
}

ReduceOp reduce_op_of(const std::string& op) {
  if (op == "sum") return ReduceOp::sum;
  if (op == "average" || op == "avg" || op == "mean") return ReduceOp::average;
  throw py::value_error("reduce op '" + op + "' (accepted: sum, average)");
}

py::dict stats_dict(const CollectiveStats& stats) {
  py::dict d;
  d["algorithm"] = stats.algorithm;
  d["spec"] = stats.spec;
  d["count"] = stats.count;
  d["ranks"] = stats.ranks;
  d["sent_bytes"] = stats.sent_bytes();
  d["sent_header_bytes"] = stats.sent_header_bytes;
  d["sent_index_bytes"] = stats.sent_index_bytes;
  d["sent_payload_bytes"] = stats.sent_payload_bytes;
  d["received_bytes"] = stats.received_bytes;
  d["compression_ratio"] = stats.compression_ratio;
  d["encoded_message_bytes"] = stats.encoded_message_bytes;
  d["encode_seconds"] = stats.encode_seconds;
  d["communicate_seconds"] = stats.communicate_seconds;
  d["decode_seconds"] = stats.decode_seconds;
  d["total_seconds"] = stats.total_seconds;
  d["note"] = stats.note;
  d["skipped"] = stats.skipped;  // nonfinite=skip decided this call
  d["fallback"] = stats.fallback;  // fallback=dense sent it uncompressed
  return d;
}

// What the in-place collectives' bindings share: `tensor`'s view, the op, the spec (the
// communicator's default when none is given; parsed without the GIL, so a bad one throws
// there), `call(view, spec, op)` run without the GIL, and its stats as a dict.
template <typename Call>
py::dict run_in_place(Communicator& communicator, py::handle tensor,
                      const std::optional<std::string>& spec, const std::string& op, Call&& call) {
  const TensorView view = view_of(tensor, true, "the tensor");
  const ReduceOp reduce = reduce_op_of(op);
  CollectiveStats stats;
  {
    py::gil_scoped_release release;
    const CompressionSpec parsed = spec ? CompressionSpec::parse(*spec) : communicator.default_spec();
    stats = call(view, parsed, reduce);
  }
  return stats_dict(stats);
}

// A link of algo=auto's model as the Python tuple (latency_s, bytes_per_s,
// exchange_bytes_per_s, collective_latency_s), and back (auto_model_state).
py::tuple link_tuple(const error_feedback::SavedLink& link) {
  return py::make_tuple(link.latency_s, link.bytes_per_s, link.exchange_bytes_per_s,
                        link.collective_latency_s);
}

error_feedback::SavedLink link_from(const py::handle& value) {
  const auto [latency_s, bytes_per_s, exchange_bytes_per_s, collective_latency_s] =
      value.cast<std::tuple<double, double, double, double>>();
  return error_feedback::SavedLink{latency_s, bytes_per_s, exchange_bytes_per_s, collective_latency_s};
}

}  // namespace
}  // namespace gradzip

PYBIND11_MODULE(_gradzip, m) {
  using namespace gradzip;
  m.doc() = "gradzip: compressed gradient all-reduce over MPI (C++ core, pybind11 binding)";
  m.attr("__version__") = std::to_string(GRADZIP_VERSION_MAJOR) + "." +
                          std::to_string(GRADZIP_VERSION_MINOR) + "." +
                          std::to_string(GRADZIP_VERSION_PATCH);

  static py::exception<Error> error_type(m, "Error", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr pointer) {
    try {
      if (pointer) std::rethrow_exception(pointer);
    } catch (const Error& error) {
      py::object exception = py::reinterpret_borrow<py::object>(error_type.ptr())(error.what());
      exception.attr("code") = error_code_name(error.code());
      PyErr_SetObject(error_type.ptr(), exception.ptr());
    }
  });

  m.def(
      "nccl_library",
      []() {
#ifdef GRADZIP_HAVE_NCCL
        const collectives::NcclApi& api = collectives::nccl_api();
        py::dict library;
        library["path"] = api.path;
        library["found_by"] = api.found_by;
        library["version"] = api.version;
        return library;
#else
        GZ_THROW(ErrorCode::unsupported, "nccl_library: this gradzip was built without NCCL");
#endif
      },
      R"(The NCCL that CUDA tensors go over: {"path", "found_by", "version"} (version as NCCL's
code, e.g. 22809). Loads it if no call has yet (the one already in the process first, e.g.
PyTorch's). gradzip.Error when the build has no NCCL or none can be loaded (the message lists
each place tried).)");
  m.def(
      "add_nccl_library_candidates",
      [](const std::vector<std::string>& paths) {
#ifdef GRADZIP_HAVE_NCCL
        collectives::add_nccl_library_candidates(paths);
#else
        (void)paths;
#endif
      },
      py::arg("paths"),
      "Paths of libnccl.so.2 to try before the dynamic loader's search (no effect once loaded).");
  m.def(
      "sent_uncompressed",
      [](const std::string& spec, std::size_t count) {
        return collectives::sent_uncompressed(CompressionSpec::parse(spec), count);
      },
      py::arg("spec"), py::arg("count"),
      "Whether an all-reduce of `count` f32 elements under `spec` goes uncompressed (algo=auto "
      "and under min_bytes) once past warm-up: the rule the DDP hook applies per parameter.");
  m.def("parse_spec", [](const std::string& spec) { return CompressionSpec::parse(spec).to_string(); },
        py::arg("spec"), "The canonical form of a compression spec (gradzip.Error if it does not parse).");

  // The timeline the DDP hook records (gradzip/torch.py); the Reducer's is C++ only.
  using collectives::Timeline;
  using collectives::TimelineScope;
  struct TimelineRecording {  // a `with` block: the thread's calls recorded on one track
    Timeline* timeline = nullptr;
    int track = 0;
    std::optional<TimelineScope> scope;
  };
  py::class_<TimelineRecording, std::unique_ptr<TimelineRecording>>(m, "TimelineRecording")
      .def("__enter__", [](TimelineRecording& r) { r.scope.emplace(r.timeline, r.track); })
      .def("__exit__", [](TimelineRecording& r, const py::args&) { r.scope.reset(); });
  py::class_<Timeline>(m, "Timeline", R"(One rank's timeline as Chrome trace / Perfetto JSON
(gradzip's collectives/timeline.h). Times are microseconds since construction (now_us()).)")
      .def(py::init<int>(), py::arg("rank"))
      .def("now_us", [](const Timeline& t) { return t.microseconds_at(collectives::TimelineClock::now()); })
      .def("name_track", &Timeline::name_track, py::arg("track"), py::arg("name"))
      .def(
          "span",
          [](Timeline& t, int track, const std::string& name, const std::string& category,
             double begin_us, double end_us, const std::string& args) {
            t.span(track, name, category, t.time_at(begin_us), t.time_at(end_us), args);
          },
          py::arg("track"), py::arg("name"), py::arg("category"), py::arg("begin_us"),
          py::arg("end_us"), py::arg("args") = "",
          "A span; args: JSON object members without the braces.")
      .def(
          "instant",
          [](Timeline& t, int track, const std::string& name, const std::string& category,
             double at_us, const std::string& args) {
            t.instant(track, name, category, t.time_at(at_us), args);
          },
          py::arg("track"), py::arg("name"), py::arg("category"), py::arg("at_us"),
          py::arg("args") = "")
      .def(
          "recording",
          [](Timeline& t, int track) {
            auto recording = std::make_unique<TimelineRecording>();
            recording->timeline = &t;
            recording->track = track;
            return recording;
          },
          py::arg("track"), py::keep_alive<0, 1>(),
          "A context manager: gradzip calls of this thread inside it are recorded on `track` "
          "(each call a span, its encode / communicate / decode stages inside).")
      .def("event_count", &Timeline::event_count)
      .def("to_json", &Timeline::to_json)
      .def("write", &Timeline::write, py::arg("path"), py::call_guard<py::gil_scoped_release>());
  m.def(
      "timeline_request",
      [](const std::string& path, std::uint64_t first_step, std::uint64_t steps) {
        const collectives::TimelineRequest request = collectives::timeline_request_from_environment(
            collectives::TimelineRequest{path, first_step, steps});
        return py::make_tuple(request.path, request.first_step, request.steps);
      },
      py::arg("path"), py::arg("first_step"), py::arg("steps"),
      "(path, first_step, steps) after GRADZIP_TIMELINE and GRADZIP_TIMELINE_STEPS.");
  m.def("timeline_path_for_rank", &collectives::timeline_path_for_rank, py::arg("path"),
        py::arg("rank"), py::arg("ranks"), "The file rank `rank` of `ranks` writes.");

  py::class_<Communicator>(m, "Communicator", R"(Compressed collectives over a transport.

engine=None (the default): over MPI_COMM_WORLD; initialises MPI (MPI_THREAD_MULTIPLE) unless
the application did. engine=a gradzip._process_group.ProcessGroupEngine: over torch.distributed
(gradzip.Communicator(transport="torch") makes the engine). Every rank calls every collective in
the same order with the same name, size, dtype, spec and op.

link_gbps > 0 gives algo=auto's cost model the link (link_latency_us its latency,
link_exchange_gbps a pairwise-exchange rate, 0: link_gbps) instead of measuring it at the first
call that needs it; all three 0 (the default): measured. GRADZIP_LINK overrides them.
timeout_s > 0 is the deadline of every blocking wait (GRADZIP_TIMEOUT_S overrides it; default
600 s); on_timeout is "abort" (end the process, exit code 124) or "throw" (gradzip.Error with
code "timeout"; the communicator is dead afterwards). release_unused_after_calls: the residuals
and call number of a name no call used for that many calls are released (the first release is
said on stderr); 0 keeps everything.)")
      .def(py::init([](const std::string& default_spec, double link_latency_us, double link_gbps,
                       double link_exchange_gbps, double timeout_s, const std::string& on_timeout,
                       std::uint64_t release_unused_after_calls, py::object engine) {
             CommunicatorOptions options;
             options.default_spec = default_spec;
             options.link_latency_us = link_latency_us;
             options.link_gbps = link_gbps;
             options.link_exchange_gbps = link_exchange_gbps;
             options.timeout_seconds = timeout_s;
             options.release_unused_after_calls = release_unused_after_calls;
             if (on_timeout == "abort") options.on_timeout = TimeoutAction::abort;
             else if (on_timeout == "throw") options.on_timeout = TimeoutAction::throw_error;
             else throw py::value_error("on_timeout '" + on_timeout + "' (accepted: abort, throw)");
             if (engine.is_none()) return Communicator::world(std::move(options));
             return collectives::make_communicator(
                 std::make_unique<python::ProcessGroupTransport>(std::move(engine)), std::move(options));
           }),
           py::arg("default_spec") = "none", py::kw_only(), py::arg("link_latency_us") = 0.0,
           py::arg("link_gbps") = 0.0, py::arg("link_exchange_gbps") = 0.0,
           py::arg("timeout_s") = 0.0, py::arg("on_timeout") = "abort",
           py::arg("release_unused_after_calls") = CommunicatorOptions{}.release_unused_after_calls,
           py::arg("engine") = py::none())
      .def_property_readonly(
          "transport",
          [](Communicator& communicator) { return collectives::transport_description(communicator); },
          "What moves this communicator's bytes, e.g. \"mpi rank 0 of 2\" or \"torch.distributed (gloo) rank 0 of 2\".")
      .def_property_readonly(
          "timeout_s",
          [](Communicator& communicator) { return collectives::deadline_policy_of(communicator).seconds; },
          "The deadline of every blocking wait, in seconds (after GRADZIP_TIMEOUT_S).")
      .def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("size", &Communicator::size)
      .def(
          "allreduce",
          [](Communicator& communicator, py::handle tensor, const std::string& name,
             std::optional<std::string> spec, const std::string& op, std::optional<std::uint32_t> step) {
            return run_in_place(communicator, tensor, spec, op,
                                [&](TensorView view, const CompressionSpec& parsed, ReduceOp reduce) {
                                  return step ? collectives::allreduce_keyed_by_step(
                                                    communicator, view, name, parsed, reduce, *step)
                                              : communicator.allreduce(view, name, parsed, reduce);
                                });
          },
          py::arg("tensor"), py::arg("name"), py::arg("spec") = py::none(), py::arg("op") = "sum",
          py::kw_only(), py::arg("step") = py::none(),
          R"(In-place all-reduce of `tensor` (NumPy array or torch tensor) under `name` (which keys
error feedback and the random streams); `spec` defaults to the communicator's default spec,
`op` is "sum" or "average". step=None: the random streams and the spec's warm-up count the
name's calls; step=N (the same on every rank): they count N instead, e.g. the training
iteration, so that a job resumed from a checkpoint draws what the uninterrupted one would have.
Returns what this rank did: algorithm, bytes, ratio, times.)")
      .def(
          "reduce_scatter",
          [](Communicator& communicator, py::handle tensor, const std::string& name,
             std::optional<std::string> spec, const std::string& op, std::optional<std::uint32_t> step) {
            return run_in_place(communicator, tensor, spec, op,
                                [&](TensorView view, const CompressionSpec& parsed, ReduceOp reduce) {
                                  return step ? collectives::reduce_scatter_keyed_by_step(
                                                    communicator, view, name, parsed, reduce, *step)
                                              : communicator.reduce_scatter(view, name, parsed, reduce);
                                });
          },
          py::arg("tensor"), py::arg("name"), py::arg("spec") = py::none(), py::arg("op") = "sum",
          py::kw_only(), py::arg("step") = py::none(),
          R"(Compressed reduce-scatter in place: `tensor` holds this rank's whole contribution; on
return this rank's shard of it, elements [shard_begin(n, rank), shard_begin(n, rank + 1)), holds
the reduced shard (the rest of `tensor` is unspecified). Names, spec, op and step as allreduce;
error feedback keeps the residual of this rank's whole contribution under `name`.)")
      .def("save_residuals", &Communicator::save_residuals, py::arg("path"),
           py::call_guard<py::gil_scoped_release>())
      .def("load_residuals", &Communicator::load_residuals, py::arg("path"),
           py::call_guard<py::gil_scoped_release>())
      .def(
          "residual_names",
          [](Communicator& communicator) { return collectives::residuals_of(communicator).names(); },
          "Names of the error-feedback residuals this rank holds.")
      .def(
          "residual",
          [](Communicator& communicator, const std::string& name) -> py::object {
            const error_feedback::ResidualStore& store = collectives::residuals_of(communicator);
            if (!store.contains(name)) return py::none();
            const std::span<const float> values = store.residual(name);
            py::object copy = numpy_f32_array(values.size());
            if (!values.empty()) std::memcpy(writable_f32_buffer(copy, values.size()), values.data(), values.size_bytes());
            return copy;
          },
          py::arg("name"), "A copy of the residual `name` (float32 array), or None.")
      .def(
          "set_residual",
          [](Communicator& communicator, const std::string& name, py::handle values,
             std::optional<std::string> placed_in, std::size_t offset) {
            const py::object contiguous = py::module_::import("numpy").attr("ascontiguousarray")(
                values, py::arg("dtype") = "float32");
            const py::buffer_info info = py::reinterpret_borrow<py::buffer>(contiguous).request();
            error_feedback::ResidualStore& store = collectives::residuals_of(communicator);
            if (placed_in) store.set_placement(name, *placed_in, offset);
            const std::span<float> target = store.residual(name, static_cast<std::size_t>(info.size));
            if (!target.empty()) std::memcpy(target.data(), info.ptr, target.size_bytes());
          },
          py::arg("name"), py::arg("values"), py::kw_only(), py::arg("placed_in") = py::none(),
          py::arg("offset") = 0,
          "Sets the residual `name` (registering it with values' size; a registered residual of "
          "another size follows the store's resize policy). placed_in=ROOT: `name` is one of the "
          "residuals an algorithm keeps besides ROOT's worker residual, its element 0 at element "
          "`offset` of ROOT (as placed_residuals(ROOT) reported), so that fold_residuals(ROOT) "
          "and drop_residuals(ROOT) include it.")
      .def(
          "placed_residuals",
          [](Communicator& communicator, const std::string& name) {
            return collectives::residuals_of(communicator).placed_in(name);
          },
          py::arg("name"),
          R"(The residuals the algorithms keep for `name` besides its worker residual (SRA's owner
side, the tree's root, halving/doubling's, the hierarchical shard's), as (residual name, offset
of its element 0 in `name`'s elements) pairs in name order: with residual(name) itself, every
residual of the tensor, which set_residual(..., placed_in=name, offset=...) puts back exactly.)")
      .def(
          "folded_residual",
          [](Communicator& communicator, const std::string& name, std::size_t count) -> py::object {
            const std::optional<std::vector<float>> folded =
                collectives::residuals_of(communicator).folded_copy(name, count);
            if (!folded) return py::none();
            py::object copy = numpy_f32_array(folded->size());
            if (!folded->empty())
              std::memcpy(writable_f32_buffer(copy, folded->size()), folded->data(), folded->size() * sizeof(float));
            return copy;
          },
          py::arg("name"), py::arg("count"),
          R"(What residual(name) would hold after fold_residuals(name, count), as a new float32
array, without changing anything (the next call sends what it would have sent); None when
`name` has no residual and nothing is placed in it.)")
      .def(
          "drop_residuals",
          [](Communicator& communicator, const std::string& name) {
            return collectives::residuals_of(communicator).erase_tree(name);
          },
          py::arg("name"),
          R"(Forgets the residual `name` and every residual placed in it (a tensor gone for good,
e.g. a bucket layout that DDP replaced, whose residuals were carried elsewhere): the release
window then never reports them. Returns how many residuals were forgotten.)")
      .def(
          "fold_residuals",
          [](Communicator& communicator, const std::string& name, std::size_t count) {
            return collectives::residuals_of(communicator).fold_into(name, count);
          },
          py::arg("name"), py::arg("count"),
          R"(Moves every residual the algorithms keep besides the worker residual `name` (SRA's
owner side, the tree's root, halving/doubling's steps and owner, the hierarchical shard's) into
`name` at the elements they cover, registering `name` with `count` elements if needed. Per
element this rank's residual mass is unchanged, and every algorithm compensates or delivers
what its worker residual holds, so nothing is lost; afterwards residual(name) holds all of it
(what the DDP hook carries across bucket rebuilds and checkpoints). Returns how many residuals
were folded.)")
      .def(
          "auto_model_state",
          [](Communicator& communicator) {
            const error_feedback::CheckpointModelInputs saved =
                collectives::to_checkpoint_model_inputs(collectives::auto_model_inputs(communicator));
            py::dict hierarchies;
            for (const auto& [ranks_per_node, hierarchy] : saved.hierarchies)
              hierarchies[py::int_(ranks_per_node)] = py::make_tuple(
                  hierarchy.node_size, link_tuple(hierarchy.intra), link_tuple(hierarchy.across));
            py::dict costs;
            for (const auto& [spec, cost] : saved.codec_costs)
              costs[py::str(spec)] = py::make_tuple(cost.encode_s, cost.decode_add_s, cost.add_s);
            py::dict state;
            state["link"] = saved.link ? py::object(link_tuple(*saved.link)) : py::object(py::none());
            state["hierarchies"] = hierarchies;
            state["codec_costs"] = costs;
            return state;
          },
          R"(algo=auto's measured model inputs (the link, node structures, codec costs), as a dict
of numbers: "link": (latency_s, bytes_per_s, exchange_bytes_per_s, collective_latency_s) or None,
"hierarchies": {ranks_per_node: (node_size, intra link, across link)}, "codec_costs": {spec:
(encode_s, decode_add_s, add_s)}. A job that adopts them (adopt_auto_model_state) makes the
choices this one makes instead of measuring again: what the DDP hook's state_dict() keeps.)")
      .def(
          "adopt_auto_model_state",
          [](Communicator& communicator, const py::dict& state) {
            error_feedback::CheckpointModelInputs saved;
            if (!state["link"].is_none()) saved.link = link_from(state["link"]);
            for (const auto& [key, value] : state["hierarchies"].cast<py::dict>()) {
              const auto [node_size, intra, across] = value.cast<std::tuple<std::uint32_t, py::object, py::object>>();
              saved.hierarchies[key.cast<std::uint32_t>()] =
                  error_feedback::SavedHierarchy{node_size, link_from(intra), link_from(across)};
            }
            for (const auto& [key, value] : state["codec_costs"].cast<py::dict>()) {
              const auto [encode_s, decode_add_s, add_s] = value.cast<std::tuple<double, double, double>>();
              saved.codec_costs[key.cast<std::string>()] =
                  error_feedback::SavedCodecCost{encode_s, decode_add_s, add_s};
            }
            const std::string fault = error_feedback::model_inputs_fault(saved);
            GZ_REQUIRE(fault.empty(), ErrorCode::invalid_argument,
                       "adopt_auto_model_state: algo=auto's model input ", fault);
            collectives::adopt_auto_model_inputs(communicator,
                                                 collectives::from_checkpoint_model_inputs(saved));
          },
          py::arg("state"),
          "Takes what auto_model_state() returned (in this job or an earlier one of the same "
          "ranks): algo=auto then chooses from those inputs. gradzip.Error (invalid_argument) "
          "names an input that is not a valid measurement.")
      .def("shard_begin", &Communicator::shard_begin, py::arg("count"), py::arg("rank"))
      .def(
          "powersgd_allreduce",
          [](Communicator& communicator, py::handle tensor, const std::string& group_name,
             const std::string& spec,
             const std::vector<std::tuple<std::string, std::size_t, std::size_t, std::size_t>>& matrices,
             std::uint32_t step) {
            const TensorView view = view_of(tensor, true, "the tensor");
            if (view.dtype != DType::f32 || view.device.kind != DeviceKind::cpu) {
              throw py::type_error("powersgd_allreduce takes a float32 CPU tensor (PowerSGD's "
                                   "products run on the host)");
            }
            const CompressionSpec parsed = CompressionSpec::parse(spec);
            // A matrix outside the tensor is this rank's own error: it goes to the P call as the
            // preset error, so every rank throws instead of the others waiting for this one.
            std::optional<Error> preset;
            std::vector<pipeline::PowerSgdMatrix> parts;
            for (const auto& [name, offset, rows, cols] : matrices) {
              if (offset > view.count || rows * cols > view.count - offset) {
                preset = Error(ErrorCode::invalid_argument,
                               "powersgd_allreduce of '" + group_name + "': matrix '" + name + "' (" +
                                   std::to_string(rows) + " x " + std::to_string(cols) + " at offset " +
                                   std::to_string(offset) + ") lies outside the tensor of " +
                                   std::to_string(view.count) + " elements");
                parts.clear();
                break;
              }
              parts.push_back(pipeline::PowerSgdMatrix{
                  name, {static_cast<float*>(view.data) + offset, rows * cols}, rows, cols});
            }
            CollectiveStats stats;
            {
              py::gil_scoped_release release;
              stats = pipeline::powersgd_allreduce(communicator, parts, parsed,
                                                   group_name, step, preset ? &*preset : nullptr);
            }
            return stats_dict(stats);
          },
          py::arg("tensor"), py::arg("group_name"), py::arg("spec"), py::arg("matrices"),
          py::arg("step"),
          R"(One PowerSGD step (pipeline/powersgd.h) over the matrices of a flat float32 CPU
`tensor`: `matrices` lists (name, offset, rows, cols), row-major at element `offset`; each is
replaced by the rank-R approximation of the average over ranks. Residuals and Q are kept per
matrix name ("powersgd:<name>", "powersgd-q:<name>"); `spec` is a powersgd spec, `step` the
training step. Every rank passes the same names, shapes and order. Returns the stats.)");

  py::class_<Codec, std::shared_ptr<Codec>>(m, "Codec", "One compression spec's encoder and decoder.")
      .def(py::init([](const std::string& spec) { return std::shared_ptr<Codec>(make_codec(spec)); }),
           py::arg("spec"))
      .def_property_readonly("spec", &Codec::name)
      .def("max_encoded_bytes", &Codec::max_encoded_bytes, py::arg("count"))
      .def(
          "encode",
          [](const Codec& codec, py::handle tensor, std::uint64_t seed, std::uint32_t step,
             std::uint32_t tensor_id, std::uint64_t element_offset) {
            const TensorView view = view_of(tensor, false, "the tensor");
            std::string message(codec.max_encoded_bytes(view.count), '\0');
            std::size_t bytes = 0;
            {
              py::gil_scoped_release release;
              bytes = codec.encode(view, std::as_writable_bytes(std::span(message.data(), message.size())),
                                   EncodeContext{seed, step, tensor_id, element_offset});
            }
            message.resize(bytes);
            return py::bytes(message);
          },
          py::arg("tensor"), py::arg("seed") = 0, py::arg("step") = 0, py::arg("tensor_id") = 0,
          py::arg("element_offset") = 0, "The message (bytes) encoding `tensor` (host memory).")
      .def(
          "decode",
          [](const Codec& codec, const py::bytes& message, py::handle out) {
            const TensorView view = view_of(out, true, "the output");
            const std::string_view bytes = message;
            py::gil_scoped_release release;
            codec.decode(std::as_bytes(std::span(bytes.data(), bytes.size())), view);
          },
          py::arg("message"), py::arg("out"), "Decodes `message` into `out` (its element count must match).")
      .def(
          "decode_add",
          [](const Codec& codec, const py::bytes& message, py::handle accumulator) {
            const TensorView view = view_of(accumulator, true, "the accumulator");
            const std::string_view bytes = message;
            py::gil_scoped_release release;
            codec.decode_add(std::as_bytes(std::span(bytes.data(), bytes.size())), view);
          },
          py::arg("message"), py::arg("accumulator"), "accumulator += decode(message) (float32).");
}
