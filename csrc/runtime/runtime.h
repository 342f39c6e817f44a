#pragma once
// The runtime boundary: the only code that touches Python objects (jax Arrays, the Python lowering rules, the
// jaxlib launchers). Every function here takes the GIL itself; callers must not hold exec_mutex().
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/storage.h"
#include "executor/entry.h"

namespace torchtpu {
namespace runtime {

// The name the rule tables know an op by: "add.Tensor" for aten ops, "ns::name[.overload]" for other namespaces
// (torchtpu.jax_op's ops).
std::string op_name(const c10::FunctionSchema& schema);

// A cache miss of the op table: the Python rules lower this signature (the op's arguments are the last nargs
// values of the stack; runtime_slots name the Scalar arguments that are runtime values; storages lists each
// distinct argument storage's token and value type, has_value false when it was never written).
struct LowerRequest {
  const c10::OperatorHandle* op = nullptr;
  const torch::jit::Stack* stack = nullptr;
  size_t nargs = 0;
  c10::DeviceIndex device = 0;
  std::vector<ArgPath> runtime_slots;
  std::vector<uint64_t> storage_tokens;
  std::vector<ValueType> storage_types;
  std::vector<bool> storage_has_value;
  std::string key;  // the signature, valid in any process: the op's name, then its argument signature
  // bucketed tensor arguments: (path, dim walking the rows, row class, capacity rows); rows: per class, valid rows
  struct Bucketed {
    ArgPath path;
    int32_t dim, cls;
    int64_t capacity;
  };
  std::vector<Bucketed> bucketed;
  std::vector<int64_t> rows;
  // a varying inner size: its value and bucket, and per value of a tensor argument taken as a form of it
  // (path, slot: size d, then ndim + stride d, then 2 * ndim for the offset; its form code)
  int64_t sym = -1, sym_cap = 0;
  struct SymForm {
    ArgPath path;
    int32_t slot;
    int64_t code;
  };
  std::vector<SymForm> sym_forms;
};
Entry lower_op(const LowerRequest& req);

// Runs the op's Python kernel on the stack (the signatures the C++ path does not take).
void run_python_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// Compiles a chunk's module (through the Python cache) and returns a launcher: a callable taking the leaf
// arrays then the packed scalars (a float64 and an int64 vector, each only when not empty) and returning
// the result arrays. A new reference.
_object* compile_chunk(const std::string& text, c10::DeviceIndex device, const std::vector<ValueType>& leaves,
                       int64_t n_fscalars, int64_t n_iscalars, const std::vector<ValueType>& results);

// Runs a launcher; returns new references to the results. Throws c10::Error with Python's message.
std::vector<_object*> launch(_object* launcher, const std::vector<_object*>& leaves,
                             const std::vector<double>& fscalars, const std::vector<int64_t>& iscalars);

// A new device buffer holding a contiguous CPU tensor's values (one copy, jaxlib's C++ device_put). New ref.
_object* upload(const at::Tensor& host, c10::DeviceIndex device);

// Waits for arrays (debug mode); throws with the failure.
void wait(const std::vector<_object*>& arrays);
// Waits for every live array of the device (synchronize).
void wait_all(c10::DeviceIndex device);

// Hands a chunk's device-side check vectors to Python (verified now in debug mode, later otherwise); steals
// the references.
void submit_checks(const std::vector<_object*>& arrays, const std::vector<int32_t>& fragments,
                   const std::vector<std::string>& lines, bool now);

// The innermost Python line outside torch and torchtpu ("file.py:12").
std::string user_line();

// Drops the Python references queued by DeviceBuffer destructors (called with the GIL held).
void release_queued_locked_gil();

void incref(_object* o);
void decref(_object* o);

}  // namespace runtime
}  // namespace torchtpu
