#pragma once
// Inside csrc/graph: a chunk detached from a device's pending graph, and its program text (graph.cpp), shared
// with the compiled-graph capture (capture.cpp).
#include <array>
#include <string>
#include <utility>
#include <vector>

#include "graph/graph.h"

namespace torchtpu {

struct Chunk {
  c10::DeviceIndex device = 0;
  std::vector<NodePtr> nodes;
  std::vector<BufferPtr> leaves;
  std::vector<bool> donated;
  std::vector<int32_t> alias;  // per leaf: the output written over its buffer in place (-1: none)
  // per node, per input: (leaf index, -1) or (-1, local node index) and the result index
  std::vector<c10::SmallVector<std::array<int32_t, 3>, 4>> wiring;
  std::vector<std::pair<int32_t, int32_t>> outputs;  // (local node, result)
  std::string key;
  std::string failure;  // an input's producer failed: the chunk is not launched
};

struct ChunkBody {
  std::string calls;                                       // one line per op, values %n<node>[#<result>]
  std::vector<std::pair<std::string, std::string>> funcs;  // the private functions called: (name, text)
  std::vector<std::string> names;
  std::vector<std::string> rng_types;  // baked: the type of each random-number parameter %r<k>, in order
  std::string value(const Chunk& c, int32_t node, int32_t result) const;
};
ChunkBody chunk_body(const Chunk& c, int64_t nf, int64_t ni, bool baked);
// The chunk's module: @main calls each node's fragment, with the scalars unpacked from the two vectors (nf float64
// and ni int64 scalars).
std::string chunk_text(const Chunk& c, int64_t nf, int64_t ni);

// Detaches every pending node of the device (caller holds the cut lock and exec_mutex()); with `capture`, the
// device's capture ends and the window of the repeated-structure rule is cleared.
Chunk detach_all(c10::DeviceIndex device);
// Compiles (cached) and runs a detached chunk. Caller holds the cut lock only.
void launch_detached(Chunk& c, CutCause cause);
std::recursive_mutex& cut_mutex();

}  // namespace torchtpu
