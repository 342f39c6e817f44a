#pragma once
// Internal to csrc/executor: the argument signature of an op call (the op table's key: signature.cpp), the per-op
// schema facts it is built from, and the state that bucketed rows (rows.cpp) and varying uploads (upload.cpp)
// share with the boxed kernel (kernel.cpp).
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/DispatchKeySet.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "executor/entry.h"
#include "runtime/runtime.h"

namespace torchtpu {

constexpr c10::DispatchKeySet kTpuKeys{c10::DispatchKey::PrivateUse1};

// -- per-op schema facts, computed once ------------------------------------------------------------------------
enum class ArgKind : uint8_t { kTensor, kTensorList, kOptTensorList, kNumber, kNumberList, kOther };

struct OpInfo {
  std::string name;      // overload name as the rules know it, e.g. "add.Tensor"
  bool is_copy = false;  // copy_: host -> tpu copies take the upload path
  std::vector<ArgKind> kinds;
  std::vector<bool> written;  // the op writes the argument (in-place self, out=)
  size_t nargs = 0;
  std::atomic<int64_t> count{0};
};

OpInfo* op_info(const c10::OperatorHandle& op);
std::vector<std::pair<std::string, int64_t>> op_counts();
void reset_op_counts();

// -- the argument signature ---------------------------------------------------------------------------------
struct Sig {
  std::string key;
  std::vector<c10::StorageImpl*> storages;  // distinct argument storages, in order of first appearance
  std::vector<ArgPath> runtime_slots;       // Scalar arguments passed as runtime values
  c10::DeviceIndex device = -1;
  bool python = false;  // something the C++ path does not take: the Python kernel runs
  // bucketed rows: a tensor walking the valid rows of a bucketed storage is keyed by its capacity, its row count
  // is a runtime value of its row class (tensors of equal counts share one)
  bool bucketing = false;  // look for bucketed tensors (off: every tensor at its exact sizes)
  std::vector<runtime::LowerRequest::Bucketed> bucketed;
  std::vector<int64_t> rows;      // per row class: the valid rows
  std::vector<int64_t> capacity;  // per row class: the capacity of its first tensor
  // stride-0 dims of exact tensors (autograd's expanded gradients): a class's rows broadcast, when the size is one
  struct Broadcast {
    size_t offset;  // of the size in the key
    ArgPath path;
    int32_t dim;
    int64_t size;
  };
  std::vector<Broadcast> broadcast;
  int32_t tensors = 0;  // tensor arguments
  // a varying inner size L (storages marked by an upload or an earlier such op): its value and bucket, and each
  // value of a tensor argument on such a storage that the key holds as a form of L
  int64_t sym = -1, sym_cap = 0;
  bool sym_ints = false;  // a call without tensors (a factory): its int arguments may stand for the current L
  std::vector<runtime::LowerRequest::SymForm> sym_forms;
};

void build_sig(const OpInfo& info, const torch::jit::Stack& stack, Sig& s);

template <typename T>
void put(std::string& key, T v) {
  key.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

// The dim of t that walks the valid rows of its bucketed storage (size: the valid rows, stride: a row; every other
// dim and the offset within one row), or -1. The caller holds exec_mutex().
int32_t rows_dim(const at::Tensor& t, c10::StorageImpl* st);

// -- bucketed rows and a varying inner size (rows.cpp, upload.cpp) -----------------------------------------------
extern std::atomic<bool> g_eager_buckets;  // torchtpu.set_shape_buckets: look for bucketed tensors
// The varying inner size of the last upload that had one, and its bucket: what a factory's size argument equal to
// it (arange(L) for position ids, a mask's ones(L, L)) is taken for.
extern std::atomic<int64_t> g_current_sym, g_current_sym_cap;
constexpr int64_t kSymMinCapacity = 16;  // shorter varying sizes are keyed exactly (few sizes, easy misreadings)

// The counts of the latest bucketed storages, newest first: an op whose only tensors are expanded to such a count
// (autograd's mean backward: the gradient expanded to the rows, then divided; slice and gather backwards' zeros)
// has no bucketed tensor to take the class from. Its stride-0 dim joins the count's rows (values equal along it,
// so the rows past the count are padding like any other); the rules check the op as for any bucketed tensor.
struct RecentRows {
  std::mutex mu;
  std::array<std::pair<int64_t, int64_t>, 8> counts{};  // (rows, capacity)
  void note(int64_t rows, int64_t capacity) {
    std::lock_guard<std::mutex> lk(mu);
    size_t k = 0;
    while (k + 1 < counts.size() && counts[k].first != rows) ++k;
    for (; k > 0; --k) counts[k] = counts[k - 1];
    counts[0] = {rows, capacity};
  }
  int64_t capacity_of(int64_t rows) {
    std::lock_guard<std::mutex> lk(mu);
    for (const auto& c : counts) {
      if (c.first == rows) return c.second;
    }
    return -1;
  }
};
RecentRows& recent_rows();

// A contiguous tensor whose sizes are these codes at L, compact in a storage of their sizes at L's bucket `cap`,
// marked with L (an empty one is not: nothing of it is read).
at::Tensor sym_tensor(c10::ArrayRef<int64_t> codes, int64_t L, int64_t cap, at::ScalarType dtype);
// A contiguous tensor of these sizes compact in a storage of its sizes at L's bucket `cap`; known (view_forms's
// answers per size, or none): a form code, 1 (static) or 0 (int_form: a size a * L + b is taken for that form).
// Undefined when no size follows L.
at::Tensor sym_alloc(c10::IntArrayRef size, at::ScalarType dtype, int64_t L, int64_t cap,
                     c10::ArrayRef<int64_t> known = {});

// copy_ from the host into a tpu tensor (upload.cpp).
void upload(const at::Tensor& self, const at::Tensor& src);
bool covers_storage(const at::Tensor& t);
void count_host_read();                                   // a host read: a period of the upload sources' ranks
extern std::atomic<int64_t> g_upload_rows, g_upload_sym;  // uploads bucketed along rows / a varying inner size

}  // namespace torchtpu
