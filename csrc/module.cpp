// Python bindings of torchtpu._C: device state, storage events, generators.
#include <ATen/MemoryOverlap.h>
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include "core/allocator.h"
#include "core/device.h"
#include "core/generator.h"
#include "core/storage.h"
#include "executor/executor.h"
#include "graph/capture.h"
#include "graph/fragment.h"
#include "graph/graph.h"
#include "runtime/python.h"

namespace py = pybind11;

namespace {

torchtpu::TpuGeneratorImpl* generator_of(py::object gen, int64_t device_index) {
  if (gen.is_none()) {
    return torchtpu::default_generator(static_cast<c10::DeviceIndex>(device_index)).get<torchtpu::TpuGeneratorImpl>();
  }
  TORCH_CHECK(THPGenerator_Check(gen.ptr()), "expected a torch.Generator");
  auto& g = reinterpret_cast<THPGenerator*>(gen.ptr())->cdata;
  TORCH_CHECK(g.device().type() == c10::DeviceType::PrivateUse1,
              "Expected a 'tpu' device type for generator but found '", g.device().type(), "'");
  return g.get<torchtpu::TpuGeneratorImpl>();
}

at::Tensor tensor_of(py::handle h) {
  TORCH_CHECK(THPVariable_Check(h.ptr()), "expected a tensor");
  return THPVariable_Unpack(h.ptr());
}

std::vector<at::Tensor> tensors_of(const py::list& l) {
  std::vector<at::Tensor> out;
  for (auto h : l) out.push_back(h.is_none() ? at::Tensor() : tensor_of(h));
  return out;
}

torchtpu::ValueType value_type_of(py::handle shape, py::handle dtype) {
  torchtpu::ValueType t;
  t.dtype = dtype.cast<at::ScalarType>();
  for (auto d : shape) t.shape.push_back(d.cast<int64_t>());
  return t;
}

// The enums of core/kinds.h, by name (Python passes and compares these, never bare positions): _C.Mode.fused,
// _C.CutCause.host_read (cut_cause_name: the names metrics use), _C.OutputKind.new...
void register_enums(py::module& m) {
  py::enum_<torchtpu::Mode>(m, "Mode")
      .value("strict", torchtpu::Mode::kStrict)
      .value("debug", torchtpu::Mode::kDebug)
      .value("fused", torchtpu::Mode::kFused);
  py::enum_<torchtpu::CutCause> cut(m, "CutCause");
  for (int c = 0; c < static_cast<int>(torchtpu::CutCause::kCount); ++c) {
    const auto cause = static_cast<torchtpu::CutCause>(c);
    cut.value(torchtpu::cut_cause_name(cause), cause);  // "host_read": the name metrics use (cuts.host_read)
  }
  py::enum_<torchtpu::ScalarKind>(m, "ScalarKind")
      .value("float", torchtpu::ScalarKind::kFloat)
      .value("int", torchtpu::ScalarKind::kInt)
      .value("bool", torchtpu::ScalarKind::kBool)
      .value("complex", torchtpu::ScalarKind::kComplex)
      .value("rng", torchtpu::ScalarKind::kRng);
  py::enum_<torchtpu::SourceKind>(m, "SourceKind")
      .value("arg", torchtpu::SourceKind::kArg)
      .value("cpu_tensor", torchtpu::SourceKind::kCpuTensor)
      .value("rng", torchtpu::SourceKind::kRng)
      .value("rows", torchtpu::SourceKind::kRows)
      .value("sym", torchtpu::SourceKind::kSym);
  py::enum_<torchtpu::OutputKind>(m, "OutputKind")
      .value("new", torchtpu::OutputKind::kNew)
      .value("arg", torchtpu::OutputKind::kArg)
      .value("none", torchtpu::OutputKind::kNone);
  py::enum_<torchtpu::EntryKind>(m, "EntryKind")
      .value("program", torchtpu::EntryKind::kProgram)
      .value("python", torchtpu::EntryKind::kPython)
      .value("exact", torchtpu::EntryKind::kExact);
  py::enum_<torchtpu::Returns>(m, "Returns")
      .value("single", torchtpu::Returns::kSingle)
      .value("tuple", torchtpu::Returns::kTuple)
      .value("list", torchtpu::Returns::kList)
      .value("nothing", torchtpu::Returns::kNothing);
}

void register_executor(py::module& m) {
  m.def("_set_callbacks", &torchtpu::runtime::set_callbacks);
  m.def("_take_checks", &torchtpu::runtime::take_checks);
  m.def("_register_kernels", &torchtpu::register_kernels);
  m.def("_set_mode", &torchtpu::set_mode);
  m.def("_get_mode", &torchtpu::get_mode);
  m.def("_set_fused_limits", &torchtpu::set_fused_limits);
  m.def("_set_chunk_cache_capacity", &torchtpu::set_chunk_cache_capacity);
  m.def("_clear_chunk_cache", &torchtpu::clear_chunk_cache);
  m.def("_register_fragment", [](std::string label, std::string text, py::list deps, py::list params, py::list scalars,
                                 py::list results, bool has_check) {
    torchtpu::Fragment f;
    f.label = std::move(label);
    f.text = std::move(text);
    for (auto d : deps) {
      auto t = d.cast<py::tuple>();
      f.deps.emplace_back(t[0].cast<std::string>(), t[1].cast<std::string>());
    }
    for (auto p : params) {
      auto t = p.cast<py::tuple>();
      f.params.push_back(value_type_of(t[0], t[1]));
      f.param_types.push_back(t[2].cast<std::string>());
    }
    for (auto p : scalars) {
      auto t = p.cast<py::tuple>();
      f.scalars.push_back({static_cast<torchtpu::ScalarKind>(t[0].cast<int>()), t[1].cast<std::string>()});
    }
    for (auto p : results) {
      auto t = p.cast<py::tuple>();
      f.results.push_back(value_type_of(t[0], t[1]));
      f.result_types.push_back(t[2].cast<std::string>());
    }
    f.has_check = has_check;
    return torchtpu::register_fragment(std::move(f));
  });
  m.def("_record_fragment", [](int32_t fid, py::list storages, std::vector<double> fs, std::vector<int64_t> is,
                               py::list results, std::string line) {
    auto st = tensors_of(storages);
    auto rs = tensors_of(results);
    py::gil_scoped_release no_gil;
    torchtpu::record_fragment(fid, st, fs, is, rs, line);
  });
  // compiled graphs (torchtpu/compile.py, csrc/graph/capture.h)
  m.def("_capture_begin", [](int64_t device, py::list inputs) {
    auto ins = tensors_of(inputs);
    py::gil_scoped_release no_gil;
    torchtpu::capture_begin(static_cast<c10::DeviceIndex>(device), ins);
  });
  m.def("_capture_end", [](int64_t device, py::list inputs, py::list outputs) {
    auto ins = tensors_of(inputs);
    auto outs = tensors_of(outputs);
    torchtpu::CaptureResult r;
    {
      py::gil_scoped_release no_gil;
      r = torchtpu::capture_end(static_cast<c10::DeviceIndex>(device), ins, outs);
    }
    return py::make_tuple(r.program, r.why, r.check_fragments, r.ops);
  });
  m.def("_run_program", [](int32_t program, py::list inputs) -> py::object {
    auto ins = tensors_of(inputs);
    std::optional<std::vector<at::Tensor>> outs;
    {
      py::gil_scoped_release no_gil;
      outs = torchtpu::run_program(program, ins);
    }
    if (!outs) return py::none();
    return py::cast(*outs);
  });
  m.def("_program_info", [](int32_t program) {
    auto i = torchtpu::program_info(program);
    py::dict d;
    d["fragment"] = i.fragment;
    d["ops"] = i.ops;
    d["leaves"] = i.leaves;
    d["constants"] = i.constants;
    d["results"] = i.results;
    d["mutated"] = i.mutated;
    d["rng"] = i.rng;
    return d;
  });
  m.def("_storage_buffer", [](py::handle t, torchtpu::CutCause cause) -> py::object {
    at::Tensor tensor = tensor_of(t);
    _object* a;
    {
      py::gil_scoped_release no_gil;
      a = torchtpu::storage_buffer(tensor, static_cast<int>(cause));
    }
    if (a == nullptr) return py::none();
    return py::reinterpret_steal<py::object>(a);
  });
  m.def("_set_storage_buffer", [](py::handle t, py::object array, py::handle dtype, py::handle shape) {
    auto vt = value_type_of(shape, dtype);
    std::vector<int64_t> sh(vt.shape.begin(), vt.shape.end());
    torchtpu::set_storage_buffer(tensor_of(t), array.release().ptr(), vt.dtype, sh);
  });
  m.def("_storage_host_values", [](py::handle t) -> py::object {
    at::Tensor v = torchtpu::storage_host_values(tensor_of(t));
    if (!v.defined()) return py::none();
    return py::reinterpret_steal<py::object>(THPVariable_Wrap(v));
  });
  m.def("_set_upload_host_copies", [](int64_t n) { torchtpu::set_upload_host_copies(n); });
  m.def("_set_exact_uploads", [](bool on) { return torchtpu::set_exact_uploads(on); });
  m.def("_set_eager_buckets",
        [](bool on, std::vector<int64_t> sizes) { torchtpu::set_eager_buckets(on, std::move(sizes)); });
  m.def("_set_rows",
        [](py::handle t, int64_t rows, int64_t row_bytes) { torchtpu::set_rows(tensor_of(t), rows, row_bytes); });
  m.def("_rows_of", [](py::handle t) { return torchtpu::rows_of(tensor_of(t)); });
  m.def("_sym_of", [](py::handle t) { return torchtpu::sym_of(tensor_of(t)); });
  m.def("_storage_value_type", [](py::handle t) -> py::object {
    std::vector<int64_t> shape;
    at::ScalarType dtype;
    if (!torchtpu::storage_value_type(tensor_of(t), &shape, &dtype)) return py::none();
    return py::make_tuple(py::tuple(py::cast(shape)), py::cast(dtype));
  });
  m.def("_synchronize", [](int64_t device, torchtpu::CutCause cause) {
    py::gil_scoped_release no_gil;
    torchtpu::synchronize(device, static_cast<int>(cause));
  });
  m.def("_cut", [](int64_t device, torchtpu::CutCause cause) {
    py::gil_scoped_release no_gil;
    if (device < 0) {
      torchtpu::cut_all(cause);
    } else {
      torchtpu::cut(static_cast<c10::DeviceIndex>(device), cause);
    }
  });
  m.def("_pending_hashes",
        [](int64_t device) { return torchtpu::pending_hashes(static_cast<c10::DeviceIndex>(device)); });
  m.def("_pending_describe",
        [](int64_t device) { return torchtpu::pending_describe(static_cast<c10::DeviceIndex>(device)); });
  m.def("_pending_ops", [](int64_t device) { return torchtpu::pending_ops(static_cast<c10::DeviceIndex>(device)); });
  m.def("_counters", []() {
    py::dict d;
    auto e = torchtpu::exec_counters();
    d["ops"] = e.ops;
    d["op_table.hits"] = e.hits;
    d["op_table.misses"] = e.misses;
    d["op_table.entries"] = e.entries;
    d["op_table.specializations"] = e.specializations;
    d["op_table.bucket_exact"] = e.bucket_exact;
    d["upload.bucketed_rows"] = e.upload_rows;
    d["upload.varying_inner"] = e.upload_sym;
    d["python_kernels"] = e.python_kernels;
    auto& g = torchtpu::graph_counters();
    d["chunks"] = g.chunks.load();
    d["chunk_ops"] = g.chunk_ops.load();
    d["chunk_ops_max"] = g.chunk_ops_max.load();
    d["chunk_cache.hits"] = g.chunk_cache_hits.load();
    d["chunk_cache.misses"] = g.chunk_cache_misses.load();
    d["chunk_cache.evictions"] = g.chunk_cache_evictions.load();
    d["donated_buffers"] = g.donated_buffers.load();
    d["donated_bytes"] = g.donated_bytes.load();
    d["failed_chunks"] = g.failed_chunks.load();
    d["dead_ops"] = g.dead_ops.load();
    d["transfers.h2d"] = g.h2d_transfers.load();
    d["bytes.h2d"] = g.h2d_bytes.load();
    for (int c = 0; c < static_cast<int>(torchtpu::CutCause::kCount); ++c) {
      auto v = g.cuts[c].load();
      if (v) d[py::str(std::string("cuts.") + torchtpu::cut_cause_name(static_cast<torchtpu::CutCause>(c)))] = v;
    }
    py::dict ops;
    for (const auto& kv : torchtpu::op_counts()) ops[py::str(kv.first)] = kv.second;
    d["op_counts"] = ops;
    return d;
  });
  m.def("_reset_counters", &torchtpu::reset_counters);
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  torchtpu::runtime::init_numpy();
  register_enums(m);
  register_executor(m);
  m.def("_set_device_count", [](int64_t n) { torchtpu::set_device_count(static_cast<c10::DeviceIndex>(n)); });
  m.def("_device_count", []() { return static_cast<int64_t>(torchtpu::device_count()); });
  m.def("_current_device", []() { return static_cast<int64_t>(torchtpu::current_device()); });
  m.def("_set_device", [](int64_t i) { torchtpu::set_current_device(static_cast<c10::DeviceIndex>(i)); });
  m.def("_set_synchronize_callback", [](std::function<void(int64_t)> fn) {
    // The callback is invoked from C++ threads that may not hold the GIL (the guard).
    auto holder = std::make_shared<std::function<void(int64_t)>>(std::move(fn));
    torchtpu::set_synchronize_callback([holder](c10::DeviceIndex i) {
      py::gil_scoped_acquire gil;
      (*holder)(static_cast<int64_t>(i));
    });
  });
  m.def("_clear_synchronize_callback", []() { torchtpu::set_synchronize_callback(nullptr); });
  m.def("_memory_stats", [](int64_t device) {
    auto s = torchtpu::memory_stats(static_cast<c10::DeviceIndex>(device));
    return py::dict(py::arg("allocated_bytes") = s.allocated_bytes, py::arg("peak_bytes") = s.peak_bytes,
                    py::arg("live_buffers") = s.live_buffers, py::arg("total_buffers") = s.total_buffers,
                    py::arg("live_storages") = s.live_storages, py::arg("donated_bytes") = s.donated_bytes);
  });
  m.def("_reset_peak_memory",
        [](int64_t device) { torchtpu::reset_peak_memory(static_cast<c10::DeviceIndex>(device)); });
  // CPU's out= aliasing checks, on tpu tensors' storage tokens (nothing is dereferenced).
  m.def("_assert_no_internal_overlap", [](const at::Tensor& t) { at::assert_no_internal_overlap(t); });
  m.def("_assert_no_overlap", [](const at::Tensor& a, const at::Tensor& b) { at::assert_no_overlap(a, b); });
  m.def(
      "_philox_advance",
      [](py::object gen, int64_t device_index, uint64_t increment) {
        return generator_of(std::move(gen), device_index)->philox_advance(increment);
      },
      py::arg("generator"), py::arg("device_index"), py::arg("increment"));
  m.def("_default_generator", [](int64_t idx) {
    return py::reinterpret_steal<py::object>(
        THPGenerator_initDefaultGenerator(torchtpu::default_generator(static_cast<c10::DeviceIndex>(idx))));
  });
}
