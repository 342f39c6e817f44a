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
#include "executor/sym.h"
#include "graph/fragment.h"
#include "graph/graph.h"
#include "runtime/runtime.h"

namespace torchtpu {
namespace {

std::atomic<int> g_mode{static_cast<int>(Mode::kStrict)};
constexpr c10::DispatchKeySet kTpuKeys{c10::DispatchKey::PrivateUse1};

// -- per-op schema facts, computed once ------------------------------------------------------------------------
enum class ArgKind : uint8_t { kTensor, kTensorList, kOptTensorList, kNumber, kNumberList, kOther };

struct OpInfo {
  std::string name;  // overload name as the rules know it, e.g. "add.Tensor"
  bool is_copy = false;  // copy_: host -> tpu copies take the upload path
  std::vector<ArgKind> kinds;
  std::vector<bool> written;  // the op writes the argument (in-place self, out=)
  size_t nargs = 0;
  std::atomic<int64_t> count{0};
};

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
namespace {

// -- the argument signature ---------------------------------------------------------------------------------
struct Sig {
  std::string key;
  std::vector<c10::StorageImpl*> storages;  // distinct argument storages, in order of first appearance
  std::vector<ArgPath> runtime_slots;       // Scalar arguments passed as runtime values
  c10::DeviceIndex device = -1;
  bool python = false;                      // something the C++ path does not take: the Python kernel runs
  // bucketed rows: a tensor walking the valid rows of a bucketed storage is keyed by its capacity, its row count
  // is a runtime value of its row class (tensors of equal counts share one)
  bool bucketing = false;                   // look for bucketed tensors (off: every tensor at its exact sizes)
  std::vector<runtime::LowerRequest::Bucketed> bucketed;
  std::vector<int64_t> rows;                // per row class: the valid rows
  std::vector<int64_t> capacity;            // per row class: the capacity of its first tensor
  // stride-0 dims of exact tensors (autograd's expanded gradients): a class's rows broadcast, when the size is one
  struct Broadcast {
    size_t offset;  // of the size in the key
    ArgPath path;
    int32_t dim;
    int64_t size;
  };
  std::vector<Broadcast> broadcast;
  int32_t tensors = 0;  // tensor arguments
  // a varying inner size L (storages marked by an upload or an earlier such op): its value and bucket, and each
  // value of a tensor argument on such a storage that the key holds as a form of L
  int64_t sym = -1, sym_cap = 0;
  bool sym_ints = false;  // a call without tensors (a factory): its int arguments may stand for the current L
  std::vector<runtime::LowerRequest::SymForm> sym_forms;
};

// The varying inner size of the last upload that had one, and its bucket: what a factory's size argument equal to
// it (arange(L) for position ids, a mask's ones(L, L)) is taken for.
std::atomic<int64_t> g_current_sym{-1}, g_current_sym_cap{0};

// A row class's dim in the key: a negative size (no real size is), the class and capacity in it.
int64_t rows_code(int32_t cls, int64_t capacity) { return ~((static_cast<int64_t>(cls) << 40) | capacity); }

std::atomic<bool> g_eager_buckets{false};

// The counts of the latest bucketed storages, newest first: an op whose only tensors are expanded to such a count
// (autograd's mean backward: the gradient expanded to the rows, then divided; slice and gather backwards' zeros)
// has no bucketed tensor to take the class from. Its stride-0 dim joins the count's rows (values equal along it,
// so the rows past the count are padding like any other); the rules check the op as for any bucketed tensor.
struct RecentRows {
  std::mutex mu;
  std::array<std::pair<int64_t, int64_t>, 8> counts{};  // (rows, capacity)
  void note(int64_t rows, int64_t capacity) {
    std::lock_guard<std::mutex> lk(mu);
    size_t k = 0;
    while (k + 1 < counts.size() && counts[k].first != rows) ++k;
    for (; k > 0; --k) counts[k] = counts[k - 1];
    counts[0] = {rows, capacity};
  }
  int64_t capacity_of(int64_t rows) {
    std::lock_guard<std::mutex> lk(mu);
    for (const auto& c : counts) {
      if (c.first == rows) return c.second;
    }
    return -1;
  }
};
RecentRows& recent_rows() {
  static RecentRows* r = new RecentRows();
  return *r;
}

// -- a varying inner size: values as forms a * L^p + b ----------------------------------------------------------
constexpr int64_t kSymMinCapacity = 16;  // shorter varying sizes are keyed exactly (few sizes, easy misreadings)

// A contiguous tensor whose sizes are these codes at L, compact in a storage of their sizes at L's bucket `cap`,
// marked with L (an empty one is not: nothing of it is read).
at::Tensor sym_tensor(c10::ArrayRef<int64_t> codes, int64_t L, int64_t cap, at::ScalarType dtype) {
  c10::SmallVector<int64_t, 6> sizes;
  int64_t numel = 1, cap_numel = 1;
  for (int64_t code : codes) {
    sizes.push_back(sym_value(code, L));
    numel *= sizes.back();
    cap_numel *= sym_value(code, cap);
  }
  at::Tensor t = at::detail::empty_strided_generic({cap_numel}, {1}, tpu_allocator(), kTpuKeys, dtype);
  t.unsafeGetTensorImpl()->set_sizes_contiguous(sizes);
  std::lock_guard<std::recursive_mutex> lk(exec_mutex());
  StorageHandle* h = handle_of(t.storage());
  if (h != nullptr && numel > 0) {
    h->sym = L;
    h->sym_cap = cap;
    h->sym_shape.assign(codes.begin(), codes.end());
  }
  return t;
}

template <typename T>
void put(std::string& key, T v) {
  key.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

enum Tag : uint8_t {
  kNone = 1, kBool, kInt, kDouble, kComplex, kString, kIntList, kDoubleList, kBoolList, kDevice, kGenerator,
  kTensorTag, kUndefined, kCpuScalar, kRuntime, kList, kStorageTag, kSymInt
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

// The dim of t that walks the valid rows of its bucketed storage (size: the valid rows, stride: a row; every other
// dim and the offset within one row), or -1. The caller holds exec_mutex().
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
      case ArgKind::kNumber:
        put_number(s, v, path);
        break;
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

// -- the op table --------------------------------------------------------------------------------------------
struct TableSlot {
  Entry generic;                                  // used when value_slots is empty
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
  if (src.kind == ScalarSource::kSym) {
    node.iscalars.push_back(sig.sym);
    return;
  }
  if (src.kind == ScalarSource::kRows) {
    node.iscalars.push_back(sig.rows.at(src.path.arg));
    return;
  }
  if (src.kind == ScalarSource::kRng) {
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
  if (src.kind == ScalarSource::kCpuTensor || v.isTensor()) {
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
    if (e.outputs[j].kind == OutputSpec::kNew) outs[j] = new_output(e.outputs[j], device, sig);
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
    if (o.kind == OutputSpec::kNew) {
      rets.emplace_back(outs[j]);
    } else if (o.kind == OutputSpec::kArg) {
      rets.push_back(arg_at(*stack, base, o.path));
    } else {
      rets.emplace_back(at::Tensor());
    }
  }
  torch::jit::drop(*stack, info.nargs);
  switch (e.returns) {
    case Entry::kSingle:
      stack->push_back(std::move(rets.at(0)));
      break;
    case Entry::kTuple:
      for (auto& r : rets) stack->push_back(std::move(r));
      break;
    case Entry::kList: {
      c10::List<at::Tensor> l;
      for (auto& r : rets) l.push_back(r.toTensor());
      stack->emplace_back(std::move(l));
      break;
    }
    case Entry::kNothing:
      break;
  }
}

// One op: signature -> table -> record -> (strict, debug) launch. The hit path takes exec_mutex once.
bool covers_storage(const at::Tensor& t) {
  return t.storage_offset() == 0 && t.is_contiguous() &&
         static_cast<size_t>(t.numel()) * t.element_size() == t.storage().nbytes();
}

std::atomic<int64_t> g_upload_host_copies{0};

// Uploads whose sizes vary (batches of varying size or sequence length). An upload's source is its dtype, its number
// of dims and its rank among the uploads of that kind since the last host read (a step's batch is the first int64
// [B, L] of each step); tensors that require grad (a module's parameters) and our own uploads are left out. Once a
// source's upload differs from the previous one's in one dim, that dim varies (Dynamo's "automatic dynamic"): this
// and every later upload of the source that differs at most there is bucketed along it. Dim 0 (a batch's size):
// padded on the host to its bucket (zeros) in a storage of the bucket's capacity with its rows marked, as a
// nonzero's rows are. An inner dim (a sequence length L): the compact bytes in a storage of the sizes at L's bucket,
// marked with L (StorageHandle::sym). Either way the ops after it serve every size of the bucket with one program;
// a source whose sizes never change, or change in several dims, stays exact.
std::mutex g_upload_rows_mu;
struct UploadSource {
  c10::SmallVector<int64_t, 6> sizes;  // of its last upload
  int32_t varying = -1;                // the dim that varies; -1: none yet; -2: several (exact)
};
std::unordered_map<std::string, UploadSource> g_upload_sources;
std::unordered_map<std::string, int32_t> g_upload_rank;  // kind -> uploads of it since the last host read
std::atomic<int64_t> g_host_reads{0};
int64_t g_upload_period = -1;
std::vector<int64_t> g_row_buckets;  // the policy's sizes (torchtpu.set_shape_buckets); empty: powers of two
std::atomic<int64_t> g_upload_rows{0}, g_upload_sym{0};

int64_t row_bucket(int64_t n) {
  if (g_row_buckets.empty()) {
    int64_t b = 1;
    while (b < n) b <<= 1;
    return b;
  }
  for (int64_t b : g_row_buckets) {
    if (n <= b) return b;
  }
  return n;
}

thread_local bool t_exact_uploads = false;  // our own uploads (a bucketed graph's inputs at their capacity)

struct UploadBucket {
  int32_t dim = -1;  // -1: exact; 0: rows; >= 1: a varying inner size
  int64_t capacity = 0;
};

// How an upload into `self` (covering its storage) is bucketed.
UploadBucket upload_bucket(const at::Tensor& self) {
  UploadBucket out;
  if (!g_eager_buckets.load(std::memory_order_relaxed) || self.dim() == 0 || t_exact_uploads) return out;
  std::string kind(1, static_cast<char>(self.scalar_type()));
  kind.push_back(static_cast<char>(self.dim()));
  std::lock_guard<std::mutex> lk(g_upload_rows_mu);
  const int64_t period = g_host_reads.load();
  if (period != g_upload_period) {
    g_upload_period = period;
    g_upload_rank.clear();
  }
  const int32_t rank = g_upload_rank[kind]++;
  kind.append(reinterpret_cast<const char*>(&rank), sizeof(rank));
  const auto sizes = self.sizes();
  auto it = g_upload_sources.find(kind);
  if (it == g_upload_sources.end()) {
    if (g_upload_sources.size() >= 4096) g_upload_sources.clear();
    g_upload_sources[kind].sizes.assign(sizes.begin(), sizes.end());
    return out;
  }
  UploadSource& src = it->second;
  int32_t changed = -1;
  for (int32_t d = 0; d < self.dim(); ++d) {
    if (sizes[d] == src.sizes[d] || d == src.varying) continue;
    changed = changed == -1 && src.varying == -1 ? d : -2;
  }
  src.sizes.assign(sizes.begin(), sizes.end());
  if (changed == -2 || src.varying == -2) {
    src.varying = -2;
    return out;
  }
  if (changed >= 0) src.varying = changed;
  if (src.varying < 0) return out;
  const int64_t n = sizes[src.varying];
  if (n < 2) return out;
  out.capacity = row_bucket(n);
  if (src.varying > 0 && out.capacity < kSymMinCapacity) return UploadBucket();
  out.dim = src.varying;
  return out;
}

// copy_ from the host into a tpu tensor: the values converted on the CPU (dtype, broadcast, conj/neg bits), one
// transfer into a new device buffer (jaxlib's C++ device_put), which becomes the storage's value when the tensor
// covers it, else is written through the view by a tpu -> tpu copy_.
void upload(const at::Tensor& self, const at::Tensor& src) {
  at::Tensor host = src.resolve_conj().resolve_neg().to(self.scalar_type()).expand(self.sizes());
  if (self.is_conj()) host = host.conj_physical();
  if (self.is_neg()) host = host.neg();
  host = host.contiguous();
  const c10::DeviceIndex device = self.device().index();
  graph_counters().h2d_transfers += 1;
  graph_counters().h2d_bytes += static_cast<int64_t>(host.nbytes());
  if (covers_storage(self)) {
    // a parameter (module.to) is never a batch: its source's rank must not take a batch's place
    const UploadBucket ub = self.storage().resizable() && !src.requires_grad() ? upload_bucket(self) : UploadBucket();
    std::vector<int64_t> shape = self.sizes().vec();
    if (ub.dim >= 0) {  // padded on the host (free), one transfer of the capacity
      const int64_t n = self.size(ub.dim);
      c10::SmallVector<int64_t, 6> cap_sizes(self.sizes().begin(), self.sizes().end());
      cap_sizes[ub.dim] = ub.capacity;
      int64_t cap_numel = 1;
      for (int64_t x : cap_sizes) cap_numel *= x;
      at::Tensor padded;
      if (ub.dim == 0) {
        padded = at::zeros(cap_sizes, host.options());
        padded.narrow(0, 0, n).copy_(host);
      } else {  // compact: the exact tensor's row-major values first
        padded = at::zeros({cap_numel}, host.options());
        padded.narrow(0, 0, host.numel()).copy_(host.reshape(-1));
      }
      if (padded.nbytes() != host.nbytes()) {
        resize_storage_bytes(self.storage().unsafeGetStorageImpl(), padded.nbytes());
      }
      host = padded;
      shape = host.sizes().vec();
    }
    set_storage_buffer(self, runtime::upload(host, device), self.scalar_type(), shape);
    if (ub.dim == 0) {
      g_upload_rows += 1;
      set_rows(self, self.size(0), self.stride(0) * static_cast<int64_t>(self.element_size()));
    } else if (ub.dim > 0) {
      g_upload_sym += 1;
      std::lock_guard<std::recursive_mutex> lk(exec_mutex());
      StorageHandle* h = handle_of(self.storage());
      h->sym = self.size(ub.dim);
      h->sym_cap = ub.capacity;
      h->sym_shape.assign(self.sizes().begin(), self.sizes().end());
      h->sym_shape[ub.dim] = sym_code(1, 0, 1);
      g_current_sym_cap = ub.capacity;
      g_current_sym = h->sym;
    }
    if (static_cast<int64_t>(host.nbytes()) <= g_upload_host_copies.load()) {
      // our own bytes only: the caller may write its tensor (the next batch) after the copy returns
      at::Tensor keep = host.is_alias_of(src) || host.storage_offset() != 0 ||
                                host.storage().nbytes() != host.nbytes()
                            ? host.clone(at::MemoryFormat::Contiguous)
                            : host;
      std::lock_guard<std::recursive_mutex> lk(exec_mutex());
      StorageHandle* h = handle_of(self.storage());
      if (h->state == StorageHandle::State::kBuffer) h->buffer->host = keep.storage();
    }
  } else {
    const c10::DeviceGuard guard(self.device());
    at::Tensor tmp = at::detail::empty_strided_generic(self.sizes(), host.strides(), tpu_allocator(), kTpuKeys,
                                                       self.scalar_type());
    set_storage_buffer(tmp, runtime::upload(host, device), self.scalar_type(), self.sizes().vec());
    self.copy_(tmp);
  }
}

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
    if (self.device().is_privateuseone() && src.device().is_cpu() && self.numel() > 0 &&
        src.dim() <= self.dim() && at::is_expandable_to(src.sizes(), self.sizes())) {
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
    if (entry != nullptr && entry->kind == Entry::kExact) {  // the rules keep these sizes exact: key them so
      g_bucket_exact += 1;
      sig.bucketing = bucketing = false;
      build_sig(*info, *stack, sig);
      entry = find_entry(sig, *stack, base);
    }
    if (entry != nullptr && entry->kind == Entry::kProgram && !entry->capture_line && mode != Mode::kDebug) {
      // the hot path: record without leaving the lock, then launch (strict) or return (fused)
      g_hits += 1;
      const bool want_cut = record_entry(*entry, sig, stack, base, outs, std::string());
      const c10::DeviceIndex device = sig.device;
      lk.unlock();
      if (entry->fragment >= 0) {
        if (mode != Mode::kFused) {
          cut(device, CutCause::kOp);
        } else if (want_cut) {
          cut(device, CutCause::kRepeat);
        }
      }
      push_results(*entry, *info, stack, base, outs);
      return;
    }
  }
  if (entry == nullptr) {
    entry = lower_and_keep(op, *info, *stack, base, sig);
    if (entry->kind == Entry::kExact) {
      g_bucket_exact += 1;
      {
        std::lock_guard<std::recursive_mutex> lk(exec_mutex());
        sig.bucketing = bucketing = false;
        build_sig(*info, *stack, sig);
        entry = find_entry(sig, *stack, base);
      }
      if (entry == nullptr) entry = lower_and_keep(op, *info, *stack, base, sig);
      TORCH_INTERNAL_ASSERT(entry->kind != Entry::kExact, "tpu: an exact signature lowered as bucketed");
    }
  } else {
    g_hits += 1;
  }
  if (entry->kind == Entry::kPython) {
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
  if (entry->fragment >= 0) {
    if (mode != Mode::kFused) {
      cut(device, CutCause::kOp, mode == Mode::kDebug);
    } else if (want_cut) {
      cut(device, CutCause::kRepeat);
    }
  }
  push_results(*entry, *info, stack, base, outs);
}

std::unique_ptr<torch::Library> g_lib;
std::vector<std::unique_ptr<torch::Library>> g_other_libs;

}  // namespace

void set_mode(Mode m) { g_mode = static_cast<int>(m); }
bool set_exact_uploads(bool on) {
  const bool before = t_exact_uploads;
  t_exact_uploads = on;
  return before;
}

void set_eager_buckets(bool on, std::vector<int64_t> row_buckets) {
  g_eager_buckets = on;
  std::lock_guard<std::mutex> lk(g_upload_rows_mu);
  g_row_buckets = std::move(row_buckets);
  g_upload_sources.clear();
  g_upload_rank.clear();
  g_current_sym = -1;
}

void set_rows(const at::Tensor& t, int64_t rows, int64_t row_bytes) {
  StorageHandle* h = handle_of(t.storage());
  TORCH_CHECK(h != nullptr, "tpu: set_rows on a zero-byte storage");
  TORCH_CHECK(rows < 0 || (row_bytes > 0 && rows * row_bytes <= static_cast<int64_t>(t.storage().nbytes())),
              "tpu: set_rows: ", rows, " rows of ", row_bytes, " bytes do not fit a storage of ", t.storage().nbytes(),
              " bytes");
  std::lock_guard<std::recursive_mutex> lk(exec_mutex());
  h->rows = rows;
  h->row_bytes = rows < 0 ? 0 : row_bytes;
  if (rows >= 0) recent_rows().note(rows, static_cast<int64_t>(t.storage().nbytes()) / row_bytes);
}

at::Tensor sym_alloc(c10::IntArrayRef size, at::ScalarType dtype, int64_t L, int64_t cap,
                     c10::ArrayRef<int64_t> known = {});

at::Tensor bucketed_like(const at::Tensor& self, at::Tensor out) {
  if (!g_eager_buckets.load(std::memory_order_relaxed) || !self.device().is_privateuseone() ||
      !out.device().is_privateuseone() || out.dim() == 0 || out.sizes() != self.sizes() || !out.is_contiguous()) {
    return out;
  }
  std::unique_lock<std::recursive_mutex> lk(exec_mutex());
  c10::StorageImpl* st = self.storage().unsafeGetStorageImpl();
  StorageHandle* hs = handle_of(st);
  if (hs != nullptr && hs->sym >= 0 && self.is_contiguous() && self.storage_offset() == 0 &&
      hs->sym_shape.size() == static_cast<size_t>(self.dim())) {  // the compact tensor of a varying size
    for (int64_t d = 0; d < self.dim(); ++d) {
      if (sym_value(hs->sym_shape[d], hs->sym) != self.size(d)) return out;
    }
    const c10::DeviceGuard guard(out.device());
    return sym_tensor(hs->sym_shape, hs->sym, hs->sym_cap, out.scalar_type());
  }
  if (hs != nullptr && hs->sym >= 0) {  // a view of it (q.transpose(1, 2).contiguous()): its sizes that follow L
    const int64_t L = hs->sym, cap = hs->sym_cap;
    const auto known = view_forms(hs->sym_shape, L, self.sizes(), self.strides(), self.storage_offset());
    lk.unlock();
    const c10::DeviceGuard guard(out.device());
    at::Tensor t =
        sym_alloc(out.sizes(), out.scalar_type(), L, cap, c10::ArrayRef<int64_t>(known).slice(0, self.dim()));
    return t.defined() ? t : out;
  }
  if (rows_dim(self, st) != 0) return out;
  StorageHandle* h = handle_of(st);
  c10::SmallVector<int64_t, 6> sizes(out.sizes().begin(), out.sizes().end());
  sizes[0] = static_cast<int64_t>(st->nbytes()) / h->row_bytes;
  const c10::DeviceGuard guard(out.device());
  at::Tensor big =
      at::detail::empty_strided_generic(sizes, out.strides(), tpu_allocator(), kTpuKeys, out.scalar_type());
  big.unsafeGetTensorImpl()->set_sizes_and_strides(out.sizes(), out.strides());
  StorageHandle* hb = handle_of(big.storage());
  if (hb == nullptr) return out;
  hb->rows = h->rows;
  hb->row_bytes = out.stride(0) * static_cast<int64_t>(out.element_size());
  return big;
}

// A contiguous tensor of these sizes compact in a storage of its sizes at L's bucket `cap`; known (view_forms's
// answers per size, or none): a form code, 1 (static) or 0 (int_form: a size a * L + b is taken for that form).
// Undefined when no size follows L.
at::Tensor sym_alloc(c10::IntArrayRef size, at::ScalarType dtype, int64_t L, int64_t cap,
                     c10::ArrayRef<int64_t> known) {
  c10::SmallVector<int64_t, 4> codes;
  bool any = false;
  for (size_t d = 0; d < size.size(); ++d) {
    const int64_t n = size[d], k = d < known.size() ? known[d] : 0;
    const int64_t f = k == 0 ? int_form(n, L) : 0;
    codes.push_back(k < 0 ? k : f < 0 ? f : n);
    any = any || codes.back() < 0;
  }
  if (!any) return at::Tensor();
  return sym_tensor(codes, L, cap, dtype);
}

at::Tensor sym_empty(c10::IntArrayRef size, at::ScalarType dtype) {
  const int64_t L = g_current_sym.load(std::memory_order_relaxed), cap = g_current_sym_cap.load();
  if (L < 0 || cap < kSymMinCapacity || !g_eager_buckets.load(std::memory_order_relaxed)) return at::Tensor();
  return sym_alloc(size, dtype, L, cap);
}

std::pair<int64_t, int64_t> rows_of(const at::Tensor& t) {
  StorageHandle* h = handle_of(t.storage());
  if (h == nullptr) return {-1, 0};
  std::lock_guard<std::recursive_mutex> lk(exec_mutex());
  return {h->rows, h->row_bytes};
}
std::tuple<int64_t, int64_t, std::vector<int64_t>> sym_of(const at::Tensor& t) {
  StorageHandle* h = handle_of(t.storage());
  if (h == nullptr) return {-1, 0, {}};
  std::lock_guard<std::recursive_mutex> lk(exec_mutex());
  return {h->sym, h->sym_cap, std::vector<int64_t>(h->sym_shape.begin(), h->sym_shape.end())};
}
Mode get_mode() { return static_cast<Mode>(g_mode.load()); }

void register_kernels(const std::vector<std::string>& names) {
  if (!g_lib) {
    g_lib = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1,
                                             __FILE__, __LINE__);
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
                     const std::vector<int64_t>& is, const std::vector<at::Tensor>& results,
                     const std::string& line) {
  const Fragment& f = fragment(fid);
  TORCH_CHECK(storage_params.size() == f.params.size() && results.size() == f.results.size(),
              "tpu: record_fragment: ", f.label, " takes ", f.params.size(), " storages and gives ",
              f.results.size(), " results");
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
  const Mode mode = get_mode();
  if (mode != Mode::kFused) {
    cut(device, CutCause::kOp, mode == Mode::kDebug);
  } else if (want_cut) {
    cut(device, CutCause::kRepeat);
  }
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
  if (cause == static_cast<int>(CutCause::kHostRead)) g_host_reads += 1;  // a period of the upload sources' ranks
  if (target) {
    cut_for_read(h->device, target.get(), static_cast<CutCause>(cause));
  } else if (get_mode() == Mode::kFused) {
    cut(h->device, static_cast<CutCause>(cause));
  }
  std::lock_guard<std::recursive_mutex> lk(exec_mutex());
  h->resolve();
  switch (h->state) {
    case StorageHandle::State::kBuffer:
      runtime::incref(h->buffer->array);
      return h->buffer->array;
    case StorageHandle::State::kFailed:
      TORCH_CHECK(false, *h->error);
    case StorageHandle::State::kPending:
      TORCH_INTERNAL_ASSERT(false, "tpu: a storage is still pending after its device's graph was launched");
    default:
      return nullptr;
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

void set_upload_host_copies(int64_t max_bytes) { g_upload_host_copies = max_bytes; }

at::Tensor storage_host_values(const at::Tensor& t) {
  StorageHandle* h = handle_of(t.storage());
  if (h == nullptr) return at::Tensor();
  c10::Storage host;
  ValueType vt;
  {
    std::lock_guard<std::recursive_mutex> lk(exec_mutex());
    h->resolve();
    if (h->state != StorageHandle::State::kBuffer || !h->buffer->host) return at::Tensor();
    host = h->buffer->host;
    vt = h->buffer->type;
  }
  return at::empty({0}, at::TensorOptions().dtype(vt.dtype)).set_(host, 0, {vt.numel()}, {1});
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

std::vector<std::pair<std::string, int64_t>> op_counts() {
  std::vector<std::pair<std::string, int64_t>> out;
  std::lock_guard<std::mutex> lk(g_ops_mu);
  for (const auto& kv : g_ops) {
    if (kv.second->count > 0) out.emplace_back(kv.second->name, kv.second->count.load());
  }
  return out;
}

void reset_counters() {
  g_ops_total = g_hits = g_misses = g_python = g_specializations = g_bucket_exact = g_upload_rows = g_upload_sym = 0;
  std::lock_guard<std::mutex> lk(g_ops_mu);
  for (auto& kv : g_ops) kv.second->count = 0;
  auto& gc = graph_counters();
  gc.chunks = gc.chunk_ops = gc.chunk_ops_max = gc.chunk_cache_hits = gc.chunk_cache_misses = 0;
  gc.chunk_cache_evictions = 0;
  gc.donated_buffers = gc.donated_bytes = gc.failed_chunks = gc.dead_ops = gc.h2d_transfers = gc.h2d_bytes = 0;
  for (auto& c : gc.cuts) c = 0;
}

}  // namespace torchtpu
