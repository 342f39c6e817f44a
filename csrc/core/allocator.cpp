#include "core/allocator.h"

#include <atomic>
#include <mutex>

#include "core/device.h"
#include "core/storage.h"
#include "graph/node.h"

namespace torchtpu {
namespace {

// Tokens start far above any host address range in use, and each allocation reserves its size rounded up to
// 4 KiB plus a gap page, so distinct storages never overlap.
constexpr uint64_t kTokenBase = 0x7e0000000000ULL;
constexpr uint64_t kPage = 4096;

std::atomic<uint64_t> g_next{kTokenBase};

void delete_handle(void* ctx) {
  auto* h = static_cast<StorageHandle*>(ctx);
  {
    std::lock_guard<std::recursive_mutex> lk(exec_mutex());
    h->clear();
  }
  note_storage(h->device, -1);
  delete h;
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
    const uint64_t token = g_next.fetch_add(((n + kPage - 1) / kPage + 1) * kPage);
    note_storage(index, 1);
    auto* h = new StorageHandle{token, n, index};
    return {reinterpret_cast<void*>(token), h, &delete_handle, dev};
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
  c10::DataPtr fresh = g_allocator.allocate_on(new_nbytes, storage->device().index());
  StorageHandle* old_h = handle_of(storage);
  StorageHandle* new_h = static_cast<StorageHandle*>(fresh.get_context());
  if (old_h != nullptr && new_h != nullptr) {
    std::lock_guard<std::recursive_mutex> lk(exec_mutex());
    old_h->resolve();
    switch (old_h->state) {
      case StorageHandle::State::kBuffer: new_h->set_buffer(old_h->buffer); break;
      case StorageHandle::State::kPending: new_h->set_pending(old_h->node, old_h->index); break;
      case StorageHandle::State::kFailed: new_h->set_failed(old_h->error); break;
      default: break;
    }
  }
  storage->set_data_ptr_noswap(std::move(fresh));
  storage->set_nbytes(new_nbytes);
}

}  // namespace torchtpu

REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &torchtpu::g_allocator);
