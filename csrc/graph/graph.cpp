#include "graph/graph.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <list>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "graph/chunk.h"
#include "graph/fragment.h"
#include "runtime/runtime.h"

namespace torchtpu {
namespace {

// -- the repeated-structure rule ---------------------------------------------------------------------------
// Each node gets a structural hash (its fragment, and for each input whether it is a leaf or how many nodes
// back its producer was recorded). A period p is found when the node hash repeats p nodes back and the last p
// hashes equal the p before them (rolling prefix hashes make that O(1)). Once the pending graph is at least
// repeat_min_ops long, the cut falls at the start of the last period, so that the layers of a model and the
// steps of a loop are cut alike and one executable serves every repeat.
constexpr uint64_t kBase = 0x100000001b3ULL;

struct RepeatWindow {
  static constexpr size_t kSlots = 4096;  // direct-mapped: a collision only forgets a candidate period
  std::vector<uint64_t> hashes;
  std::vector<uint64_t> prefix{0};  // prefix[i] = hash of hashes[0..i)
  std::vector<int64_t> weights{0};  // weights[i] = the weight of nodes [0..i) (node_weight)
  std::vector<uint64_t> powers{1};
  std::vector<std::pair<uint64_t, int64_t>> last = std::vector<std::pair<uint64_t, int64_t>>(kSlots, {0, -1});
  int64_t period = 0;  // the longest period seen since the last cut, and where its repeats start (mod period)
  int64_t phase = 0;

  void clear() {
    hashes.clear();
    prefix.assign(1, 0);
    weights.assign(1, 0);
    std::fill(last.begin(), last.end(), std::make_pair<uint64_t, int64_t>(0, -1));
    period = phase = 0;
  }
  uint64_t segment(int64_t lo, int64_t hi) {  // hash of hashes[lo..hi)
    while (static_cast<int64_t>(powers.size()) <= hi - lo) powers.push_back(powers.back() * kBase);
    return prefix[hi] - prefix[lo] * powers[hi - lo];
  }
  // Appends a node hash and weight; returns the period that just repeated (0 if none). A period is at least
  // min_period nodes long, or min_period_weight heavy (a few wide nodes: an optimizer step's foreach ops).
  int64_t push(uint64_t h, int64_t w, int64_t min_period, int64_t min_period_weight) {
    const int64_t i = static_cast<int64_t>(hashes.size());
    hashes.push_back(h);
    prefix.push_back(prefix.back() * kBase + h);
    weights.push_back(weights.back() + w);
    int64_t period = 0;
    auto& slot = last[h % kSlots];
    if (slot.second >= 0 && slot.first == h) {
      const int64_t p = i - slot.second;
      const bool long_enough = p >= min_period || weights[i + 1] - weights[i + 1 - p] >= min_period_weight;
      if (long_enough && i + 1 >= 2 * p && segment(i + 1 - p, i + 1) == segment(i + 1 - 2 * p, i + 1 - p)) {
        period = p;
      }
    }
    slot = {h, i};
    if (period > this->period) {  // the longest repeat: a training step over the layers inside it
      this->period = period;
      this->phase = (i + 1) % period;
    }
    return period;
  }
  // i + 1 nodes recorded: is that the end of a period?
  bool at_boundary(int64_t n) const { return period > 0 && (n - phase) % period == 0; }
};

struct DeviceGraph {
  std::vector<NodePtr> nodes;  // pending, in record order
  int64_t next_seq = 0;        // seq of the next recorded node (nodes[i]->seq == base + i)
  int64_t base = 0;
  RepeatWindow repeat;
  int64_t repeat_cut = 0;              // > 0: the repeated-structure rule asks to cut before this many nodes
  int64_t weight = 0;                  // the pending nodes' weights (node_weight): what the size rules count
  int64_t programs_since_read = 0;     // the program rule (program_cut_wanted): programs recorded since the last
  int64_t programs_between_reads = 0;  // host read, and between the two reads before it
};

// A node's weight: the tensors it writes. The size rules count nodes, and weights too: a graph is long enough
// for the repeated-structure rule once it holds repeat_min_ops nodes or repeat_min_weight weight, and hits the
// size cap at max_ops nodes or kCapWeightFactor * max_ops weight. A foreach op over 29 parameters is 29 ops'
// worth of program, so a loop of few wide nodes (an optimizer step alone: 7-8 foreach nodes over 29 tensors) is
// chunked after a few steps, not after 256 of its nodes (~7,000 tensor updates per chunk, compiled for tens of
// seconds); and its period counts though shorter than kMinPeriod nodes, once it weighs kMinPeriodWeight (Adam's
// foreach step is 7 nodes: it was never cut before the size cap). Measured (README GPT's AdamW step alone, a sync
// every 50 steps): 628 -> 88 ms/step, compiles 127 -> 19 s. Counting weights alone cuts models' steps into
// smaller chunks (a layer norm writes 3 tensors) and measured slower (bench/eager.py, fused README GPT
// 0.94-0.95x -> 1.07-1.12x CPU), so the node counts stay as they were; with both, alternating runs of the fused
// rows are alike (README GPT 0.85-0.93x against 0.91-1.02x before).
constexpr int64_t kCapWeightFactor = 4;
int64_t node_weight(const Node& n) { return std::max<int64_t>(1, static_cast<int64_t>(n.frag->results.size())); }

DeviceGraph g_graphs[kMaxDevices];
std::recursive_mutex g_cut_mu;
GraphCounters g_counters;
int64_t g_max_ops = 4096;
struct CaptureFlags {
  bool on = false;
  bool broken = false;
};
CaptureFlags g_capture[kMaxDevices];
int64_t g_repeat_min_ops = 256;
int64_t g_repeat_min_weight = 1024;
int64_t g_read_split_min_ops = 0;
int64_t g_program_cut_ops = 0;
constexpr int64_t kMinPeriod = 8;
constexpr int64_t kMinPeriodWeight = 64;

// Chunk key -> launcher, least recently used first out: a launcher holds its executable's code pages and
// memory mappings, which a long run over many shapes would otherwise exhaust (XLA:CPU crashes then).
struct ChunkCache {
  size_t capacity = 1024;
  std::list<std::pair<std::string, _object*>> lru;  // front: most recent
  std::unordered_map<std::string, std::list<std::pair<std::string, _object*>>::iterator> index;

  _object* find(const std::string& key) {
    auto it = index.find(key);
    if (it == index.end()) return nullptr;
    lru.splice(lru.begin(), lru, it->second);
    return it->second->second;
  }
  void insert(const std::string& key, _object* launcher) {
    lru.emplace_front(key, launcher);
    index[key] = lru.begin();
    while (lru.size() > capacity) {
      queue_release(lru.back().second);  // dropped with the GIL at the next launch
      index.erase(lru.back().first);
      lru.pop_back();
      g_counters.chunk_cache_evictions += 1;
    }
  }
};
ChunkCache g_chunk_cache;

// The structural hash of a node: its fragment, and per input what produced it (a leaf, or the fragment and
// result index of the producing node). Not where: a value made once (an input batch) and read every step sits
// ever farther back, and not the producer's own hash: a parameter updated every step would chain every step's
// hash to the one before. Two wirings of the same producers hash alike; that only moves a cut, never changes
// what a chunk computes (its key is exact).
uint64_t node_hash(const Node& n) {
  uint64_t h = std::hash<int64_t>()(n.fragment) * 0x9E3779B97F4A7C15ULL;
  for (const auto& in : n.inputs) {
    const int64_t tag = in.node ? (static_cast<int64_t>(in.node->fragment) << 8) + in.index + 1 : 0;
    h = (h ^ static_cast<uint64_t>(tag)) * kBase + 0x27d4eb2d;
  }
  return h;
}

void append_int(std::string& key, int64_t v) {
  if (v >= -64 && v < 64) {  // most values are small: one byte
    key.push_back(static_cast<char>(v + 64));
    return;
  }
  key.push_back(static_cast<char>(-128));
  key.append(reinterpret_cast<const char*>(&v), sizeof(v));
}

void pair_in_place(Chunk& c, bool any_donated);

// Detaches pending nodes of the device into a chunk: the first `count`, or those `selected` marks (in record
// order). Caller holds exec_mutex().
Chunk detach(c10::DeviceIndex device, size_t count, const std::vector<bool>* selected = nullptr) {
  DeviceGraph& g = g_graphs[device];
  Chunk c;
  c.device = device;
  if (selected != nullptr) {
    std::vector<NodePtr> rest;
    for (size_t i = 0; i < g.nodes.size(); ++i) ((*selected)[i] ? c.nodes : rest).push_back(std::move(g.nodes[i]));
    g.nodes.swap(rest);
  } else if (count == g.nodes.size()) {
    c.nodes.swap(g.nodes);
  } else {
    c.nodes.assign(g.nodes.begin(), g.nodes.begin() + count);
    g.nodes.erase(g.nodes.begin(), g.nodes.begin() + count);
  }
  g.weight = 0;
  for (const auto& n : g.nodes) g.weight += node_weight(*n);
  for (size_t j = 0; j < c.nodes.size(); ++j) c.nodes[j]->chunk_pos = static_cast<int32_t>(j);
  // a node of this chunk (the positions are cleared before detach returns)
  auto local_index = [&](const Node* n) -> int32_t {
    return n->state == Node::State::kPending && n->device == device ? n->chunk_pos : -1;
  };
  std::unordered_map<const DeviceBuffer*, int32_t> leaf_index;
  std::vector<int64_t> leaf_refs;
  c.wiring.resize(c.nodes.size());
  c.key.reserve(16 + 8 * c.nodes.size());
  for (size_t j = 0; j < c.nodes.size(); ++j) {
    Node& n = *c.nodes[j];
    for (auto& in : n.inputs) {
      if (in.node) {
        const int32_t src = local_index(in.node.get());
        if (src >= 0) {
          c.wiring[j].push_back({-1, src, in.index});
          continue;
        }
        // a node launched by an earlier chunk: its result is a leaf now
        if (in.node->state == Node::State::kFailed) {
          if (c.failure.empty()) c.failure = *in.node->error;
          c.wiring[j].push_back({0, -1, 0});
          continue;
        }
        TORCH_INTERNAL_ASSERT(in.node->state == Node::State::kLaunched,
                              "tpu: a node reads a value of a node "
                              "that is neither in its chunk nor launched");
        in.leaf = in.node->results[in.index];
        TORCH_INTERNAL_ASSERT(in.leaf, "tpu: a node reads a result its chunk did not keep");
        const NodePtr from = std::move(in.node);
        drop_unread_results(from, 1);
      }
      int32_t li = -1;
      if (c.leaves.size() <= 16) {  // few leaves (strict mode): a scan beats a hash map
        for (size_t k = 0; k < c.leaves.size(); ++k) {
          if (c.leaves[k].get() == in.leaf.get()) {
            li = static_cast<int32_t>(k);
            break;
          }
        }
      } else {
        if (leaf_index.empty()) {
          for (size_t k = 0; k < c.leaves.size(); ++k) leaf_index.emplace(c.leaves[k].get(), static_cast<int32_t>(k));
        }
        auto it = leaf_index.find(in.leaf.get());
        if (it != leaf_index.end()) li = it->second;
      }
      if (li < 0) {
        li = static_cast<int32_t>(c.leaves.size());
        if (!leaf_index.empty()) leaf_index.emplace(in.leaf.get(), li);
        c.leaves.push_back(in.leaf);
        leaf_refs.push_back(0);
      }
      leaf_refs[li] += 1;
      c.wiring[j].push_back({li, -1, 0});
    }
  }
  // Values the remaining pending nodes read are outputs too.
  std::vector<std::vector<bool>> from_rest(g.nodes.empty() ? 0 : c.nodes.size());
  for (size_t j = 0; j < from_rest.size(); ++j) from_rest[j].assign(c.nodes[j]->live.size(), false);
  for (const auto& n : g.nodes) {
    for (const auto& in : n->inputs) {
      if (!in.node) continue;
      const int32_t src = local_index(in.node.get());
      if (src >= 0) from_rest[src][in.index] = true;
    }
  }
  // Outputs: results a live storage or a later pending node needs, and every check vector.
  append_int(c.key, device);  // an executable is compiled for one device
  append_int(c.key, static_cast<int64_t>(c.nodes.size()));
  for (size_t j = 0; j < c.nodes.size(); ++j) {
    const Node& n = *c.nodes[j];
    const Fragment& f = *n.frag;
    append_int(c.key, n.fragment);
    for (const auto& w : c.wiring[j]) {
      append_int(c.key, w[0]);
      append_int(c.key, w[1]);
      append_int(c.key, w[2]);
    }
    for (size_t r = 0; r < n.live.size(); ++r) {
      const bool check = f.has_check && r + 1 == n.live.size();
      if (n.live[r] > 0 || (!from_rest.empty() && from_rest[j][r]) || check) {
        c.outputs.emplace_back(static_cast<int32_t>(j), r);
      }
    }
  }
  append_int(c.key, -1);
  for (const auto& o : c.outputs) {
    append_int(c.key, o.first);
    append_int(c.key, o.second);
  }
  // Donation: a leaf nothing outside this chunk holds (no storage, no other node) is overwritten in place.
  append_int(c.key, -2);
  c.donated.assign(c.leaves.size(), false);
  // (a leaf's type is its fragment parameter's: the wiring already keys it)
  bool any_donated = false;
  for (size_t li = 0; li < c.leaves.size(); ++li) {
    const auto held = static_cast<int64_t>(c.leaves[li].use_count());
    if (held == 1 + leaf_refs[li]) {
      c.donated[li] = true;
      any_donated = true;
      append_int(c.key, static_cast<int64_t>(li));
    }
  }
  pair_in_place(c, any_donated);
  for (auto& n : c.nodes) n->chunk_pos = -1;
  return c;
}

// In-place pairs: a donated leaf and the output that is its storage's new value (the end of the chain of nodes
// each of which overwrites the value before it in a storage), which the program writes over the leaf's buffer
// (tf.aliasing_output). Left to XLA (jax.buffer_donor), donors are matched to outputs by type alone: a parameter
// given its moment's buffer makes XLA copy both in and out (AdamW: every tensor twice).
void pair_in_place(Chunk& c, bool any_donated) {
  c.alias.assign(c.leaves.size(), -1);
  if (!any_donated) return;
  auto at = [](int64_t j, int64_t r) { return (j << 32) | r; };
  std::unordered_map<int64_t, int32_t> output_of;
  for (size_t k = 0; k < c.outputs.size(); ++k) output_of.emplace(at(c.outputs[k].first, c.outputs[k].second), k);
  std::vector<int64_t> first(c.leaves.size(), -1);
  std::unordered_map<int64_t, int64_t> next;  // (node, result) -> the (node, result) that overwrites it
  for (size_t j = 0; j < c.nodes.size(); ++j) {
    const Node& n = *c.nodes[j];
    for (size_t r = 0; r < n.replaces.size(); ++r) {
      const int32_t k = n.replaces[r];
      if (k < 0 || static_cast<size_t>(k) >= c.wiring[j].size()) continue;
      const auto& w = c.wiring[j][k];
      if (w[0] >= 0 && w[1] < 0) {
        if (first[w[0]] < 0) first[w[0]] = at(j, r);
      } else if (w[1] >= 0) {
        next.emplace(at(w[1], w[2]), at(j, r));
      }
    }
  }
  std::vector<bool> taken(c.outputs.size(), false);
  append_int(c.key, -3);
  for (size_t li = 0; li < c.leaves.size(); ++li) {
    if (!c.donated[li] || first[li] < 0) continue;
    int64_t cur = first[li];
    for (size_t hops = 0; hops <= c.nodes.size(); ++hops) {
      auto o = output_of.find(cur);
      if (o != output_of.end()) {
        const auto& out = c.outputs[o->second];
        if (!taken[o->second] && c.nodes[out.first]->frag->result_types[out.second] == mlir_type(c.leaves[li]->type)) {
          taken[o->second] = true;
          c.alias[li] = o->second;
          append_int(c.key, static_cast<int64_t>(li));
          append_int(c.key, o->second);
        }
        break;
      }
      auto nx = next.find(cur);
      if (nx == next.end()) break;
      cur = nx->second;
    }
  }
}

void fail_nodes(const Chunk& c, const std::string& message) {
  auto err = std::make_shared<const std::string>(message);
  for (const auto& n : c.nodes) {
    n->state = Node::State::kFailed;
    n->error = err;
    n->inputs.clear();
  }
  g_counters.failed_chunks += 1;
}

std::string describe_ops(const Chunk& c) {
  std::ostringstream s;
  const size_t shown = std::min<size_t>(c.nodes.size(), 6);
  for (size_t j = 0; j < shown; ++j) {
    const Node& n = *c.nodes[j];
    s << (j ? "; " : "") << n.frag->label;
    if (!n.line.empty()) s << " at " << n.line;
  }
  if (c.nodes.size() > shown) s << "; ... " << c.nodes.size() - shown << " more";
  return s.str();
}

// Compiles (cached) and runs a detached chunk; publishes its results. Holds no lock but the cut lock.
void launch_chunk(Chunk& c, CutCause cause, bool wait) {
  if (c.nodes.empty()) return;
  if (!c.failure.empty()) {
    std::lock_guard<std::recursive_mutex> lk(exec_mutex());
    fail_nodes(c, c.failure);
    TORCH_CHECK(false, c.failure);
  }
  if (c.outputs.empty()) {  // nothing any storage or check still needs: nothing to run
    std::lock_guard<std::recursive_mutex> lk(exec_mutex());
    for (auto& n : c.nodes) {
      n->results.assign(n->live.size(), BufferPtr());
      n->state = Node::State::kLaunched;
      n->inputs.clear();
    }
    g_counters.cuts[static_cast<int>(cause)] += 1;
    g_counters.dead_ops += static_cast<int64_t>(c.nodes.size());
    return;
  }
  int64_t nf = 0, ni = 0;
  for (const auto& n : c.nodes) {
    nf += static_cast<int64_t>(n->fscalars.size());
    ni += static_cast<int64_t>(n->iscalars.size());
  }
  _object* launcher = g_chunk_cache.find(c.key);
  if (launcher != nullptr) {
    g_counters.chunk_cache_hits += 1;
  } else {
    g_counters.chunk_cache_misses += 1;
    std::vector<ValueType> results;
    for (const auto& o : c.outputs) results.push_back(c.nodes[o.first]->frag->results[o.second]);
    std::vector<ValueType> leaf_types;
    for (const auto& l : c.leaves) leaf_types.push_back(l->type);
    try {
      launcher = runtime::compile_chunk(chunk_text(c, nf, ni), c.device, leaf_types, nf, ni, results);
    } catch (const c10::Error& e) {
      std::lock_guard<std::recursive_mutex> lk(exec_mutex());
      const std::string msg = std::string("tpu: compiling a chunk of ") + std::to_string(c.nodes.size()) +
                              " op(s) failed (" + describe_ops(c) + "): " + e.what_without_backtrace();
      fail_nodes(c, msg);
      TORCH_CHECK(false, msg);
    }
    g_chunk_cache.insert(c.key, launcher);
  }
  std::vector<_object*> leaves;
  std::vector<double> fpack;
  std::vector<int64_t> ipack;
  fpack.reserve(nf);
  ipack.reserve(ni);
  for (const auto& l : c.leaves) leaves.push_back(l->array);
  for (const auto& n : c.nodes) {
    fpack.insert(fpack.end(), n->fscalars.begin(), n->fscalars.end());
    ipack.insert(ipack.end(), n->iscalars.begin(), n->iscalars.end());
  }
  std::vector<_object*> outs;
  try {
    outs = runtime::launch(launcher, leaves, fpack, ipack);
  } catch (const c10::Error& e) {
    std::lock_guard<std::recursive_mutex> lk(exec_mutex());
    const std::string msg = std::string("tpu: a chunk of ") + std::to_string(c.nodes.size()) + " op(s) failed (" +
                            describe_ops(c) + "): " + e.what_without_backtrace();
    fail_nodes(c, msg);
    TORCH_CHECK(false, msg);
  }
  TORCH_INTERNAL_ASSERT(outs.size() == c.outputs.size(), "tpu: a chunk returned ", outs.size(), " values for ",
                        c.outputs.size(), " outputs");
  std::vector<_object*> check_arrays;
  std::vector<int32_t> check_frags;
  std::vector<std::string> check_lines;
  {
    std::lock_guard<std::recursive_mutex> lk(exec_mutex());
    for (size_t li = 0; li < c.leaves.size(); ++li) {
      if (c.donated[li]) {
        c.leaves[li]->mark_donated();
        g_counters.donated_buffers += 1;
        g_counters.donated_bytes += c.leaves[li]->type.nbytes();
      }
    }
    for (auto& n : c.nodes) n->results.assign(n->live.size(), BufferPtr());
    for (size_t k = 0; k < outs.size(); ++k) {
      const auto& o = c.outputs[k];
      Node& n = *c.nodes[o.first];
      const Fragment& f = *n.frag;
      if (f.has_check && static_cast<size_t>(o.second) + 1 == n.live.size()) {
        check_arrays.push_back(outs[k]);
        check_frags.push_back(n.fragment);
        check_lines.push_back(n.line);
        continue;
      }
      n.results[o.second] = c10::make_intrusive<DeviceBuffer>(outs[k], f.results[o.second], c.device);
    }
    for (auto& n : c.nodes) {
      n->state = Node::State::kLaunched;
      n->inputs.clear();
      n->fscalars.clear();
      n->iscalars.clear();
    }
    g_counters.chunks += 1;
    g_counters.chunk_ops += static_cast<int64_t>(c.nodes.size());
    int64_t prev = g_counters.chunk_ops_max.load();
    while (prev < static_cast<int64_t>(c.nodes.size()) &&
           !g_counters.chunk_ops_max.compare_exchange_weak(prev, static_cast<int64_t>(c.nodes.size()))) {
    }
    g_counters.cuts[static_cast<int>(cause)] += 1;
    c.leaves.clear();
  }
  if (wait) {
    try {
      runtime::wait(outs);
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, "tpu: ", describe_ops(c), ": ", e.what_without_backtrace());
    }
  }
  if (!check_arrays.empty()) runtime::submit_checks(check_arrays, check_frags, check_lines, wait);
}

void reset_window(c10::DeviceIndex device) {
  DeviceGraph& g = g_graphs[device];
  g.repeat.clear();
  g.repeat_cut = 0;
  for (const auto& n : g.nodes) g.repeat.push(node_hash(*n), node_weight(*n), kMinPeriod, kMinPeriodWeight);
}

}  // namespace

void after_record(c10::DeviceIndex device, Mode mode, bool want_cut, bool program_cut) {
  if (mode != Mode::kFused) {
    cut(device, CutCause::kOp, mode == Mode::kDebug);
  } else if (want_cut) {
    cut(device, CutCause::kRepeat);
  } else if (program_cut) {
    cut(device, CutCause::kProgram);
  }
}

const char* cut_cause_name(CutCause c) {
  switch (c) {
    case CutCause::kOp: return "op";
    case CutCause::kHostRead: return "host_read";
    case CutCause::kSync: return "sync";
    case CutCause::kSizeCap: return "size_cap";
    case CutCause::kRepeat: return "repeat";
    case CutCause::kModeSwitch: return "mode_switch";
    case CutCause::kFallback: return "fallback";
    case CutCause::kDataDependent: return "data_dependent";
    case CutCause::kCollective: return "collective";
    case CutCause::kProgram: return "program";
    default: return "?";
  }
}

GraphCounters& graph_counters() { return g_counters; }

// Measured (bench/compiled.py's small GPT compiled, loss.item() every step, five runs): launching the forward and
// backward programs as recorded, 0.73-0.87x CPU eager against 0.81-0.96x with the step as one chunk at the read; in a
// loop that never reads, cutting there costs 8% (11.7 against 10.8 ms a step), hence the read-frequency condition.
constexpr int64_t kProgramsPerRead = 16;

bool program_cut_wanted(c10::DeviceIndex device, int64_t ops) {
  if (g_program_cut_ops <= 0 || ops < g_program_cut_ops) return false;
  DeviceGraph& g = g_graphs[device];
  ++g.programs_since_read;
  return std::max(g.programs_since_read, g.programs_between_reads) <= kProgramsPerRead;
}

void note_host_read(c10::DeviceIndex device) {
  std::lock_guard<std::recursive_mutex> lk(exec_mutex());
  DeviceGraph& g = g_graphs[device];
  g.programs_between_reads = g.programs_since_read;
  g.programs_since_read = 0;
}

void clear_chunk_cache() {
  std::lock_guard<std::recursive_mutex> cut_lock(g_cut_mu);
  for (auto& e : g_chunk_cache.lru) queue_release(e.second);
  g_chunk_cache.lru.clear();
  g_chunk_cache.index.clear();
}

void set_chunk_cache_capacity(int64_t n) {
  std::lock_guard<std::recursive_mutex> cut_lock(g_cut_mu);
  g_chunk_cache.capacity = static_cast<size_t>(std::max<int64_t>(1, n));
}

void set_fused_limits(int64_t max_ops, int64_t repeat_min_ops, int64_t read_split_min_ops, int64_t repeat_min_weight,
                      int64_t program_cut_ops) {
  g_max_ops = std::max<int64_t>(1, max_ops);
  g_program_cut_ops = program_cut_ops;
  g_repeat_min_ops = repeat_min_ops;
  g_repeat_min_weight = std::max<int64_t>(1, repeat_min_weight);
  g_read_split_min_ops = read_split_min_ops;
}

NodePtr new_node(int32_t fid, c10::DeviceIndex device) {
  auto node = c10::make_intrusive<Node>();
  node->fragment = fid;
  node->frag = &fragment(fid);
  node->device = device;
  node->live.assign(node->frag->results.size(), 0);
  return node;
}

ValueRef value_ref(StorageHandle* h, const std::string& reader) {
  h->resolve();
  ValueRef ref;
  if (h->state == StorageHandle::State::kBuffer) {
    ref.leaf = h->buffer;
  } else if (h->state == StorageHandle::State::kPending) {
    ref.node = h->node;
    ref.index = h->index;
  } else {
    TORCH_CHECK(h->state != StorageHandle::State::kFailed, *h->error);
    TORCH_INTERNAL_ASSERT(false, "tpu: ", reader, " reads a storage that holds no value");
  }
  return ref;
}

bool value_type(StorageHandle* h, ValueType* out) {
  h->resolve();
  if (h->state == StorageHandle::State::kBuffer) {
    *out = h->buffer->type;
    return true;
  }
  if (h->state == StorageHandle::State::kPending) {
    *out = h->node->frag->results[h->index];
    return true;
  }
  return false;
}

bool record(const NodePtr& node, bool fused) {
  DeviceGraph& g = g_graphs[node->device];
  if (g.nodes.empty()) g.base = g.next_seq;
  node->seq = g.next_seq++;
  g.nodes.push_back(node);
  g.weight += node_weight(*node);
  if (!fused || g_capture[node->device].on) return false;
  const int64_t i = static_cast<int64_t>(g.nodes.size()) - 1;
  if (g_repeat_min_ops > 0) {
    g.repeat.push(node_hash(*node), node_weight(*node), kMinPeriod, kMinPeriodWeight);
    // once the graph is long enough, cut at the start of the last period: what stays pending begins a period,
    // so every later chunk holds the same whole periods and reuses one executable
    const int64_t p = g.repeat.period;
    const bool long_enough = i + 1 >= g_repeat_min_ops || g.weight >= g_repeat_min_weight;
    if (long_enough && i + 1 > p && g.repeat.at_boundary(i + 1)) g.repeat_cut = i + 1 - p;
  }
  return g.repeat_cut > 0 || static_cast<int64_t>(g.nodes.size()) >= g_max_ops ||
         g.weight >= kCapWeightFactor * g_max_ops;
}

std::vector<std::string> pending_describe(c10::DeviceIndex device) {
  std::lock_guard<std::recursive_mutex> lk(exec_mutex());
  std::vector<std::string> out;
  const DeviceGraph& g = g_graphs[device];
  for (const auto& n : g.nodes) {
    std::string s = n->frag->label + " <-";
    for (const auto& in : n->inputs) {
      s += in.node ? " " + std::to_string(n->seq - in.node->seq) + ":" + std::to_string(in.index) +
                         (in.node->state == Node::State::kPending ? "" : "L")
                   : " leaf";
    }
    out.push_back(s);
  }
  return out;
}

std::vector<uint64_t> pending_hashes(c10::DeviceIndex device) {
  std::lock_guard<std::recursive_mutex> lk(exec_mutex());
  return g_graphs[device].repeat.hashes;
}

size_t pending_ops(c10::DeviceIndex device) {
  std::lock_guard<std::recursive_mutex> lk(exec_mutex());
  return g_graphs[device].nodes.size();
}

void cut(c10::DeviceIndex device, CutCause cause, bool wait) {
  std::lock_guard<std::recursive_mutex> cut_lock(g_cut_mu);
  Chunk c;
  {
    std::lock_guard<std::recursive_mutex> lk(exec_mutex());
    DeviceGraph& g = g_graphs[device];
    if (g.nodes.empty()) return;
    if (g_capture[device].on) g_capture[device].broken = true;
    size_t count = g.nodes.size();
    if (cause == CutCause::kRepeat && g.repeat_cut > 0 && static_cast<size_t>(g.repeat_cut) < count) {
      count = static_cast<size_t>(g.repeat_cut);
    } else if (cause == CutCause::kRepeat) {
      cause = CutCause::kSizeCap;
    }
    c = detach(device, count);
    if (g.nodes.empty()) {
      if (!g.repeat.hashes.empty()) g.repeat.clear();
      g.repeat_cut = 0;
    } else {
      reset_window(device);
    }
  }
  launch_chunk(c, cause, wait);
}

void cut_for_read(c10::DeviceIndex device, const Node* target, CutCause cause) {
  std::lock_guard<std::recursive_mutex> cut_lock(g_cut_mu);
  Chunk a, b;
  {
    std::lock_guard<std::recursive_mutex> lk(exec_mutex());
    DeviceGraph& g = g_graphs[device];
    if (g.nodes.empty()) return;
    if (g_capture[device].on) g_capture[device].broken = true;
    // what the read needs: the target and its pending ancestors (found walking back in record order)
    std::unordered_set<const Node*> needed{target};
    std::vector<bool> selected(g.nodes.size(), false);
    size_t n_selected = 0;
    for (size_t i = g.nodes.size(); i-- > 0;) {
      const Node* n = g.nodes[i].get();
      if (!needed.count(n)) continue;
      selected[i] = true;
      ++n_selected;
      for (const auto& in : n->inputs) {
        if (in.node && in.node->state == Node::State::kPending) needed.insert(in.node.get());
      }
    }
    if (n_selected == 0 || n_selected == g.nodes.size() ||
        static_cast<int64_t>(g.nodes.size()) < g_read_split_min_ops) {
      a = detach(device, g.nodes.size());
    } else {
      a = detach(device, 0, &selected);  // its outputs include what the rest reads
    }
    g.repeat.clear();
    g.repeat_cut = 0;
  }
  // The read waits for the first chunk only; the rest runs meanwhile, as the host records on.
  launch_chunk(a, cause, false);
  {
    std::lock_guard<std::recursive_mutex> lk(exec_mutex());
    DeviceGraph& g = g_graphs[device];
    if (!g.nodes.empty()) b = detach(device, g.nodes.size());
  }
  launch_chunk(b, cause, false);
}

void cut_all(CutCause cause) {
  for (int d = 0; d < kMaxDevices; ++d) {
    bool any;
    {
      std::lock_guard<std::recursive_mutex> lk(exec_mutex());
      any = !g_graphs[d].nodes.empty();
    }
    if (any) cut(static_cast<c10::DeviceIndex>(d), cause);
  }
}

void wait_device(c10::DeviceIndex device) {
  std::lock_guard<std::recursive_mutex> cut_lock(g_cut_mu);
  runtime::wait_all(device);
}

std::recursive_mutex& cut_mutex() { return g_cut_mu; }

void set_capturing(c10::DeviceIndex device, bool on) {
  std::lock_guard<std::recursive_mutex> lk(exec_mutex());
  g_capture[device].on = on;
  g_capture[device].broken = false;
}

bool capture_broken(c10::DeviceIndex device) {
  std::lock_guard<std::recursive_mutex> lk(exec_mutex());
  return g_capture[device].broken;
}

Chunk detach_all(c10::DeviceIndex device) {
  DeviceGraph& g = g_graphs[device];
  Chunk c = detach(device, g.nodes.size());
  g.repeat.clear();
  g.repeat_cut = 0;
  return c;
}

void launch_detached(Chunk& c, CutCause cause) { launch_chunk(c, cause, false); }

}  // namespace torchtpu
