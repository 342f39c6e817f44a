// Bucketed rows and a varying inner size in the eager modes: the storages that hold them, and the tensors made on
// them (torchtpu/shapes/eager_buckets.py and eager_symbolic.py are the Python halves).
#include <ATen/EmptyTensor.h>
#include <c10/core/DeviceGuard.h>

#include "core/allocator.h"
#include "core/storage.h"
#include "executor/executor.h"
#include "executor/signature.h"
#include "executor/sym.h"

namespace torchtpu {

std::atomic<bool> g_eager_buckets{false};
std::atomic<int64_t> g_current_sym{-1}, g_current_sym_cap{0};

RecentRows& recent_rows() {
  static RecentRows* r = new RecentRows();
  return *r;
}

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

}  // namespace torchtpu
