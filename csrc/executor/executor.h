#pragma once
// The per-op hot path and the three modes as policies of one path:
//   strict  record the op's node, cut (launch) at once, return (asynchronous)
//   debug   strict, then wait for the results and verify the op's checks at the op
//   fused   record only; cut at host reads, syncs, fallbacks, a mode switch, the size cap and the
//           repeated-structure rule
// Every op with a lowering rule is one boxed C++ kernel: it builds the argument signature, looks it up, and on
// a hit records the node without running any Python (strict and debug then make the one jaxlib call that
// launches). On a miss the Python rules lower the signature once.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/kinds.h"

struct _object;

namespace torchtpu {

void set_mode(Mode m);
Mode get_mode();

// Eager bucketed rows (torchtpu/shapes/eager_buckets.py): whether signatures look for bucketed tensors, and a storage's
// valid rows (rows < 0: not bucketed). rows_of: (rows, row bytes) of t's storage.
// Eager bucketing on or off, and the policy's bucket sizes (empty: powers of two) for uploads whose dim 0 varies.
void set_eager_buckets(bool on, std::vector<int64_t> row_buckets);
// This thread's uploads stay exact (true) or may be bucketed when their dim 0 varies (false); returns the previous.
bool set_exact_uploads(bool on);
void set_rows(const at::Tensor& t, int64_t rows, int64_t row_bytes);
std::pair<int64_t, int64_t> rows_of(const at::Tensor& t);
// (L, L's bucket, shape codes) of t's storage when it holds a compact tensor whose sizes follow a varying inner size
// L (executor/sym.h); L = -1 otherwise.
std::tuple<int64_t, int64_t, std::vector<int64_t>> sym_of(const at::Tensor& t);
// empty_like's result for a tensor whose dim 0 walks bucketed rows: the same rows in a storage of the capacity
// (zeros_like / ones_like / full_like of a routed tensor stay bucketed); otherwise `out` as it is.
at::Tensor bucketed_like(const at::Tensor& self, at::Tensor out);
// A new contiguous tensor whose sizes include the current varying inner size L (the last upload's, +-1): compact in
// a storage of its sizes at L's bucket, marked with L; undefined when none does (or buckets are off). The caller
// holds a device guard.
at::Tensor sym_empty(c10::IntArrayRef size, at::ScalarType dtype);

void register_kernels(const std::vector<std::string>& op_names);

// Records a fragment built by Python for real tensors (the Python kernels: copies, host reads of views).
// storage_params: a tensor per fragment storage parameter (its storage's value is read); results: a tensor
// per fragment result (its storage takes the value). Scalars are packed as given.
void record_fragment(int32_t fragment, const std::vector<at::Tensor>& storage_params,
                     const std::vector<double>& fscalars, const std::vector<int64_t>& iscalars,
                     const std::vector<at::Tensor>& results, const std::string& line);

// The device buffer holding t's storage, launching what is pending first (a host read). A new reference to
// the jax Array, or nullptr when the storage was never written. Raises the producing op's failure.
_object* storage_buffer(const at::Tensor& t, int cause);
// Makes t's storage hold `array` (a jax Array on t's device, of the given type); steals the reference.
void set_storage_buffer(const at::Tensor& t, _object* array, at::ScalarType dtype, const std::vector<int64_t>& shape);
// The host copy of t's storage value (DeviceBuffer::host) as a flat CPU tensor; undefined when there is none.
at::Tensor storage_host_values(const at::Tensor& t);
// Uploads of at most this many bytes keep their host copy (0: none; torchtpu/shapes/eager_buckets.py sets it with the
// policy).
void set_upload_host_copies(int64_t max_bytes);
// (shape, dtype) of t's storage's value, or false when empty.
bool storage_value_type(const at::Tensor& t, std::vector<int64_t>* shape, at::ScalarType* dtype);

void synchronize(int64_t device, int cause);  // device < 0: every device

struct ExecCounters {
  int64_t ops = 0, hits = 0, misses = 0, python_kernels = 0, specializations = 0, entries = 0;
  int64_t bucket_exact = 0;  // calls with bucketed tensors that the rules ran at their exact sizes
  int64_t upload_rows = 0;   // uploads given a bucket's capacity (their dim 0 varies)
  int64_t upload_sym = 0;    // uploads marked with a varying inner size
};
ExecCounters exec_counters();
std::vector<std::pair<std::string, int64_t>> op_counts();  // ops dispatched to the C++ kernel, by name
void reset_counters();

}  // namespace torchtpu
