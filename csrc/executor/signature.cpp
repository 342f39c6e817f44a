// The argument signature of an op call: the op table's key (see signature.h), and the schema facts it needs.
#include "executor/signature.h"

#include <c10/core/DefaultDtype.h>

#include <cmath>
#include <memory>
#include <unordered_map>

#include "core/device.h"
#include "core/storage.h"
#include "executor/sym.h"
#include "graph/graph.h"

namespace torchtpu {
namespace {

std::mutex g_ops_mu;
std::unordered_map<const c10::FunctionSchema*, std::unique_ptr<OpInfo>> g_ops;

bool is_number_type(const c10::TypePtr& t) { return t->kind() == c10::TypeKind::NumberType; }

// Ops whose `float` arguments (not only their Scalars) are runtime values: the fused optimizers, whose learning
// rate changes every step under a schedule (keyed by value, each step would lower and compile anew). Elsewhere
// a `float` is keyed by value, as rules written for plain floats expect.
bool floats_at_run_time(const std::string& name) {
  const std::string base = name.substr(0, name.find('.'));
  return base == "_fused_adam_" || base == "_fused_adamw_" || base == "_fused_sgd_";
}

OpInfo* op_info_slow(const c10::FunctionSchema* schema);

}  // namespace

OpInfo* op_info(const c10::OperatorHandle& op) {
  // the last few ops of this thread, without a lock (ops repeat: a chain, a layer)
  thread_local std::pair<const c10::FunctionSchema*, OpInfo*> recent[8] = {};
  thread_local unsigned next = 0;
  const c10::FunctionSchema* schema = &op.schema();
  for (const auto& r : recent) {
    if (r.first == schema) return r.second;
  }
  OpInfo* info = op_info_slow(schema);
  recent[next++ % 8] = {schema, info};
  return info;
}

namespace {

OpInfo* op_info_slow(const c10::FunctionSchema* schema) {
  std::lock_guard<std::mutex> lk(g_ops_mu);
  auto it = g_ops.find(schema);
  if (it != g_ops.end()) return it->second.get();
  auto info = std::make_unique<OpInfo>();
  info->name = runtime::op_name(*schema);
  info->nargs = schema->arguments().size();
  info->is_copy = info->name == "copy_";
  const bool runtime_floats = floats_at_run_time(info->name);
  for (const auto& a : schema->arguments()) {
    c10::TypePtr t = a.type();
    bool optional = false;
    if (t->kind() == c10::TypeKind::OptionalType) {
      t = t->expectRef<c10::OptionalType>().getElementType();
      optional = true;
    }
    ArgKind k = ArgKind::kOther;
    if (t->kind() == c10::TypeKind::TensorType) {
      k = ArgKind::kTensor;
    } else if (t->kind() == c10::TypeKind::ListType) {
      auto el = t->expectRef<c10::ListType>().getElementType();
      if (el->kind() == c10::TypeKind::TensorType) k = ArgKind::kTensorList;
      if (el->kind() == c10::TypeKind::OptionalType &&
          el->expectRef<c10::OptionalType>().getElementType()->kind() == c10::TypeKind::TensorType)
        k = ArgKind::kOptTensorList;
      if (is_number_type(el)) k = ArgKind::kNumberList;
    } else if (is_number_type(t) || (runtime_floats && t->kind() == c10::TypeKind::FloatType)) {
      k = ArgKind::kNumber;
    }
    (void)optional;
    info->kinds.push_back(k);
    info->written.push_back(a.alias_info() != nullptr && a.alias_info()->isWrite());
  }
  OpInfo* raw = info.get();
  g_ops.emplace(schema, std::move(info));
  return raw;
}

}  // namespace

std::vector<std::pair<std::string, int64_t>> op_counts() {
  std::vector<std::pair<std::string, int64_t>> out;
  std::lock_guard<std::mutex> lk(g_ops_mu);
  for (const auto& kv : g_ops) {
    if (kv.second->count > 0) out.emplace_back(kv.second->name, kv.second->count.load());
  }
  return out;
}

void reset_op_counts() {
  std::lock_guard<std::mutex> lk(g_ops_mu);
  for (auto& kv : g_ops) kv.second->count = 0;
}

// A row class's dim in the key: a negative size (no real size is), the class and capacity in it.
int64_t rows_code(int32_t cls, int64_t capacity) { return ~((static_cast<int64_t>(cls) << 40) | capacity); }

namespace {

enum Tag : uint8_t {
  kNone = 1,
  kBool,
  kInt,
  kDouble,
  kComplex,
  kString,
  kIntList,
  kDoubleList,
  kBoolList,
  kDevice,
  kGenerator,
  kTensorTag,
  kUndefined,
  kCpuScalar,
  kRuntime,
  kList,
  kStorageTag,
  kSymInt
};

// A Scalar value: 0, 1, -1 and non-finite values are part of the key (rules fold them into constants); any
// other value is a runtime parameter, keyed by its type only.
bool put_sym_int(Sig& s, int64_t v, ArgPath path) {
  const int64_t code = s.sym_ints ? int_form(v, s.sym) : 0;
  if (code == 0) return false;
  put<uint8_t>(s.key, kSymInt);
  put<int64_t>(s.key, code);
  put<int64_t>(s.key, s.sym_cap);  // the entry's results are laid out at the capacity
  s.sym_forms.push_back({path, -1, code});
  return true;
}

void put_number(Sig& s, const c10::IValue& v, ArgPath path) {
  if (v.isInt() && put_sym_int(s, v.toInt(), path)) return;
  double d;
  if (v.isDouble()) {
    d = v.toDouble();
  } else if (v.isInt()) {
    d = static_cast<double>(v.toInt());
  } else if (v.isBool()) {
    put<uint8_t>(s.key, kBool);
    put<uint8_t>(s.key, v.toBool());
    return;
  } else if (v.isComplexDouble()) {
    auto c = v.toComplexDouble();
    if (c.imag() == 0 && (c.real() == 0 || c.real() == 1 || c.real() == -1)) {
      put<uint8_t>(s.key, kComplex);
      put<double>(s.key, c.real());
      return;
    }
    put<uint8_t>(s.key, kRuntime);
    put<uint8_t>(s.key, kComplex);
    s.runtime_slots.push_back(path);
    return;
  } else if (v.isNone()) {
    put<uint8_t>(s.key, kNone);
    return;
  } else {
    s.python = true;
    return;
  }
  if (d == 0 || d == 1 || d == -1 || !std::isfinite(d)) {
    put<uint8_t>(s.key, v.isDouble() ? kDouble : kInt);
    put<double>(s.key, d);
    return;
  }
  put<uint8_t>(s.key, kRuntime);
  put<uint8_t>(s.key, v.isDouble() ? kDouble : kInt);
  s.runtime_slots.push_back(path);
}

}  // namespace

int32_t rows_dim(const at::Tensor& t, c10::StorageImpl* st) {
  StorageHandle* h = handle_of(st);
  if (h == nullptr || h->rows < 2 || h->row_bytes <= 0) return -1;
  const int64_t es = static_cast<int64_t>(t.element_size());
  if (h->row_bytes % es != 0 || static_cast<int64_t>(st->nbytes()) / h->row_bytes < h->rows) return -1;
  const int64_t row = h->row_bytes / es;
  int32_t d = -1;
  int64_t span = t.storage_offset();
  const auto sizes = t.sizes();
  const auto strides = t.strides();
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 0 || strides[i] < 0) return -1;
    if (d < 0 && sizes[i] == h->rows && strides[i] == row) {
      d = static_cast<int32_t>(i);
    } else {
      span += (sizes[i] - 1) * strides[i];
    }
  }
  return d >= 0 && span < row ? d : -1;
}

namespace {

void put_tensor(Sig& s, const at::Tensor& t, bool written = false, ArgPath path = {-1, -1}) {
  if (!t.defined()) {
    put<uint8_t>(s.key, kUndefined);
    return;
  }
  const auto dev = t.device();
  if (dev.is_cpu()) {
    // a 0-d CPU tensor read by the op is a scalar (as on cuda): its value is a runtime parameter
    if (t.dim() != 0 || written) {
      s.python = true;
      return;
    }
    put<uint8_t>(s.key, kCpuScalar);
    put<int8_t>(s.key, static_cast<int8_t>(t.scalar_type()));
    put<uint8_t>(s.key, t.unsafeGetTensorImpl()->is_wrapped_number());
    // Python sees a wrapped number (x * 2.5) as a plain number: tell it that the value is a runtime one, unless
    // it is 0, 1, -1 or not finite, which the key holds (as for Scalar arguments)
    if (t.unsafeGetTensorImpl()->is_wrapped_number()) {
      if (t.is_complex()) {
        s.runtime_slots.push_back(path);
        return;
      }
      const double d = t.item<double>();
      if (d == 0 || d == 1 || d == -1 || !std::isfinite(d)) {
        put<double>(s.key, d);
      } else {
        s.runtime_slots.push_back(path);
      }
    }
    return;
  }
  if (!dev.is_privateuseone()) {
    s.python = true;
    return;
  }
  if (s.device < 0) {
    s.device = dev.index();
  } else if (s.device != dev.index()) {
    s.python = true;  // two tpu devices: the Python kernel raises cuda's error
    return;
  }
  put<uint8_t>(s.key, kTensorTag);
  put<int8_t>(s.key, static_cast<int8_t>(t.scalar_type()));
  put<uint8_t>(s.key, static_cast<uint8_t>(t.is_conj() | (t.is_neg() << 1)));
  const auto sizes = t.sizes();
  const auto strides = t.strides();
  c10::StorageImpl* st = t.storage().unsafeGetStorageImpl();
  const int32_t rdim = s.bucketing && path.arg >= 0 ? rows_dim(t, st) : -1;
  if (path.arg >= 0) ++s.tensors;
  put<int32_t>(s.key, static_cast<int32_t>(sizes.size()));
  if (s.sym >= 0 && path.arg >= 0) {
    StorageHandle* h = handle_of(st);
    if (h != nullptr && h->sym == s.sym && h->sym_cap == s.sym_cap) {  // each value: static, or a form of L
      const int32_t nd = static_cast<int32_t>(sizes.size());
      // the storage's compact tensor itself: its sizes and strides are the storage's codes
      bool whole = t.storage_offset() == 0 && h->sym_shape.size() == sizes.size();
      c10::SmallVector<bool, 6> ok;
      c10::SmallVector<int64_t, 6> cstrides;
      if (whole) {
        cstrides = sym_strides(h->sym_shape, &ok);
        for (int32_t i = 0; i < nd && whole; ++i) {
          whole = sym_value(h->sym_shape[i], s.sym) == sizes[i] &&
                  (sizes[i] == 1 || sym_value(cstrides[i], s.sym) == strides[i]);
        }
      }
      // known: 0 guesses, 1 keeps the value static, a negative code is taken as it is. A view's values are first
      // read by the storage dims they walk (view_forms: 32 = 4 * 8 of a (2, L, 4, 8) storage is static at L = 32),
      // then looked up among the storage's own sizes and strides (a static size stays static: 96 is not 4L at
      // L = 24), then taken for a form of L (sym_classify)
      c10::SmallVector<int64_t, 13> vf;
      if (!whole) {
        cstrides = sym_strides(h->sym_shape, &ok);
        vf = view_forms(h->sym_shape, s.sym, sizes, strides, t.storage_offset());
      }
      auto guess = [&](int64_t v) -> int64_t {
        if (v < s.sym - 1) return 0;
        for (int64_t c : h->sym_shape) {
          if (c >= 0 && c == v) return 0;
        }
        for (int64_t c : h->sym_shape) {
          if (c < 0 && sym_value(c, s.sym) == v) return c;
        }
        for (size_t d = 0; d < cstrides.size(); ++d) {
          if (ok[d] && cstrides[d] < 0 && sym_value(cstrides[d], s.sym) == v) return cstrides[d];
        }
        // a static size times L, then times L^2 (96L of a (2L, 96) storage's view, not 4L^2 at L = 24)
        for (int p = 1; p <= 2; ++p) {
          const int64_t lp = p == 1 ? s.sym : s.sym * s.sym;
          for (int64_t c : h->sym_shape) {
            if (c > 1 && v == c * lp) return sym_code(c, 0, p);
          }
        }
        return sym_classify(v, s.sym);
      };
      auto put_value = [&](int64_t v, int32_t slot, int64_t known) {
        const int64_t code = known < 0 ? known : known == 1 ? 0 : guess(v);
        if (code < 0) s.sym_forms.push_back({path, slot, code});
        put<int64_t>(s.key, code < 0 ? code : v);
      };
      for (int32_t i = 0; i < nd; ++i) {
        put_value(sizes[i], i, whole ? (h->sym_shape[i] < 0 ? h->sym_shape[i] : 1) : vf[i]);
        put_value(strides[i], nd + i, whole ? (ok[i] && cstrides[i] < 0 ? cstrides[i] : 1) : vf[nd + i]);
      }
      put_value(t.storage_offset(), 2 * nd, whole ? 1 : vf[2 * nd]);
      int32_t k = -1;
      for (size_t i = 0; i < s.storages.size() && k < 0; ++i) {
        if (s.storages[i] == st) k = static_cast<int32_t>(i);
      }
      if (k < 0) {
        k = static_cast<int32_t>(s.storages.size());
        s.storages.push_back(st);
      }
      put<int32_t>(s.key, k);
      return;
    }
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (static_cast<int32_t>(i) == rdim) {
      StorageHandle* h = handle_of(st);
      const int64_t capacity = static_cast<int64_t>(st->nbytes()) / h->row_bytes;
      int32_t cls = 0;
      while (cls < static_cast<int32_t>(s.rows.size()) && s.rows[cls] != h->rows) ++cls;
      if (cls == static_cast<int32_t>(s.rows.size())) {
        s.rows.push_back(h->rows);
        s.capacity.push_back(capacity);
      }
      s.bucketed.push_back({path, rdim, cls, capacity});
      put<int64_t>(s.key, rows_code(cls, capacity));
    } else {
      if (s.bucketing && rdim < 0 && strides[i] == 0 && sizes[i] >= 2 && path.arg >= 0) {
        s.broadcast.push_back({s.key.size(), path, static_cast<int32_t>(i), sizes[i]});
      }
      put<int64_t>(s.key, sizes[i]);
    }
    put<int64_t>(s.key, strides[i]);
  }
  put<int64_t>(s.key, t.storage_offset());
  int32_t k = -1;
  for (size_t i = 0; i < s.storages.size(); ++i) {
    if (s.storages[i] == st) {
      k = static_cast<int32_t>(i);
      break;
    }
  }
  if (k < 0) {
    k = static_cast<int32_t>(s.storages.size());
    s.storages.push_back(st);
  }
  put<int32_t>(s.key, k);
}

void put_other(Sig& s, const c10::IValue& v, ArgPath path = {-1, -1}) {
  if (v.isNone()) {
    put<uint8_t>(s.key, kNone);
  } else if (v.isBool()) {
    put<uint8_t>(s.key, kBool);
    put<uint8_t>(s.key, v.toBool());
  } else if (v.isInt()) {
    put<uint8_t>(s.key, kInt);
    put<int64_t>(s.key, v.toInt());
  } else if (v.isDouble()) {
    put<uint8_t>(s.key, kDouble);
    put<double>(s.key, v.toDouble());
  } else if (v.isString()) {
    put<uint8_t>(s.key, kString);
    const auto& str = v.toStringRef();
    put<uint32_t>(s.key, static_cast<uint32_t>(str.size()));
    s.key += str;
  } else if (v.isIntList()) {
    put<uint8_t>(s.key, kIntList);
    const auto l = v.toIntList();
    put<uint32_t>(s.key, static_cast<uint32_t>(l.size()));
    for (size_t j = 0; j < l.size(); ++j) {
      if (path.arg < 0 || !put_sym_int(s, l.get(j), {path.arg, static_cast<int32_t>(j)})) put<int64_t>(s.key, l.get(j));
    }
  } else if (v.isDoubleList()) {
    put<uint8_t>(s.key, kDoubleList);
    const auto l = v.toDoubleList();
    put<uint32_t>(s.key, static_cast<uint32_t>(l.size()));
    for (double x : l) put<double>(s.key, x);
  } else if (v.isBoolList()) {
    put<uint8_t>(s.key, kBoolList);
    const auto l = v.toBoolList();
    put<uint32_t>(s.key, static_cast<uint32_t>(l.size()));
    for (bool x : l) put<uint8_t>(s.key, x);
  } else if (v.isDevice()) {
    put<uint8_t>(s.key, kDevice);
    put<int8_t>(s.key, static_cast<int8_t>(v.toDevice().type()));
    put<int8_t>(s.key, v.toDevice().index());
  } else if (v.isGenerator()) {
    put<uint8_t>(s.key, kGenerator);
  } else if (v.isTensor()) {
    put_tensor(s, v.toTensor());
  } else {
    s.python = true;
  }
}

// The call's varying inner size: the one L of its tensors' storages that have one (none when two differ, or a
// tensor walks bucketed rows: those are keyed as rows). The caller holds exec_mutex().
void find_sym(const OpInfo& info, const torch::jit::Stack& stack, size_t base, Sig& s) {
  bool conflict = false, any_tensor = false;
  auto see = [&](const c10::IValue& v) {
    if (!v.isTensor()) return;
    const at::Tensor& t = v.toTensor();
    if (!t.defined()) return;
    any_tensor = true;
    if (!t.device().is_privateuseone()) return;
    StorageHandle* h = handle_of(t.storage());
    if (h == nullptr) return;
    if (h->rows >= 2) conflict = true;
    if (h->sym < 0) return;
    if (s.sym < 0) {
      s.sym = h->sym;
      s.sym_cap = h->sym_cap;
    } else if (s.sym != h->sym || s.sym_cap != h->sym_cap) {
      conflict = true;
    }
  };
  for (size_t i = 0; i < info.nargs && !conflict; ++i) {
    const c10::IValue& v = stack[base + i];
    if (info.kinds[i] == ArgKind::kTensor) {
      see(v);
    } else if ((info.kinds[i] == ArgKind::kTensorList || info.kinds[i] == ArgKind::kOptTensorList) && !v.isNone()) {
      for (const auto& e : v.toListRef()) see(e);
    }
  }
  if (conflict) {
    s.sym = -1;
    s.sym_cap = 0;
    return;
  }
  if (s.sym < 0 && !any_tensor && g_current_sym.load(std::memory_order_relaxed) >= 0) {
    s.sym = g_current_sym.load();
    s.sym_cap = g_current_sym_cap.load();
    s.sym_ints = s.sym_cap >= kSymMinCapacity;
    if (!s.sym_ints) s.sym = -1;
  }
}

}  // namespace

void build_sig(const OpInfo& info, const torch::jit::Stack& stack, Sig& s) {
  s.key.clear();
  s.storages.clear();
  s.runtime_slots.clear();
  s.device = -1;
  s.python = false;
  s.bucketed.clear();
  s.rows.clear();
  s.capacity.clear();
  s.broadcast.clear();
  s.tensors = 0;
  s.sym = -1;
  s.sym_cap = 0;
  s.sym_ints = false;
  s.sym_forms.clear();
  put<const void*>(s.key, &info);
  const size_t base = stack.size() - info.nargs;
  if (s.bucketing) find_sym(info, stack, base, s);
  c10::DeviceIndex device_arg = -1;
  for (size_t i = 0; i < info.nargs; ++i) {
    const c10::IValue& v = stack[base + i];
    const ArgPath path{static_cast<int32_t>(i), -1};
    switch (info.kinds[i]) {
      case ArgKind::kTensor:
        if (v.isNone()) {
          put<uint8_t>(s.key, kNone);
        } else {
          put_tensor(s, v.toTensor(), info.written[i], path);
        }
        break;
      case ArgKind::kTensorList: {
        if (v.isNone()) {
          put<uint8_t>(s.key, kNone);
          break;
        }
        put<uint8_t>(s.key, kList);
        const auto l = v.toTensorList();
        put<uint32_t>(s.key, static_cast<uint32_t>(l.size()));
        for (size_t j = 0; j < l.size(); ++j) {
          put_tensor(s, l.get(j), info.written[i], {static_cast<int32_t>(i), static_cast<int32_t>(j)});
        }
        break;
      }
      case ArgKind::kOptTensorList: {
        put<uint8_t>(s.key, kList);
        const auto l = v.toListRef();
        put<uint32_t>(s.key, static_cast<uint32_t>(l.size()));
        for (size_t j = 0; j < l.size(); ++j) {
          if (l[j].isNone()) {
            put<uint8_t>(s.key, kNone);
          } else {
            put_tensor(s, l[j].toTensor(), false, {static_cast<int32_t>(i), static_cast<int32_t>(j)});
          }
        }
        break;
      }
      case ArgKind::kNumber: put_number(s, v, path); break;
      case ArgKind::kNumberList: {
        if (v.isNone()) {
          put<uint8_t>(s.key, kNone);
          break;
        }
        put<uint8_t>(s.key, kList);
        const auto l = v.toListRef();
        put<uint32_t>(s.key, static_cast<uint32_t>(l.size()));
        for (size_t j = 0; j < l.size(); ++j) put_number(s, l[j], {static_cast<int32_t>(i), static_cast<int32_t>(j)});
        break;
      }
      default:
        if (v.isDevice() && v.toDevice().is_privateuseone()) {
          device_arg = v.toDevice().has_index() ? v.toDevice().index() : current_device();
        }
        put_other(s, v, path);
    }
    if (s.python) return;
  }
  for (size_t k = 0; k < s.broadcast.size(); ++k) {  // an expanded tensor over a class's rows is keyed as those rows
    const auto& b = s.broadcast[k];
    bool taken = false;  // one dim per tensor: its first over a class's rows
    for (size_t j = 0; j < k && !taken; ++j) {
      taken = s.broadcast[j].path.arg == b.path.arg && s.broadcast[j].path.elem == b.path.elem &&
              s.broadcast[j].offset == SIZE_MAX;
    }
    int32_t expanded = 0;  // tensors with a stride-0 dim of this size
    for (size_t j = 0; j < s.broadcast.size() && s.rows.empty() && !taken; ++j) {
      bool first = s.broadcast[j].size == b.size;
      for (size_t i = 0; i < j && first; ++i) {
        first = !(s.broadcast[i].size == b.size && s.broadcast[i].path.arg == s.broadcast[j].path.arg &&
                  s.broadcast[i].path.elem == s.broadcast[j].path.elem);
      }
      expanded += first;
    }
    // no bucketed tensor, and every tensor expanded along a count of a recent bucketed storage (not a coincidence
    // next to exact tensors of that size)
    if (s.rows.empty() && !taken && expanded == s.tensors) {
      const int64_t capacity = recent_rows().capacity_of(b.size);
      if (capacity > b.size) {
        s.rows.push_back(b.size);
        s.capacity.push_back(capacity);
      }
    }
    for (size_t cls = 0; cls < s.rows.size() && !taken; ++cls) {
      if (s.rows[cls] != b.size) continue;
      const int64_t code = rows_code(static_cast<int32_t>(cls), s.capacity[cls]);
      std::memcpy(&s.key[b.offset], &code, sizeof(code));
      s.bucketed.push_back({b.path, b.dim, static_cast<int32_t>(cls), s.capacity[cls]});
      s.broadcast[k].offset = SIZE_MAX;  // marks the tensor as taken
      break;
    }
  }
  if (!s.sym_forms.empty()) put<int64_t>(s.key, s.sym_cap);  // (tensors' storages say it too; a factory's not)
  if (s.device < 0) s.device = device_arg >= 0 ? device_arg : current_device();
  put<int8_t>(s.key, s.device);
  // factories and type promotion with dtype=None follow torch.get_default_dtype()
  put<int8_t>(s.key, static_cast<int8_t>(c10::typeMetaToScalarType(c10::get_default_dtype())));
  // Each distinct storage: its size and the type of the value it holds.
  for (auto* st : s.storages) {
    put<uint8_t>(s.key, kStorageTag);
    put<uint64_t>(s.key, st->nbytes());
    StorageHandle* h = handle_of(st);
    ValueType vt;
    if (h != nullptr && value_type(h, &vt)) {
      put<int8_t>(s.key, static_cast<int8_t>(vt.dtype));
      put<uint8_t>(s.key, static_cast<uint8_t>(vt.shape.size()));
      for (auto d : vt.shape) put<int64_t>(s.key, d);
    } else {
      put<int8_t>(s.key, -1);
      if (h != nullptr && h->state == StorageHandle::State::kFailed) {
        TORCH_CHECK(false, *h->error);
      }
    }
  }
}

}  // namespace torchtpu
