#include "executor/sym.h"

#include <algorithm>

namespace torchtpu {
namespace {

constexpr int64_t kMaxA = int64_t{1} << 40;

struct Form {  // a * L^p + b; p == 0: the static value a
  int64_t a = 0, b = 0, p = 0;
};

Form decode(int64_t code) {
  if (code >= 0) return {code, 0, 0};
  const int64_t c = ~code;
  return {c & ((int64_t{1} << 48) - 1), ((c >> 48) & 0xff) - 128, (c >> 56) & 0x3f};
}

// A form as put_value's answer: 1 (static), a code, or 0 (no form).
int64_t answer(const Form& f) {
  if (f.p == 0) return 1;
  if (f.p > 2 || f.a < 1 || f.a >= kMaxA || f.b < -1 || f.b > 1) return 0;
  return sym_code(f.a, f.b, f.p);
}

// v as c * L + b with b in -1..1 (L - 1, 2L), else the static value v.
Form linear_form(int64_t v, int64_t L) {
  if (L < 2 || v < L - 1) return {v, 0, 0};
  const int64_t c = (v + L / 2) / L, b = v - c * L;
  return c >= 1 && c < kMaxA && b >= -1 && b <= 1 ? Form{c, b, 1} : Form{v, 0, 0};
}

}  // namespace

int64_t sym_code(int64_t a, int64_t b, int64_t p) { return ~((int64_t{1} << 62) | (p << 56) | ((b + 128) << 48) | a); }

int64_t sym_value(int64_t code, int64_t L) {
  if (code >= 0) return code;
  const Form f = decode(code);
  return f.a * (f.p == 2 ? L * L : L) + f.b;
}

c10::SmallVector<int64_t, 6> sym_strides(c10::ArrayRef<int64_t> shape, c10::SmallVector<bool, 6>* ok) {
  c10::SmallVector<int64_t, 6> out(shape.size());
  ok->assign(shape.size(), true);
  int64_t a = 1, p = 0;
  bool form = true;
  for (size_t d = shape.size(); d-- > 0;) {
    out[d] = p == 0 ? a : sym_code(a, 0, p);
    (*ok)[d] = form && p <= 2 && a < kMaxA;
    const Form f = decode(shape[d]);
    if (f.b != 0) form = false;  // (a L + b) with b != 0: products are no forms
    a *= std::max<int64_t>(f.a, 1);
    p += f.p;
  }
  return out;
}

// Any answer is right: a later call matches the key only when its own values are the same forms of its own L, and
// the op was lowered for every L of the bucket under these forms. A wrong guess (a hidden size equal to 2L) costs
// an entry and a lowering at exact sizes, not a wrong value.
int64_t sym_classify(int64_t v, int64_t L) {
  if (v < L - 1) return 0;
  if (v >= L * L && v % (L * L) == 0) return sym_code(v / (L * L), 0, 2);
  const Form f = linear_form(v, L);
  return f.p == 0 ? 0 : sym_code(f.a, f.b, 1);
}

int64_t int_form(int64_t v, int64_t L) {
  if (L < 2 || v < L || v % L != 0 || v / L > 16) return 0;
  return sym_code(v / L, 0, 1);
}

c10::SmallVector<int64_t, 13> view_forms(c10::ArrayRef<int64_t> shape, int64_t L, c10::IntArrayRef sizes,
                                         c10::IntArrayRef strides, int64_t offset) {
  const size_t nd = sizes.size(), sd = shape.size();
  c10::SmallVector<int64_t, 13> out(2 * nd + 1, 0);
  c10::SmallVector<bool, 6> ok;
  const c10::SmallVector<int64_t, 6> cs = sym_strides(shape, &ok);
  c10::SmallVector<int64_t, 6> n(sd), sv(sd);  // the storage's sizes and strides at L
  int64_t acc = 1;
  for (size_t d = sd; d-- > 0;) {
    n[d] = sym_value(shape[d], L);
    sv[d] = acc;
    acc *= std::max<int64_t>(n[d], 1);
  }
  // a value as coordinates in the storage's compact layout, each times its dim's stride code (an offset; a stride
  // that steps k of a dim: 32L of a (2, 4) split of the 8 of [8, 8, L] at L = 32, not L^2). A coordinate along a
  // dim that follows L may itself be L (+- 1) or a multiple of L: the stride L * 32 of a (2L, 32) storage's view
  // (2, L, 32).
  auto coords_form = [&](int64_t v) -> int64_t {
    if (v < 0) return 0;
    int64_t rem = v, coef[4] = {0, 0, 0, 0};  // by the power of L
    for (size_t d = 0; d < sd; ++d) {
      if (n[d] <= 1) continue;
      const int64_t k = rem / sv[d];
      rem -= k * sv[d];
      if (k == 0) continue;
      if ((d > 0 && k >= n[d]) || !ok[d]) return 0;
      const Form st = decode(cs[d]), dim = decode(shape[d]);
      const Form kf = dim.p > 0 ? linear_form(k, L) : Form{k, 0, 0};  // the coordinate as a form
      if (kf.p + st.p > 3) return 0;
      coef[kf.p + st.p] += kf.a * st.a;
      coef[st.p] += kf.b * st.a;
    }
    if (rem != 0 || coef[3] != 0 || (coef[1] != 0 && coef[2] != 0)) return 0;
    if (coef[1] == 0 && coef[2] == 0) return 1;
    return answer({coef[1] != 0 ? coef[1] : coef[2], coef[0], coef[1] != 0 ? 1 : 2});
  };
  for (size_t i = 0; i < nd; ++i) {
    if (sizes[i] > 1 && strides[i] == 0) {  // broadcast (a mask's expand to L): a multiple of L, else static
      const int64_t f = int_form(sizes[i], L);
      out[i] = f < 0 ? f : 1;
      out[nd + i] = 1;
      continue;
    }
    if (sizes[i] <= 1 || strides[i] <= 0) continue;
    out[nd + i] = coords_form(strides[i]);
    size_t d = 0;
    while (d < sd && (n[d] <= 1 || sv[d] != strides[i])) ++d;
    if (d == sd) continue;  // a split dim, a broadcast: no storage dim walks it
    const Form f = decode(shape[d]);
    if (sizes[i] == n[d]) {
      out[i] = answer(f);
    } else if (sizes[i] < n[d]) {  // a part of the dim: of a static dim static; of a L: L - 1 (a slice)
      if (f.p == 0) {
        out[i] = 1;
      } else if (sizes[i] >= L - 1 && sizes[i] <= L + 1) {
        out[i] = sym_code(1, sizes[i] - L, 1);
      } else if (f.p == 1 && f.b == 0 && sizes[i] % L == 0 && f.a % (sizes[i] / L) == 0) {
        out[i] = sym_code(sizes[i] / L, 0, 1);  // of 2L split as (2, L): L; of 8L as (2, 4L): 4L
      }
    } else {  // dims merged: the product of d and the dims outside it
      Form prod = f;
      int64_t v = n[d];
      for (size_t e = d; e-- > 0 && v < sizes[i];) {
        const Form g = decode(shape[e]);
        v *= n[e];
        if (prod.p > 0 && g.p > 0 && (prod.b != 0 || g.b != 0)) {
          prod.p = 3;  // (a L + b)(c L + d): no form
        } else if (g.p == 0) {
          prod = {prod.a * g.a, prod.b * g.a, prod.p};
        } else if (prod.p == 0) {
          prod = {g.a * prod.a, g.b * prod.a, g.p};
        } else {
          prod = {prod.a * g.a, 0, prod.p + g.p};
        }
      }
      if (v == sizes[i]) out[i] = answer(prod);
    }
  }
  out[2 * nd] = coords_form(offset);
  return out;
}

}  // namespace torchtpu
