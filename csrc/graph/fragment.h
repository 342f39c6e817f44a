#pragma once
// Fragments: the lowered form of one op for one signature, a private StableHLO function
//   func.func private @f<id>(storage values..., runtime scalars...) -> (new storage values..., [checks])
// built once by the Python rules on a cache miss. A chunk's program calls the fragments of its nodes.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/kinds.h"
#include "core/storage.h"

namespace torchtpu {

struct ScalarParam {
  ScalarKind kind;
  std::string type;  // MLIR type of the parameter, e.g. tensor<f32>
};

struct Fragment {
  int32_t id = -1;
  std::string name;                                       // @f<id> without the @
  std::string label;                                      // op and argument shapes, for errors
  std::string text;                                       // the private function
  std::vector<std::pair<std::string, std::string>> deps;  // private functions it calls: (name, text)
  std::vector<ValueType> params;                          // storage parameters
  std::vector<std::string> param_types;
  std::vector<ScalarParam> scalars;
  std::vector<ValueType> results;
  std::vector<std::string> result_types;
  bool has_check = false;  // the last result is the int64 vector of device-side checks
  int32_t n_fscalars = 0;
  int32_t n_iscalars = 0;
};

int32_t register_fragment(Fragment f);  // deduplicated by text; returns the id
const Fragment& fragment(int32_t id);

std::string mlir_type(const ValueType& t);

}  // namespace torchtpu
