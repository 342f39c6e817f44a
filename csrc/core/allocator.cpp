#include "core/allocator.h"

#include <atomic>
#include <mutex>

#include "core/device.h"

namespace torchtpu {
namespace {

// Tokens start far above any host address range in use, and each allocation
// reserves its size rounded up to 4 KiB plus a gap page.
constexpr uint64_t kTokenBase = 0x7e0000000000ULL;
constexpr uint64_t kPage = 4096;

std::mutex g_mu;
uint64_t g_next = kTokenBase;
std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>> g_events;
constexpr int kMaxDevices = 64;
AllocatorStats g_stats[kMaxDevices] = {};  // per device index

struct TokenCtx {
  uint64_t token;
  size_t nbytes;
  c10::DeviceIndex device;
};

void delete_token(void* ctx) {
  auto* c = static_cast<TokenCtx*>(ctx);
  {
    std::lock_guard<std::mutex> lk(g_mu);
    g_events.emplace_back(static_cast<int64_t>(StorageEvent::kFree), static_cast<int64_t>(c->token), 0,
                          static_cast<int64_t>(c->nbytes));
    auto& st = g_stats[c->device];
    st.allocated_bytes -= static_cast<int64_t>(c->nbytes);
    st.live_storages -= 1;
  }
  delete c;
}

class TpuAllocator final : public c10::Allocator {
 public:
  // The device is the current one: the empty kernels set a device guard first, as every allocator does.
  c10::DataPtr allocate(size_t n) override { return allocate_on(n, current_device()); }

  c10::DataPtr allocate_on(size_t n, c10::DeviceIndex index) {
    TORCH_CHECK(index >= 0 && index < kMaxDevices, "tpu allocator: device index ", static_cast<int>(index),
                " out of range");
    const c10::Device dev(c10::DeviceType::PrivateUse1, index);
    if (n == 0) return {nullptr, nullptr, &c10::detail::deleteNothing, dev};
    uint64_t token;
    {
      std::lock_guard<std::mutex> lk(g_mu);
      token = g_next;
      g_next += ((n + kPage - 1) / kPage + 1) * kPage;
      auto& st = g_stats[index];
      st.allocated_bytes += static_cast<int64_t>(n);
      st.peak_bytes = std::max(st.peak_bytes, st.allocated_bytes);
      st.live_storages += 1;
      st.total_allocations += 1;
    }
    auto* ctx = new TokenCtx{token, n, index};
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
  c10::DataPtr fresh = g_allocator.allocate_on(new_nbytes, storage->device().index());
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

AllocatorStats allocator_stats(c10::DeviceIndex device) {
  check_device_index(device);
  std::lock_guard<std::mutex> lk(g_mu);
  return g_stats[device];
}

void reset_peak_allocated(c10::DeviceIndex device) {
  check_device_index(device);
  std::lock_guard<std::mutex> lk(g_mu);
  g_stats[device].peak_bytes = g_stats[device].allocated_bytes;
}

}  // namespace torchtpu

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &torchtpu::g_allocator);
