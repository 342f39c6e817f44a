#include "core/storage.h"

#include <atomic>

#include "graph/node.h"

namespace torchtpu {
namespace {

std::atomic<int64_t> g_live_storages[kMaxDevices];

std::mutex g_release_mu;
std::vector<_object*> g_release;

}  // namespace

int64_t ValueType::numel() const {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

std::recursive_mutex& exec_mutex() {
  static std::recursive_mutex mu;
  return mu;
}

struct AtomicStats {
  std::atomic<int64_t> allocated{0}, peak{0}, live{0}, total{0}, donated{0};
};
AtomicStats g_buffers[kMaxDevices];

void add_bytes(c10::DeviceIndex device, int64_t n) {
  auto& s = g_buffers[device];
  const int64_t now = s.allocated.fetch_add(n) + n;
  int64_t peak = s.peak.load();
  while (now > peak && !s.peak.compare_exchange_weak(peak, now)) {
  }
}

DeviceBuffer::DeviceBuffer(_object* a, ValueType t, c10::DeviceIndex d) : array(a), type(std::move(t)), device(d) {
  add_bytes(device, type.nbytes());
  g_buffers[device].live += 1;
  g_buffers[device].total += 1;
}

DeviceBuffer::~DeviceBuffer() {
  if (!donated) add_bytes(device, -type.nbytes());
  g_buffers[device].live -= 1;
  if (array) queue_release(array);
}

void DeviceBuffer::mark_donated() {
  if (donated) return;
  donated = true;
  add_bytes(device, -type.nbytes());
  g_buffers[device].donated += type.nbytes();
}

void StorageHandle::clear() {
  if (state == State::kPending && node) {
    node->live[index] -= 1;
    drop_unread_results(node, 1);
  }
  buffer.reset();
  node.reset();
  error.reset();
  state = State::kEmpty;
}

void StorageHandle::set_buffer(BufferPtr b) {
  clear();
  buffer = std::move(b);
  state = State::kBuffer;
}

void StorageHandle::set_pending(NodePtr n, int32_t i) {
  // the node reads the value it replaces here: remember which input (an in-place update)
  if (state == State::kBuffer || state == State::kPending) {
    for (size_t k = 0; k < n->inputs.size(); ++k) {
      const ValueRef& in = n->inputs[k];
      const bool same = state == State::kBuffer ? (in.leaf && in.leaf.get() == buffer.get())
                                                : (in.node && in.node.get() == node.get() && in.index == index);
      if (same) {
        if (n->replaces.size() <= static_cast<size_t>(i)) n->replaces.resize(i + 1, -1);
        n->replaces[i] = static_cast<int32_t>(k);
        break;
      }
    }
  }
  n->live[i] += 1;  // before clear(): the node may be the one this handle points at now
  clear();
  node = std::move(n);
  index = i;
  state = State::kPending;
}

void StorageHandle::set_failed(std::shared_ptr<const std::string> e) {
  clear();
  error = std::move(e);
  state = State::kFailed;
}

void StorageHandle::resolve() {
  if (state != State::kPending) return;
  if (node->state == Node::State::kLaunched) {
    BufferPtr b = node->results[index];
    TORCH_INTERNAL_ASSERT(b, "tpu: a launched node lost a live result");
    set_buffer(std::move(b));
  } else if (node->state == Node::State::kFailed) {
    set_failed(node->error);
  }
}

bool StorageHandle::value_type(ValueType* out) {
  resolve();
  switch (state) {
    case State::kBuffer: *out = buffer->type; return true;
    case State::kPending: return false;  // filled in by the graph, which knows the fragment's result types
    default: return false;
  }
}

StorageHandle* handle_of(const c10::StorageImpl* storage) {
  if (storage == nullptr) return nullptr;
  return static_cast<StorageHandle*>(storage->data_ptr().get_context());
}

StorageHandle* handle_of(const c10::Storage& storage) { return handle_of(storage.unsafeGetStorageImpl()); }

MemoryStats memory_stats(c10::DeviceIndex device) {
  MemoryStats s;
  const auto& b = g_buffers[device];
  s.allocated_bytes = b.allocated.load();
  s.peak_bytes = b.peak.load();
  s.live_buffers = b.live.load();
  s.total_buffers = b.total.load();
  s.donated_bytes = b.donated.load();
  s.live_storages = g_live_storages[device].load();
  return s;
}

void reset_peak_memory(c10::DeviceIndex device) { g_buffers[device].peak = g_buffers[device].allocated.load(); }

void note_storage(c10::DeviceIndex device, int delta) { g_live_storages[device] += delta; }

std::atomic<int64_t> g_release_count{0};

void queue_release(_object* obj) {
  std::lock_guard<std::mutex> lk(g_release_mu);
  g_release.push_back(obj);
  g_release_count += 1;
}

std::vector<_object*> take_releases() {
  std::vector<_object*> out;
  if (g_release_count.load(std::memory_order_relaxed) == 0) return out;
  std::lock_guard<std::mutex> lk(g_release_mu);
  out.swap(g_release);
  g_release_count = 0;
  return out;
}

}  // namespace torchtpu
