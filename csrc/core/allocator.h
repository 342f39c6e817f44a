#pragma once
// The tpu allocator: each storage gets a StorageHandle (core/storage.h) as its DataPtr context and a unique
// token as its address. Neither allocate nor the deleter takes the GIL.
#include <c10/core/Allocator.h>
#include <c10/core/Storage.h>

namespace torchtpu {

c10::Allocator* tpu_allocator();

// Gives a storage a fresh token of new_nbytes that keeps its value (what UntypedStorage.resize_ and
// Tensor.resize_ need): the value is carried over as it is, and reads and writes that reach past its end see
// zeros / grow it (storage views handle a buffer whose size differs from the storage's). 0 bytes drop it.
void resize_storage_bytes(c10::StorageImpl* storage, size_t new_nbytes);

}  // namespace torchtpu
