#include "graph/fragment.h"

#include <c10/util/Exception.h>

#include <deque>
#include <mutex>
#include <unordered_map>

namespace torchtpu {
namespace {

std::mutex g_mu;
std::deque<Fragment> g_fragments;  // deque: references stay valid as it grows
std::unordered_map<std::string, int32_t> g_by_text;
// Lock-free reads by id: registered pointers in a vector that never reallocates.
constexpr size_t kMaxFragments = 1 << 20;
std::vector<const Fragment*>& ptrs() {
  static std::vector<const Fragment*> v = [] {
    std::vector<const Fragment*> x;
    x.reserve(kMaxFragments);
    return x;
  }();
  return v;
}

const char* elem_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "f32";
    case at::kDouble: return "f64";
    case at::kHalf: return "f16";
    case at::kBFloat16: return "bf16";
    case at::kComplexFloat: return "complex<f32>";
    case at::kComplexDouble: return "complex<f64>";
    case at::kChar: return "i8";
    case at::kShort: return "i16";
    case at::kInt: return "i32";
    case at::kLong: return "i64";
    case at::kByte: return "ui8";
    case at::kUInt16: return "ui16";
    case at::kUInt32: return "ui32";
    case at::kUInt64: return "ui64";
    case at::kBool: return "i1";
    default: TORCH_CHECK(false, "tpu: dtype ", t, " has no StableHLO type");
  }
}

}  // namespace

std::string mlir_type(const ValueType& t) {
  std::string s = "tensor<";
  for (auto d : t.shape) s += std::to_string(d) + "x";
  return s + elem_type(t.dtype) + ">";
}

int32_t register_fragment(Fragment f) {
  std::lock_guard<std::mutex> lk(g_mu);
  // The text names the function @FRAGMENT; the registry gives it its own name.
  // The same text can read a storage or take a runtime scalar through one parameter: the key tells them apart.
  std::string key = f.text + "|" + std::to_string(f.params.size()) + (f.has_check ? "c" : "");
  for (const auto& s : f.scalars) key += static_cast<char>('0' + static_cast<int>(s.kind));
  auto it = g_by_text.find(key);
  if (it != g_by_text.end()) return it->second;
  f.id = static_cast<int32_t>(g_fragments.size());
  f.name = "f" + std::to_string(f.id);
  const std::string placeholder = "@FRAGMENT";
  auto pos = f.text.find(placeholder);
  TORCH_INTERNAL_ASSERT(pos != std::string::npos, "tpu: a fragment's text must name its function @FRAGMENT");
  f.text.replace(pos, placeholder.size(), "@" + f.name);
  for (const auto& s : f.scalars) {
    const bool two = s.kind == ScalarKind::kComplex || s.kind == ScalarKind::kRng;
    if (s.kind == ScalarKind::kFloat || s.kind == ScalarKind::kComplex) {
      f.n_fscalars += two ? 2 : 1;
    } else {
      f.n_iscalars += two ? 2 : 1;
    }
  }
  TORCH_CHECK(g_fragments.size() < kMaxFragments, "tpu: too many distinct fragments (", kMaxFragments, ")");
  g_fragments.push_back(std::move(f));
  g_by_text.emplace(key, g_fragments.back().id);
  ptrs().push_back(&g_fragments.back());
  return g_fragments.back().id;
}

const Fragment& fragment(int32_t id) { return *ptrs()[id]; }

}  // namespace torchtpu
