#pragma once
// A node of the pending graph: one op's fragment applied to its inputs (the values of its storages when it
// was recorded) and its runtime scalars. Strict mode cuts after every node; fused mode after many.
#include <c10/util/SmallVector.h>

#include <memory>
#include <string>
#include <vector>

#include "core/storage.h"

namespace torchtpu {

struct Fragment;

struct ValueRef {  // one input of a node: a materialized buffer, or a result of an earlier node
  BufferPtr leaf;
  NodePtr node;
  int32_t index = 0;
};

struct Node : c10::intrusive_ptr_target {
  enum class State : uint8_t { kPending, kLaunched, kFailed };
  int32_t fragment = -1;
  const Fragment* frag = nullptr;
  c10::DeviceIndex device = 0;
  State state = State::kPending;
  int64_t seq = -1;                       // its position among its device's recorded nodes
  int32_t chunk_pos = -1;                 // while a cut detaches its chunk: the node's index in it
  c10::SmallVector<ValueRef, 4> inputs;   // storage parameters, in the fragment's order
  c10::SmallVector<double, 2> fscalars;   // float/complex runtime scalars, in the fragment's order
  c10::SmallVector<int64_t, 2> iscalars;  // integer/bool scalars and random-number states
  c10::SmallVector<int32_t, 2> live;      // per result: storage handles pointing at it
  // per result (when set): the input holding the value it supersedes in a storage (-1: none), so a chunk's
  // program can write the result over that input's buffer in place (graph.cpp, tf.aliasing_output)
  c10::SmallVector<int32_t, 2> replaces;
  c10::SmallVector<BufferPtr, 2> results;  // after launch: the results that were chunk outputs
  std::shared_ptr<const std::string> error;
  std::string line;  // the Python line that recorded it (debug mode, checked ops)
};

// A launched node keeps each result a storage handle (live) or an unlaunched node's input may still read. Once
// nothing but handles holds the node (`others`: the references its caller holds besides), a result no handle
// points at is read by no one: dropping it lets a later chunk overwrite that buffer in place (graph.cpp donates a
// leaf only when nothing else holds it). Without this, a kept output of one compiled decode step (its token) kept
// the step's whole KV cache from being donated to the next one: a copy of every layer's cache per token.
inline void drop_unread_results(const NodePtr& n, int64_t others) {
  if (n->state != Node::State::kLaunched) return;
  int64_t handles = 0;
  for (const auto l : n->live) handles += l;
  if (static_cast<int64_t>(n.use_count()) != handles + others) return;
  for (size_t r = 0; r < n->results.size() && r < n->live.size(); ++r) {
    if (n->live[r] == 0) n->results[r].reset();
  }
}

}  // namespace torchtpu
