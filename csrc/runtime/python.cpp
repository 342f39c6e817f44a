// JaxlibRuntime, C++ side: the only translation unit that holds Python objects. Every entry point takes the
// GIL for its own span and is never called with exec_mutex() held.
#define PY_ARRAY_UNIQUE_SYMBOL torchtpu_ARRAY_API
#include <Python.h>
#include <numpy/arrayobject.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>

#include <cstring>
#include <unordered_map>

#include "graph/fragment.h"
#include "runtime/python.h"
#include "runtime/runtime.h"

namespace py = pybind11;

namespace torchtpu {
namespace runtime {
namespace {

// Python callables set by torchtpu at import (`_C._set_callbacks(kernels.callbacks())` in torchtpu/__init__.py).
// Leaked on purpose: they must outlive every kernel call, interpreter shutdown included.
struct Callbacks {
  py::object lower, python_kernel, compile_chunk, submit_checks, user_line, wait_all, device_put_args;
};
Callbacks* g_cb = nullptr;

Callbacks& cb() {
  TORCH_CHECK(g_cb != nullptr, "torchtpu: the runtime callbacks are not set (import torchtpu first)");
  return *g_cb;
}

[[noreturn]] void throw_python_error(const char* what) {
  // py::error_already_set holds the Python exception; its message becomes the c10::Error's.
  py::error_already_set e;
  std::string msg = e.what();
  TORCH_CHECK(false, what, msg);
}

py::object value_type_to_py(const ValueType& t) {
  py::tuple shape(t.shape.size());
  for (size_t i = 0; i < t.shape.size(); ++i) shape[i] = py::int_(t.shape[i]);
  return py::make_tuple(shape, py::cast(t.dtype));
}

ArgPath path_of(py::handle h) {
  auto t = h.cast<py::tuple>();
  return {t[0].cast<int32_t>(), t[1].cast<int32_t>()};
}

Entry entry_from_py(py::handle obj) {
  Entry e;
  auto t = obj.cast<py::tuple>();
  const auto kind = t[0].cast<std::string>();
  if (kind == "python") {
    e.kind = EntryKind::kPython;
    return e;
  }
  if (kind == "exact") {
    e.kind = EntryKind::kExact;
    return e;
  }
  TORCH_INTERNAL_ASSERT(kind == "program", "tpu: the lowering returned ", kind);
  e.fragment = t[1].cast<int32_t>();
  e.storage_params = t[2].cast<std::vector<int32_t>>();
  for (auto s : t[3].cast<py::list>()) {
    auto st = s.cast<py::tuple>();
    ScalarSource src;
    src.kind = static_cast<SourceKind>(st[0].cast<int>());
    src.path = {st[1].cast<int32_t>(), st[2].cast<int32_t>()};
    src.increment = st[3].cast<int64_t>();
    e.scalar_params.push_back(src);
  }
  for (auto r : t[4].cast<py::list>()) {
    auto rt = r.cast<py::tuple>();
    ResultTarget target;
    target.storage = rt[0].cast<int32_t>();
    target.output = rt[1].cast<int32_t>();
    if (rt.size() > 2) target.arg = {rt[2].cast<int32_t>(), rt[3].cast<int32_t>()};
    e.results.push_back(target);
  }
  for (auto o : t[5].cast<py::list>()) {
    auto ot = o.cast<py::tuple>();
    OutputSpec spec;
    spec.kind = static_cast<OutputKind>(ot[0].cast<int>());
    spec.path = {ot[1].cast<int32_t>(), ot[2].cast<int32_t>()};
    if (spec.kind == OutputKind::kNew) {
      spec.sizes = ot[3].cast<std::vector<int64_t>>();
      spec.strides = ot[4].cast<std::vector<int64_t>>();
      spec.dtype = ot[5].cast<at::ScalarType>();
      if (ot.size() > 7) {
        spec.rows_class = ot[6].cast<int32_t>();
        spec.rows_dim = ot[7].cast<int32_t>();
      }
      if (ot.size() > 8) spec.sym_sizes = ot[8].cast<std::vector<int64_t>>();
    }
    e.outputs.push_back(std::move(spec));
  }
  e.returns = static_cast<Returns>(t[6].cast<int>());
  for (auto p : t[7].cast<py::list>()) e.value_slots.push_back(path_of(p));
  e.capture_line = t[8].cast<bool>();
  for (auto r : t[9].cast<py::list>()) {
    auto rt = r.cast<py::tuple>();
    e.resizes.emplace_back(ArgPath{rt[0].cast<int32_t>(), rt[1].cast<int32_t>()}, rt[2].cast<std::vector<int64_t>>());
  }
  return e;
}

py::object numpy_vector(const void* data, int64_t n, int type) {
  npy_intp dims[1] = {static_cast<npy_intp>(n)};
  PyObject* a = PyArray_SimpleNew(1, dims, type);
  if (a == nullptr) throw py::error_already_set();
  std::memcpy(PyArray_DATA(reinterpret_cast<PyArrayObject*>(a)), data, n * 8);
  return py::reinterpret_steal<py::object>(a);
}

}  // namespace

void init_numpy() {
  if (_import_array() < 0) throw py::error_already_set();
}

void set_callbacks(py::dict d) {
  auto* c = new Callbacks();
  c->lower = d["lower"];
  c->python_kernel = d["python_kernel"];
  c->compile_chunk = d["compile_chunk"];
  c->submit_checks = d["submit_checks"];
  c->user_line = d["user_line"];
  c->wait_all = d["wait_all"];
  c->device_put_args = d["device_put_args"];
  g_cb = c;
}

std::string op_name(const c10::FunctionSchema& schema) {
  const std::string& full = schema.name();
  std::string name = full.compare(0, 6, "aten::") == 0 ? full.substr(6) : full;
  if (!schema.overload_name().empty()) name += "." + schema.overload_name();
  return name;
}

Entry lower_op(const LowerRequest& req) {
  py::gil_scoped_acquire gil;
  const auto& schema = req.op->schema();
  const std::string name = op_name(schema);
  const size_t base = req.stack->size() - req.nargs;
  py::list args;
  for (size_t i = 0; i < req.nargs; ++i) args.append(torch::jit::toPyObject((*req.stack)[base + i]));
  py::list slots;
  for (const auto& p : req.runtime_slots) slots.append(py::make_tuple(p.arg, p.elem));
  py::list storages;
  for (size_t k = 0; k < req.storage_tokens.size(); ++k) {
    storages.append(py::make_tuple(py::int_(req.storage_tokens[k]),
                                   req.storage_has_value[k] ? value_type_to_py(req.storage_types[k]) : py::none()));
  }
  // A rule's own error (bad input) propagates as the Python exception it is (TpuOpError, IndexError, ...).
  py::object buckets = py::none();
  if (!req.bucketed.empty()) {
    py::list b;
    for (const auto& x : req.bucketed) b.append(py::make_tuple(x.path.arg, x.path.elem, x.dim, x.cls, x.capacity));
    buckets = py::make_tuple(py::cast(req.rows), b);
  }
  if (req.sym >= 0) {  // a varying inner size instead: ("sym", L, capacity, [(arg, elem, slot, code)...])
    py::list f;
    for (const auto& x : req.sym_forms) f.append(py::make_tuple(x.path.arg, x.path.elem, x.slot, x.code));
    buckets = py::make_tuple("sym", req.sym, req.sym_cap, f);
  }
  py::object r = cb().lower(name, args, slots, storages, static_cast<int>(req.device), py::bytes(req.key), buckets);
  return entry_from_py(r);
}

void run_python_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  py::gil_scoped_acquire gil;
  const auto& schema = op.schema();
  const std::string name = op_name(schema);
  const size_t nargs = schema.arguments().size();
  const size_t base = stack->size() - nargs;
  py::list args;
  for (size_t i = 0; i < nargs; ++i) args.append(torch::jit::toPyObject(std::move((*stack)[base + i])));
  torch::jit::drop(*stack, nargs);
  py::object r = cb().python_kernel(name, args);
  const auto& rets = schema.returns();
  if (rets.empty()) return;
  if (rets.size() == 1) {
    stack->push_back(torch::jit::toIValue(r, rets[0].type()));
    return;
  }
  auto tup = r.cast<py::tuple>();
  for (size_t i = 0; i < rets.size(); ++i) stack->push_back(torch::jit::toIValue(tup[i], rets[i].type()));
}

_object* compile_chunk(const std::string& text, c10::DeviceIndex device, const std::vector<ValueType>& leaves,
                       int64_t n_fscalars, int64_t n_iscalars, const std::vector<ValueType>& results) {
  py::gil_scoped_acquire gil;
  py::list lt, rt;
  for (const auto& l : leaves) lt.append(value_type_to_py(l));
  for (const auto& r : results) rt.append(value_type_to_py(r));
  try {
    py::object launcher = cb().compile_chunk(text, static_cast<int>(device), lt, n_fscalars, n_iscalars, rt);
    return launcher.release().ptr();
  } catch (py::error_already_set& e) {
    TORCH_CHECK(false, e.what());
  }
}

std::vector<_object*> launch(_object* launcher, const std::vector<_object*>& leaves,
                             const std::vector<double>& fscalars, const std::vector<int64_t>& iscalars) {
  py::gil_scoped_acquire gil;
  release_queued_locked_gil();
  c10::SmallVector<PyObject*, 8> argv;
  for (auto* l : leaves) argv.push_back(l);
  py::object fpack, ipack;
  if (!fscalars.empty()) {
    fpack = numpy_vector(fscalars.data(), static_cast<int64_t>(fscalars.size()), NPY_FLOAT64);
    argv.push_back(fpack.ptr());
  }
  if (!iscalars.empty()) {
    ipack = numpy_vector(iscalars.data(), static_cast<int64_t>(iscalars.size()), NPY_INT64);
    argv.push_back(ipack.ptr());
  }
  PyObject* res = PyObject_Vectorcall(launcher, argv.data(), argv.size(), nullptr);
  if (res == nullptr) {
    py::error_already_set e;
    TORCH_CHECK(false, e.what());
  }
  std::vector<_object*> out;
  PyObject* seq = PySequence_Fast(res, "tpu: a launcher returned a non-sequence");
  Py_DECREF(res);
  if (seq == nullptr) throw_python_error("tpu: ");
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  out.reserve(n);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = PySequence_Fast_GET_ITEM(seq, i);
    Py_INCREF(item);
    out.push_back(item);
  }
  Py_DECREF(seq);
  return out;
}

_object* upload(const at::Tensor& host, c10::DeviceIndex device) {
  py::gil_scoped_acquire gil;
  release_queued_locked_gil();
  // (batched_device_put, aval, sharding, device) per (device, shape, dtype), from Python once
  static std::unordered_map<std::string, py::tuple>* args = new std::unordered_map<std::string, py::tuple>();
  std::string key(reinterpret_cast<const char*>(&device), sizeof(device));
  const auto st = host.scalar_type();
  key.append(reinterpret_cast<const char*>(&st), sizeof(st));
  for (auto d : host.sizes()) key.append(reinterpret_cast<const char*>(&d), sizeof(d));
  auto it = args->find(key);
  if (it == args->end()) {
    it = args->emplace(key, cb().device_put_args(py::tuple(py::cast(host.sizes().vec())), py::cast(st),
                                                 static_cast<int>(device))
                                .cast<py::tuple>())
             .first;
  }
  const py::tuple& a = it->second;  // (batched_device_put, aval, sharding, [device], numpy dtype)
  // a numpy array that owns a copy of the bytes (jaxlib may alias what it is given)
  std::vector<npy_intp> dims(host.sizes().begin(), host.sizes().end());
  PyArray_Descr* descr = reinterpret_cast<PyArray_Descr*>(a[4].ptr());
  Py_INCREF(descr);
  PyObject* arr = PyArray_NewFromDescr(&PyArray_Type, descr, static_cast<int>(dims.size()), dims.data(), nullptr,
                                       nullptr, 0, nullptr);
  if (arr == nullptr) throw py::error_already_set();
  py::object np_arr = py::reinterpret_steal<py::object>(arr);
  std::memcpy(PyArray_DATA(reinterpret_cast<PyArrayObject*>(arr)), host.const_data_ptr(), host.nbytes());
  py::list xs;
  xs.append(np_arr);
  py::object out = a[0](a[1], a[2], xs, a[3], true);
  return out.release().ptr();
}

void wait(const std::vector<_object*>& arrays) {
  py::gil_scoped_acquire gil;
  for (auto* a : arrays) {
    try {
      py::handle(a).attr("block_until_ready")();
    } catch (py::error_already_set& e) {
      TORCH_CHECK(false, e.what());
    }
  }
}

void wait_all(c10::DeviceIndex device) {
  py::gil_scoped_acquire gil;
  try {
    cb().wait_all(static_cast<int>(device));
  } catch (py::error_already_set& e) {
    TORCH_CHECK(false, e.what());
  }
}

namespace {
// Checks of launched chunks not verified yet: they stay here (no Python per op) until a host read or a sync
// takes them (take_checks), or too many are pending.
struct PendingCheck {
  _object* array;
  int32_t fragment;
  std::string line;
};
std::mutex g_checks_mu;
std::vector<PendingCheck> g_checks;
constexpr size_t kMaxPendingChecks = 4096;

py::list checks_to_py(std::vector<PendingCheck>& checks) {
  py::list out;
  for (auto& c : checks) out.append(py::make_tuple(py::reinterpret_steal<py::object>(c.array), c.fragment, c.line));
  checks.clear();
  return out;
}
}  // namespace

void submit_checks(const std::vector<_object*>& arrays, const std::vector<int32_t>& fragments,
                   const std::vector<std::string>& lines, bool now) {
  std::vector<PendingCheck> take;
  {
    std::lock_guard<std::mutex> lk(g_checks_mu);
    for (size_t i = 0; i < arrays.size(); ++i) g_checks.push_back({arrays[i], fragments[i], lines[i]});
    if (now || g_checks.size() > kMaxPendingChecks) take.swap(g_checks);
  }
  if (take.empty()) return;
  py::gil_scoped_acquire gil;
  cb().submit_checks(checks_to_py(take), now);
}

py::list take_checks() {
  std::vector<PendingCheck> take;
  {
    std::lock_guard<std::mutex> lk(g_checks_mu);
    take.swap(g_checks);
  }
  return checks_to_py(take);
}

std::string user_line() {
  py::gil_scoped_acquire gil;
  return cb().user_line().cast<std::string>();
}

void release_queued_locked_gil() {
  for (auto* o : take_releases()) Py_DECREF(o);
}

void incref(_object* o) {
  py::gil_scoped_acquire gil;
  Py_INCREF(o);
}

void decref(_object* o) {
  py::gil_scoped_acquire gil;
  Py_DECREF(o);
}

}  // namespace runtime
}  // namespace torchtpu
