// The boxed kernel of every op with a lowering rule: signature -> table -> record (and launch).
#include <ATen/EmptyTensor.h>
#include <ATen/ExpandUtils.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/op_registration/op_registration.h>
#include <c10/core/DefaultDtype.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "core/allocator.h"
#include "core/device.h"
#include "core/generator.h"
#include "core/storage.h"
#include "executor/entry.h"
#include "executor/executor.h"
#include "executor/signature.h"
#include "executor/sym.h"
#include "graph/fragment.h"
#include "graph/graph.h"
#include "runtime/runtime.h"

namespace torchtpu {
namespace {

std::atomic<int> g_mode{static_cast<int>(Mode::kStrict)};

// -- the op table --------------------------------------------------------------------------------------------
struct TableSlot {
  Entry generic;  // used when value_slots is empty
  std::unordered_map<std::string, Entry> by_value;
};
std::unordered_map<std::string, TableSlot> g_table;
std::atomic<int64_t> g_ops_total{0}, g_hits{0}, g_misses{0}, g_python{0}, g_specializations{0};
std::atomic<int64_t> g_bucket_exact{0};  // bucketed signatures run at their exact sizes (the rules declined)

const c10::IValue& arg_at(const torch::jit::Stack& stack, size_t base, ArgPath p) {
  const c10::IValue& v = stack[base + p.arg];
  if (p.elem < 0) return v;
  return v.toListRef()[p.elem];
}

std::string value_key(const std::vector<ArgPath>& slots, const torch::jit::Stack& stack, size_t base) {
  std::string k;
  for (const auto& p : slots) {
    const auto& v = arg_at(stack, base, p);
    if (v.isDouble()) {
      put<double>(k, v.toDouble());
    } else if (v.isInt()) {
      put<int64_t>(k, v.toInt());
    } else if (v.isComplexDouble()) {
      put<double>(k, v.toComplexDouble().real());
      put<double>(k, v.toComplexDouble().imag());
    } else if (v.isBool()) {
      put<uint8_t>(k, v.toBool());
    } else if (v.isTensor()) {  // a 0-d CPU tensor
      put<double>(k, v.toTensor().item<double>());
    }
  }
  return k;
}

Entry lower(const c10::OperatorHandle& op, const OpInfo& info, const torch::jit::Stack& stack, const Sig& sig) {
  runtime::LowerRequest req;
  req.op = &op;
  req.stack = &stack;
  req.nargs = info.nargs;
  req.device = sig.device;
  req.runtime_slots = sig.runtime_slots;
  req.bucketed = sig.bucketed;
  req.rows = sig.rows;
  if (!sig.sym_forms.empty()) {
    req.sym = sig.sym;
    req.sym_cap = sig.sym_cap;
    req.sym_forms = sig.sym_forms;
  }
  // sig.key starts with the OpInfo's address, which only this process knows
  req.key = info.name + '\0' + sig.key.substr(sizeof(const void*));
  {
    std::lock_guard<std::recursive_mutex> lk(exec_mutex());
    for (auto* st : sig.storages) {
      req.storage_tokens.push_back(reinterpret_cast<uint64_t>(st->data_ptr().get()));
      StorageHandle* h = handle_of(st);
      ValueType vt;
      const bool has = h != nullptr && value_type(h, &vt);
      req.storage_types.push_back(vt);
      req.storage_has_value.push_back(has);
    }
  }
  g_misses += 1;
  return runtime::lower_op(req);
}

// -- running an entry ---------------------------------------------------------------------------------------
void pack_scalar(const Fragment& f, size_t s, const ScalarSource& src, const Sig& sig, const torch::jit::Stack& stack,
                 size_t base, c10::DeviceIndex device, Node& node) {
  const ScalarKind kind = f.scalars[s].kind;
  if (src.kind == SourceKind::kSym) {
    node.iscalars.push_back(sig.sym);
    return;
  }
  if (src.kind == SourceKind::kRows) {
    node.iscalars.push_back(sig.rows.at(src.path.arg));
    return;
  }
  if (src.kind == SourceKind::kRng) {
    c10::optional<at::Generator> gen;
    if (src.path.arg >= 0) {
      const auto& v = stack[base + src.path.arg];
      if (!v.isNone()) gen = v.toGenerator();
    }
    const at::Generator& g = gen.has_value() ? *gen : default_generator(device);
    auto so = g.get<TpuGeneratorImpl>()->philox_advance(static_cast<uint64_t>(src.increment));
    node.iscalars.push_back(static_cast<int64_t>(so.first));
    node.iscalars.push_back(static_cast<int64_t>(so.second));
    return;
  }
  c10::Scalar value;
  const c10::IValue& v = arg_at(stack, base, src.path);
  if (src.kind == SourceKind::kCpuTensor || v.isTensor()) {
    value = v.toTensor().item();
  } else {
    value = v.toScalar();
  }
  switch (kind) {
    case ScalarKind::kFloat: node.fscalars.push_back(value.toDouble()); break;
    case ScalarKind::kComplex: {
      auto c = value.toComplexDouble();
      node.fscalars.push_back(c.real());
      node.fscalars.push_back(c.imag());
      break;
    }
    case ScalarKind::kInt:
      // uint64 values travel as their bits (the program bitcasts them back)
      node.iscalars.push_back(value.type() == c10::ScalarType::UInt64 ? static_cast<int64_t>(value.toUInt64())
                                                                      : value.toLong());
      break;
    case ScalarKind::kBool: node.iscalars.push_back(value.toBool() ? 1 : 0); break;
    default: TORCH_INTERNAL_ASSERT(false, "tpu: a random-number state bound to an argument");
  }
}

// A new output; one following a row class gets the capacity's storage, the valid rows' sizes and a bucketed
// storage (the caller holds exec_mutex()).
at::Tensor new_output(const OutputSpec& o, c10::DeviceIndex device, const Sig& sig) {
  const c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, device));
  if (!o.sym_sizes.empty()) return sym_tensor(o.sym_sizes, sig.sym, sig.sym_cap, o.dtype);
  at::Tensor t = at::detail::empty_strided_generic(o.sizes, o.strides, tpu_allocator(), kTpuKeys, o.dtype);
  if (o.rows_class >= 0) {
    const int64_t n = sig.rows.at(o.rows_class);
    c10::SmallVector<int64_t, 6> sizes(o.sizes.begin(), o.sizes.end());
    sizes[o.rows_dim] = n;
    t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, o.strides);
    StorageHandle* h = handle_of(t.storage());
    if (h != nullptr) {
      h->rows = n;
      h->row_bytes = o.strides[o.rows_dim] * static_cast<int64_t>(c10::elementSize(o.dtype));
      recent_rows().note(n, o.sizes[o.rows_dim]);
    }
  }
  return t;
}

// Records the entry's node; the caller holds exec_mutex() (and must cut afterwards when this returns true).
bool record_entry(const Entry& e, const Sig& sig, torch::jit::Stack* stack, size_t base,
                  c10::SmallVector<at::Tensor, 2>& outs, const std::string& line) {
  const c10::DeviceIndex device = sig.device;
  for (const auto& rs : e.resizes) arg_at(*stack, base, rs.first).toTensor().resize_(rs.second);
  outs.resize(e.outputs.size());
  for (size_t j = 0; j < e.outputs.size(); ++j) {
    if (e.outputs[j].kind == OutputKind::kNew) outs[j] = new_output(e.outputs[j], device, sig);
  }
  bool want_cut = false;
  if (e.fragment >= 0) {
    const Fragment& f = fragment(e.fragment);
    auto node = new_node(e.fragment, device);
    for (size_t s = 0; s < e.scalar_params.size(); ++s) {
      pack_scalar(f, s, e.scalar_params[s], sig, *stack, base, device, *node);
    }
    node->line = line;
    for (int32_t k : e.storage_params) node->inputs.push_back(value_ref(handle_of(sig.storages[k]), f.label));
    for (size_t r = 0; r < e.results.size(); ++r) {
      const auto& t = e.results[r];
      StorageHandle* h = t.storage >= 0  ? handle_of(sig.storages[t.storage])
                         : t.output >= 0 ? handle_of(outs[t.output].storage())
                                         : handle_of(arg_at(*stack, base, t.arg).toTensor().storage());
      if (h != nullptr) h->set_pending(node, static_cast<int32_t>(r));
    }
    want_cut = record(node, get_mode() == Mode::kFused);
  }
  return want_cut;
}

void push_results(const Entry& e, const OpInfo& info, torch::jit::Stack* stack, size_t base,
                  c10::SmallVector<at::Tensor, 2>& outs) {
  c10::SmallVector<c10::IValue, 2> rets;
  for (size_t j = 0; j < e.outputs.size(); ++j) {
    const auto& o = e.outputs[j];
    if (o.kind == OutputKind::kNew) {
      rets.emplace_back(outs[j]);
    } else if (o.kind == OutputKind::kArg) {
      rets.push_back(arg_at(*stack, base, o.path));
    } else {
      rets.emplace_back(at::Tensor());
    }
  }
  torch::jit::drop(*stack, info.nargs);
  switch (e.returns) {
    case Returns::kSingle: stack->push_back(std::move(rets.at(0))); break;
    case Returns::kTuple:
      for (auto& r : rets) stack->push_back(std::move(r));
      break;
    case Returns::kList: {
      c10::List<at::Tensor> l;
      for (auto& r : rets) l.push_back(r.toTensor());
      stack->emplace_back(std::move(l));
      break;
    }
    case Returns::kNothing: break;
  }
}

// One op: signature -> table -> record -> (strict, debug) launch. The hit path takes exec_mutex once.
// The table's entry for this signature, or nullptr (the caller holds exec_mutex()).
const Entry* find_entry(const Sig& sig, const torch::jit::Stack& stack, size_t base) {
  auto it = g_table.find(sig.key);
  if (it == g_table.end()) return nullptr;
  TableSlot& slot = it->second;
  if (slot.generic.value_slots.empty()) return &slot.generic;
  auto vit = slot.by_value.find(value_key(slot.generic.value_slots, stack, base));
  return vit != slot.by_value.end() ? &vit->second : nullptr;
}

const Entry* lower_and_keep(const c10::OperatorHandle& op, const OpInfo& info, const torch::jit::Stack& stack,
                            size_t base, const Sig& sig) {
  const std::string key = sig.key;  // Python may run tpu ops (and reuse this thread's Sig) while lowering
  Entry e = lower(op, info, stack, sig);
  std::lock_guard<std::recursive_mutex> lk(exec_mutex());
  TableSlot& slot = g_table[key];
  if (e.value_slots.empty()) {
    slot.generic = std::move(e);
    return &slot.generic;
  }
  g_specializations += 1;
  slot.generic.value_slots = e.value_slots;
  auto vk = value_key(e.value_slots, stack, base);
  return &(slot.by_value[vk] = std::move(e));
}

void tpu_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet, torch::jit::Stack* stack) {
  OpInfo* info = op_info(op);
  info->count += 1;
  g_ops_total += 1;
  if (info->is_copy) {
    const size_t b = stack->size() - info->nargs;
    const at::Tensor& self = (*stack)[b].toTensor();
    const at::Tensor& src = (*stack)[b + 1].toTensor();
    if (self.device().is_privateuseone() && src.device().is_cpu() && self.numel() > 0 && src.dim() <= self.dim() &&
        at::is_expandable_to(src.sizes(), self.sizes())) {
      upload(self, src);
      at::Tensor out = self;
      torch::jit::drop(*stack, info->nargs);
      stack->emplace_back(std::move(out));
      return;
    }
  }
  thread_local Sig sig;  // reused: its buffers keep their capacity
  const size_t base = stack->size() - info->nargs;
  const Mode mode = get_mode();
  const Entry* entry = nullptr;
  c10::SmallVector<at::Tensor, 2> outs;
  bool bucketing = g_eager_buckets.load(std::memory_order_relaxed);
  sig.bucketing = bucketing;
  {
    std::unique_lock<std::recursive_mutex> lk(exec_mutex());
    build_sig(*info, *stack, sig);
    if (sig.python) {
      lk.unlock();
      g_python += 1;
      runtime::run_python_kernel(op, stack);
      return;
    }
    entry = find_entry(sig, *stack, base);
    if (entry != nullptr && entry->kind == EntryKind::kExact) {  // the rules keep these sizes exact: key them so
      g_bucket_exact += 1;
      sig.bucketing = bucketing = false;
      build_sig(*info, *stack, sig);
      entry = find_entry(sig, *stack, base);
    }
    if (entry != nullptr && entry->kind == EntryKind::kProgram && !entry->capture_line && mode != Mode::kDebug) {
      // the hot path: record without leaving the lock, then launch (strict) or return (fused)
      g_hits += 1;
      const bool want_cut = record_entry(*entry, sig, stack, base, outs, std::string());
      const c10::DeviceIndex device = sig.device;
      lk.unlock();
      if (entry->fragment >= 0) after_record(device, mode, want_cut);
      push_results(*entry, *info, stack, base, outs);
      return;
    }
  }
  if (entry == nullptr) {
    entry = lower_and_keep(op, *info, *stack, base, sig);
    if (entry->kind == EntryKind::kExact) {
      g_bucket_exact += 1;
      {
        std::lock_guard<std::recursive_mutex> lk(exec_mutex());
        sig.bucketing = bucketing = false;
        build_sig(*info, *stack, sig);
        entry = find_entry(sig, *stack, base);
      }
      if (entry == nullptr) entry = lower_and_keep(op, *info, *stack, base, sig);
      TORCH_INTERNAL_ASSERT(entry->kind != EntryKind::kExact, "tpu: an exact signature lowered as bucketed");
    }
  } else {
    g_hits += 1;
  }
  if (entry->kind == EntryKind::kPython) {
    g_python += 1;
    runtime::run_python_kernel(op, stack);
    return;
  }
  // a fresh entry, a checked op (its Python line is captured) or debug mode
  const std::string line = entry->capture_line || mode == Mode::kDebug ? runtime::user_line() : std::string();
  bool want_cut;
  {
    std::lock_guard<std::recursive_mutex> lk(exec_mutex());
    // the storages' values may have moved on while Python ran (which may have reused this thread's Sig): the
    // signature again, bucketed as the entry was chosen
    sig.bucketing = bucketing;
    build_sig(*info, *stack, sig);
    want_cut = record_entry(*entry, sig, stack, base, outs, line);
  }
  const c10::DeviceIndex device = sig.device;
  if (entry->fragment >= 0) after_record(device, mode, want_cut);
  push_results(*entry, *info, stack, base, outs);
}

std::unique_ptr<torch::Library> g_lib;
std::vector<std::unique_ptr<torch::Library>> g_other_libs;

}  // namespace

void set_mode(Mode m) { g_mode = static_cast<int>(m); }
Mode get_mode() { return static_cast<Mode>(g_mode.load()); }

void register_kernels(const std::vector<std::string>& names) {
  if (!g_lib) {
    g_lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__,
                                             __LINE__);
  }
  for (const auto& n : names) {
    const auto sep = n.find("::");
    if (sep == std::string::npos) {
      g_lib->impl(n.c_str(), torch::CppFunction::makeFromBoxedFunction<&tpu_kernel>());
      continue;
    }
    // an op of another namespace (torchtpu.jax_op's): one IMPL library per op, kept for the process
    g_other_libs.push_back(std::make_unique<torch::Library>(torch::Library::IMPL, n.substr(0, sep),
                                                            c10::DispatchKey::PrivateUse1, __FILE__, __LINE__));
    g_other_libs.back()->impl(n.substr(sep + 2).c_str(), torch::CppFunction::makeFromBoxedFunction<&tpu_kernel>());
  }
}

void record_fragment(int32_t fid, const std::vector<at::Tensor>& storage_params, const std::vector<double>& fs,
                     const std::vector<int64_t>& is, const std::vector<at::Tensor>& results, const std::string& line) {
  const Fragment& f = fragment(fid);
  TORCH_CHECK(storage_params.size() == f.params.size() && results.size() == f.results.size(),
              "tpu: record_fragment: ", f.label, " takes ", f.params.size(), " storages and gives ", f.results.size(),
              " results");
  c10::DeviceIndex device = current_device();
  for (const auto& t : storage_params) device = t.device().index();
  for (const auto& t : results) {
    if (t.defined()) device = t.device().index();
  }
  auto node = new_node(fid, device);
  node->fscalars.assign(fs.begin(), fs.end());
  node->iscalars.assign(is.begin(), is.end());
  node->line = line;
  bool want_cut;
  {
    std::lock_guard<std::recursive_mutex> lk(exec_mutex());
    for (const auto& t : storage_params) {
      StorageHandle* h = handle_of(t.storage());
      TORCH_INTERNAL_ASSERT(h != nullptr, "tpu: a fragment reads a zero-byte storage");
      node->inputs.push_back(value_ref(h, f.label));
    }
    for (size_t r = 0; r < results.size(); ++r) {
      if (!results[r].defined()) continue;
      StorageHandle* h = handle_of(results[r].storage());
      if (h != nullptr) h->set_pending(node, static_cast<int32_t>(r));
    }
    want_cut = record(node, get_mode() == Mode::kFused);
  }
  after_record(device, get_mode(), want_cut);
}

_object* storage_buffer(const at::Tensor& t, int cause) {
  StorageHandle* h = handle_of(t.storage());
  if (h == nullptr) return nullptr;
  NodePtr target;
  {
    std::lock_guard<std::recursive_mutex> lk(exec_mutex());
    h->resolve();
    if (h->state == StorageHandle::State::kPending) target = h->node;
  }
  // A host read is a cut point: what it needs launches first, the rest right after (or alone, when the value is
  // there already), so the steps of a loop are cut alike whatever the repeated-structure rule did before.
  if (cause != static_cast<int>(CutCause::kCollective)) note_host_read(h->device);
  if (cause == static_cast<int>(CutCause::kHostRead)) count_host_read();  // a period of the upload sources' ranks
  if (target) {
    cut_for_read(h->device, target.get(), static_cast<CutCause>(cause));
  } else if (get_mode() == Mode::kFused) {
    cut(h->device, static_cast<CutCause>(cause));
  }
  std::lock_guard<std::recursive_mutex> lk(exec_mutex());
  h->resolve();
  switch (h->state) {
    case StorageHandle::State::kBuffer: runtime::incref(h->buffer->array); return h->buffer->array;
    case StorageHandle::State::kFailed: TORCH_CHECK(false, *h->error);
    case StorageHandle::State::kPending:
      TORCH_INTERNAL_ASSERT(false, "tpu: a storage is still pending after its device's graph was launched");
    default: return nullptr;
  }
}

void set_storage_buffer(const at::Tensor& t, _object* array, at::ScalarType dtype, const std::vector<int64_t>& shape) {
  StorageHandle* h = handle_of(t.storage());
  TORCH_INTERNAL_ASSERT(h != nullptr, "tpu: set_storage_buffer on a zero-byte storage");
  ValueType vt;
  vt.dtype = dtype;
  vt.shape.assign(shape.begin(), shape.end());
  auto b = c10::make_intrusive<DeviceBuffer>(array, std::move(vt), h->device);
  std::lock_guard<std::recursive_mutex> lk(exec_mutex());
  h->set_buffer(std::move(b));
}

bool storage_value_type(const at::Tensor& t, std::vector<int64_t>* shape, at::ScalarType* dtype) {
  StorageHandle* h = handle_of(t.storage());
  if (h == nullptr) return false;
  std::lock_guard<std::recursive_mutex> lk(exec_mutex());
  ValueType vt;
  if (!value_type(h, &vt)) {
    TORCH_CHECK(h->state != StorageHandle::State::kFailed, *h->error);
    return false;
  }
  shape->assign(vt.shape.begin(), vt.shape.end());
  *dtype = vt.dtype;
  return true;
}

void synchronize(int64_t device, int cause) {
  const auto c = static_cast<CutCause>(cause);
  if (device < 0) {
    cut_all(c);
    for (int d = 0; d < device_count(); ++d) wait_device(static_cast<c10::DeviceIndex>(d));
  } else {
    cut(static_cast<c10::DeviceIndex>(device), c);
    wait_device(static_cast<c10::DeviceIndex>(device));
  }
}

ExecCounters exec_counters() {
  ExecCounters c;
  c.ops = g_ops_total;
  c.hits = g_hits;
  c.misses = g_misses;
  c.python_kernels = g_python;
  c.specializations = g_specializations;
  c.entries = static_cast<int64_t>(g_table.size());
  c.bucket_exact = g_bucket_exact;
  c.upload_rows = g_upload_rows;
  c.upload_sym = g_upload_sym;
  return c;
}

void reset_counters() {
  g_ops_total = g_hits = g_misses = g_python = g_specializations = g_bucket_exact = 0;
  g_upload_rows = g_upload_sym = 0;
  reset_op_counts();
  auto& gc = graph_counters();
  gc.chunks = gc.chunk_ops = gc.chunk_ops_max = gc.chunk_cache_hits = gc.chunk_cache_misses = 0;
  gc.chunk_cache_evictions = 0;
  gc.donated_buffers = gc.donated_bytes = gc.failed_chunks = gc.dead_ops = gc.h2d_transfers = gc.h2d_bytes = 0;
  for (auto& c : gc.cuts) c = 0;
}

}  // namespace torchtpu
