#pragma once
// The small enums that cross the Python/C++ seam: the eager mode, why a pending graph was cut, and the kinds an
// op-table entry is made of. They sit below executor/ and graph/ so both can use them, and module.cpp exports each
// with py::enum_ (torchtpu._C.Mode, _C.CutCause, ...): Python names them instead of matching positions.
#include <cstdint>

namespace torchtpu {

enum class Mode : int { kStrict = 0, kDebug = 1, kFused = 2 };

enum class CutCause : int {
  kOp = 0,    // strict and debug: after every op
  kHostRead,  // .item(), .cpu(), printing, a host copy
  kSync,      // torchtpu.sync(), torch.tpu.synchronize()
  kSizeCap,   // the pending graph reached TORCHTPU_FUSED_MAX_OPS
  kRepeat,    // the repeated-structure rule: a period of the op sequence ended
  kModeSwitch,
  kFallback,       // a CPU fallback or Python kernel reads values
  kDataDependent,  // an output size depends on values
  kCollective,     // a collective (torchtpu/distributed.py) reads its inputs' buffers
  kProgram,        // fused: a compiled graph's program node of TORCHTPU_FUSED_PROGRAM_CUT_OPS ops or more launches now
  kCount
};
const char* cut_cause_name(CutCause c);

// How a runtime scalar travels: packed into the chunk's float64 or int64 vector and converted in the program
// (graph/fragment.h ScalarParam).
enum class ScalarKind : uint8_t {
  kFloat = 0,    // one f64 entry, converted to the parameter's float type
  kInt = 1,      // one i64 entry, converted to the parameter's integer type
  kBool = 2,     // one i64 entry, != 0
  kComplex = 3,  // two f64 entries (real, imaginary)
  kRng = 4,      // two i64 entries, the generator's (seed, offset), bitcast to tensor<2xui64>
};
// Where a fragment's scalar parameter comes from (executor/entry.h ScalarSource).
enum class SourceKind : uint8_t { kArg = 0, kCpuTensor = 1, kRng = 2, kRows = 3, kSym = 4 };
// What an op returns in each output position (executor/entry.h OutputSpec).
enum class OutputKind : uint8_t { kNew = 0, kArg = 1, kNone = 2 };
// How an op-table entry runs the op: its fragment, the Python kernel, or keyed again at exact sizes.
enum class EntryKind : uint8_t { kProgram = 0, kPython = 1, kExact = 2 };
enum class Returns : uint8_t { kSingle = 0, kTuple = 1, kList = 2, kNothing = 3 };

}  // namespace torchtpu
