#pragma once
// What the op table holds per argument signature: how to run the op without any Python (which fragment, where
// each of its parameters comes from, which storages its results become, the outputs' metadata).
#include <ATen/core/stack.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/kinds.h"

namespace torchtpu {

struct ArgPath {  // an argument of the op, or an element of a list argument
  int32_t arg = 0;
  int32_t elem = -1;
};

struct ScalarSource {
  SourceKind kind = SourceKind::kArg;
  ArgPath path;           // kArg, kCpuTensor; kRng: the generator argument (arg -1: the device's default);
                          // kRows: path.arg is the row class whose valid row count the op reads;
                          // kSym: the call's varying inner size L
  int64_t increment = 0;  // kRng: how far the op advances the generator's offset
};

struct OutputSpec {
  OutputKind kind = OutputKind::kNone;
  ArgPath path;                // kArg: the argument returned (in-place and out= ops)
  std::vector<int64_t> sizes;  // kNew
  std::vector<int64_t> strides;
  at::ScalarType dtype = at::kFloat;
  // kNew of a bucketed signature: dim `rows_dim` has the capacity in `sizes` and the valid row count of row class
  // `rows_class` in the tensor returned (its storage stays bucketed, rows of strides[rows_dim] elements)
  int32_t rows_class = -1;
  int32_t rows_dim = -1;
  // kNew of a signature with a varying inner size: per dim, its size as a form code (sym_code: a * L^p + b) or a
  // static size; the storage gets the bytes of these sizes at the capacity, the tensor is contiguous at L
  std::vector<int64_t> sym_sizes;
};

struct ResultTarget {    // a fragment result becomes the value of ...
  int32_t storage = -1;  // ... the op's k-th distinct argument storage, or
  int32_t output = -1;   // ... the storage of new output j, or
  ArgPath arg{-1, -1};   // ... the storage of an out= argument resized by the entry
};

struct Entry {
  // kExact: a bucketed signature the rules do not take bucketed; the op is keyed again at its exact sizes
  EntryKind kind = EntryKind::kProgram;
  int32_t fragment = -1;                // -1: nothing to compute (outputs are empty)
  std::vector<int32_t> storage_params;  // per fragment storage parameter: the argument storage index
  std::vector<ScalarSource> scalar_params;
  std::vector<ResultTarget> results;
  std::vector<OutputSpec> outputs;
  Returns returns = Returns::kSingle;
  std::vector<ArgPath> value_slots;  // Scalar arguments whose value the rule looked at (keyed by value)
  // out= arguments that arrive empty and are resized to these sizes first (arange(n) -> arange.start_out)
  std::vector<std::pair<ArgPath, std::vector<int64_t>>> resizes;
  bool capture_line = false;  // the fragment has device-side checks: remember the Python line
};

}  // namespace torchtpu
