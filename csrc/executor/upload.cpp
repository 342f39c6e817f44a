// Uploads: copy_ from the host into tpu tensors, and the sources whose sizes vary between steps (bucketed along
// their rows or a varying inner size, so the ops after them serve every size of a bucket).
#include <ATen/EmptyTensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/core/DeviceGuard.h>

#include <unordered_map>

#include "core/allocator.h"
#include "core/storage.h"
#include "executor/executor.h"
#include "executor/signature.h"
#include "executor/sym.h"
#include "graph/graph.h"

namespace torchtpu {

std::atomic<int64_t> g_upload_rows{0}, g_upload_sym{0};

namespace {

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

}  // namespace

bool covers_storage(const at::Tensor& t) {
  return t.storage_offset() == 0 && t.is_contiguous() &&
         static_cast<size_t>(t.numel()) * t.element_size() == t.storage().nbytes();
}

void count_host_read() { g_host_reads += 1; }

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
      at::Tensor keep = host.is_alias_of(src) || host.storage_offset() != 0 || host.storage().nbytes() != host.nbytes()
                            ? host.clone(at::MemoryFormat::Contiguous)
                            : host;
      std::lock_guard<std::recursive_mutex> lk(exec_mutex());
      StorageHandle* h = handle_of(self.storage());
      if (h->state == StorageHandle::State::kBuffer) h->buffer->host = keep.storage();
    }
  } else {
    const c10::DeviceGuard guard(self.device());
    at::Tensor tmp =
        at::detail::empty_strided_generic(self.sizes(), host.strides(), tpu_allocator(), kTpuKeys, self.scalar_type());
    set_storage_buffer(tmp, runtime::upload(host, device), self.scalar_type(), self.sizes().vec());
    self.copy_(tmp);
  }
}

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

}  // namespace torchtpu
