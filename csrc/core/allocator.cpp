#include "core/allocator.h"

#include <atomic>
#include <mutex>

namespace torchtpu {
namespace {

// Tokens start far above any host address range in use, and each allocation
// reserves its size rounded up to 4 KiB plus a gap page.
constexpr uint64_t kTokenBase = 0x7e0000000000ULL;
constexpr uint64_t kPage = 4096;

std::mutex g_mu;
uint64_t g_next = kTokenBase;
std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>> g_events;
int64_t g_allocated = 0, g_peak = 0, g_live = 0, g_total = 0;

struct TokenCtx {
  uint64_t token;
  size_t nbytes;
};

void delete_token(void* ctx) {
  auto* c = static_cast<TokenCtx*>(ctx);
  {
    std::lock_guard<std::mutex> lk(g_mu);
    g_events.emplace_back(static_cast<int64_t>(StorageEvent::kFree), static_cast<int64_t>(c->token), 0,
                          static_cast<int64_t>(c->nbytes));
    g_allocated -= static_cast<int64_t>(c->nbytes);
    g_live -= 1;
  }
  delete c;
}

class TpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    const c10::Device dev(c10::DeviceType::PrivateUse1, 0);
    if (n == 0) return {nullptr, nullptr, &c10::detail::deleteNothing, dev};
    uint64_t token;
    {
      std::lock_guard<std::mutex> lk(g_mu);
      token = g_next;
      g_next += ((n + kPage - 1) / kPage + 1) * kPage;
      g_allocated += static_cast<int64_t>(n);
      g_peak = std::max(g_peak, g_allocated);
      g_live += 1;
      g_total += 1;
    }
    auto* ctx = new TokenCtx{token, n};
    return {reinterpret_cast<void*>(token), ctx, &delete_token, dev};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void*, const void*, std::size_t) const override {
    TORCH_CHECK(false, "tpu storages hold device buffers that the host cannot memcpy; use tensor.copy_()");
  }
};

TpuAllocator g_allocator;

}  // namespace

c10::Allocator* tpu_allocator() { return &g_allocator; }

void resize_storage_bytes(c10::StorageImpl* storage, size_t new_nbytes) {
  TORCH_CHECK(storage->resizable(), "Trying to resize a tpu storage that is not resizable");
  const auto old_token = reinterpret_cast<int64_t>(storage->data_ptr().get());
  c10::DataPtr fresh = g_allocator.allocate(new_nbytes);
  const auto new_token = reinterpret_cast<int64_t>(fresh.get());
  if (old_token != 0 && new_token != 0) {
    std::lock_guard<std::mutex> lk(g_mu);
    // Must precede the old token's kFree event, which set_data_ptr_noswap triggers below.
    g_events.emplace_back(static_cast<int64_t>(StorageEvent::kMove), old_token, new_token,
                          static_cast<int64_t>(new_nbytes));
  }
  storage->set_data_ptr_noswap(std::move(fresh));
  storage->set_nbytes(new_nbytes);
}

std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>> drain_storage_events() {
  std::lock_guard<std::mutex> lk(g_mu);
  std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>> out;
  out.swap(g_events);
  return out;
}

AllocatorStats allocator_stats() {
  std::lock_guard<std::mutex> lk(g_mu);
  return {g_allocated, g_peak, g_live, g_total};
}

void reset_peak_allocated() {
  std::lock_guard<std::mutex> lk(g_mu);
  g_peak = g_allocated;
}

}  // namespace torchtpu

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &torchtpu::g_allocator);
