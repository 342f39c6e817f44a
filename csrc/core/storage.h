#pragma once
// Storage handles: what a tpu storage's bytes are.
//
// A tpu storage's DataPtr holds a StorageHandle as its context; its data address is an opaque, unique token
// that nothing dereferences (PyTorch's pointer-overlap checks stay meaningful). The handle's value is one of:
//   empty    never written: reads as zeros (allocation never exposes garbage)
//   buffer   a device buffer (a jax Array, held through a DeviceBuffer)
//   pending  output `index` of a node of the pending graph (fused eager), or of a launched node whose result
//            has not been looked at since (resolved lazily to its buffer)
//   failed   the error of the op that should have produced it; it surfaces, naming that op, when read
// Every field is guarded by exec_mutex(). Nothing here takes the GIL: a freed Python reference is queued and
// released by the runtime at its next safe point (runtime/python.cpp).
#include <c10/core/Allocator.h>
#include <c10/core/ScalarType.h>
#include <c10/core/Storage.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/SmallVector.h>
#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

struct _object;  // PyObject, without Python.h

namespace torchtpu {

constexpr int kMaxDevices = 64;

// The type of a device value: element dtype and shape (a buffer's, not the tensor view's).
struct ValueType {
  at::ScalarType dtype = at::kFloat;
  c10::SmallVector<int64_t, 6> shape;
  int64_t numel() const;
  int64_t nbytes() const { return numel() * static_cast<int64_t>(c10::elementSize(dtype)); }
  bool operator==(const ValueType& o) const { return dtype == o.dtype && shape == o.shape; }
};

// A device buffer: one strong reference to a jax Array. Its bytes count as allocated on its device until the
// buffer is dropped or donated to a program that overwrites it.
struct DeviceBuffer : c10::intrusive_ptr_target {
  DeviceBuffer(_object* array, ValueType type, c10::DeviceIndex device);  // steals the reference
  ~DeviceBuffer() override;
  _object* array;
  ValueType type;
  c10::DeviceIndex device;
  bool donated = false;
  // The host bytes it was uploaded from, for small uploads while sizes are bucketed: a bucketed graph that needs
  // the value in a storage of its bucket's capacity pads these on the host instead of reading the buffer back, and
  // a host read of the storage (executor.read_host: an expert id read as a Python int) takes them with no sync. A
  // buffer never changes, so they stay true for as long as it lives.
  c10::Storage host;
  void mark_donated();  // the program that consumes it reuses its memory: it no longer counts
};
using BufferPtr = c10::intrusive_ptr<DeviceBuffer>;

struct Node;
using NodePtr = c10::intrusive_ptr<Node>;

struct StorageHandle {
  enum class State : uint8_t { kEmpty, kBuffer, kPending, kFailed };
  uint64_t token;
  size_t nbytes;
  c10::DeviceIndex device;
  State state = State::kEmpty;
  BufferPtr buffer;
  NodePtr node;
  int32_t index = 0;
  std::shared_ptr<const std::string> error;
  // Bucketed rows (eager bounded dynamic shapes, docs/architecture.md): the storage's first `rows` rows of
  // `row_bytes` bytes are valid, the rest up to its capacity (nbytes / row_bytes rows) is padding that no
  // tensor the user sees reaches. -1: not bucketed. Set with the value by the op that made the storage.
  int64_t rows = -1;
  int64_t row_bytes = 0;
  // A varying inner size (eager bounded dynamic shapes: a batch's sequence length L). The storage holds a compact
  // tensor (row-major, from its start) whose sizes follow L, in the bytes of its sizes at `sym_cap` (L's bucket);
  // `sym_shape` are those sizes, each a static size or a form code of L (executor/kernel.cpp sym_code). -1: none.
  // Set by the upload or the op that made the storage.
  int64_t sym = -1;
  int64_t sym_cap = 0;
  c10::SmallVector<int64_t, 4> sym_shape;

  // Points the handle at a new value (dropping the old one); pending keeps the node's output alive.
  void set_buffer(BufferPtr b);
  void set_pending(NodePtr n, int32_t i);
  void set_failed(std::shared_ptr<const std::string> e);
  void clear();
  // A pending value whose node has been launched becomes its buffer (or its failure).
  void resolve();
  // The value's type; false when empty.
  bool value_type(ValueType* out);
};

// The one lock of the executor (handles, the pending graph, the tables). Never held while the GIL is taken.
std::recursive_mutex& exec_mutex();

StorageHandle* handle_of(const c10::Storage& storage);  // nullptr for a zero-byte storage
StorageHandle* handle_of(const c10::StorageImpl* storage);

// Live device-buffer bytes per device (what torch.tpu.memory_allocated reports, as cuda does).
struct MemoryStats {
  int64_t allocated_bytes = 0;
  int64_t peak_bytes = 0;
  int64_t live_buffers = 0;
  int64_t total_buffers = 0;
  int64_t live_storages = 0;
  int64_t donated_bytes = 0;
};
MemoryStats memory_stats(c10::DeviceIndex device);
void reset_peak_memory(c10::DeviceIndex device);
void note_storage(c10::DeviceIndex device, int delta);

// Python references dropped where the GIL may not be held; released by the runtime with the GIL.
void queue_release(_object* obj);
std::vector<_object*> take_releases();

}  // namespace torchtpu
