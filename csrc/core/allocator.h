#pragma once
// Storage tokens for the tpu device.
//
// A tpu storage's data pointer is an opaque token that nothing dereferences: the
// device buffer behind it (a jax Array) is owned by the Python runtime layer,
// keyed by that token. The allocator hands out non-overlapping token ranges (so
// PyTorch's pointer-overlap checks stay meaningful) and records storage events
// (free, move on resize) in an ordered queue that the runtime drains. Neither
// allocate nor the deleter ever takes the GIL.
#include <c10/core/Allocator.h>
#include <c10/core/Storage.h>

#include <cstdint>
#include <tuple>
#include <vector>

namespace torchtpu {

enum class StorageEvent : int64_t { kFree = 0, kMove = 1 };

c10::Allocator* tpu_allocator();

// Swap a storage's token for a fresh one of new_nbytes; the runtime is told to
// carry the old contents over (what UntypedStorage.resize_ and Tensor.resize_ need).
void resize_storage_bytes(c10::StorageImpl* storage, size_t new_nbytes);

// (kind, token, new token or 0, nbytes: freed bytes, or the new size for kMove) in the order they happened.
std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>> drain_storage_events();

struct AllocatorStats {  // per device
  int64_t allocated_bytes;
  int64_t peak_bytes;
  int64_t live_storages;
  int64_t total_allocations;
};
AllocatorStats allocator_stats(c10::DeviceIndex device);
void reset_peak_allocated(c10::DeviceIndex device);

}  // namespace torchtpu
