#pragma once
// The pending graph of each device and its cuts: the nodes recorded since the last cut become one chunk, one
// XLA program whose outputs are only the values a live storage (or a node still pending) needs. Chunks are
// keyed structurally (fragments, wiring, outputs, donated leaves), never by buffer identity or scalar value.
#include <array>
#include <atomic>
#include <cstdint>

#include "core/kinds.h"
#include "graph/node.h"

namespace torchtpu {

// A node of the fragment on the device: no inputs or scalars yet, no storage holding its results.
NodePtr new_node(int32_t fragment, c10::DeviceIndex device);

// Appends a node to its device's pending graph and points the result handles at it. Caller holds
// exec_mutex(). Returns true when the fused-mode policies (size cap, repeated structure) ask for a cut.
bool record(const NodePtr& node, bool fused);

// Launches what is pending on the device (one chunk; with the repeated-structure rule, the nodes before the
// period's start); with wait, waits for its results and verifies its checks (debug mode). Must not be called
// with exec_mutex() held. Throws the chunk's failure.
void cut(c10::DeviceIndex device, CutCause cause, bool wait = false);
void cut_all(CutCause cause);
// The one cut policy after recording a node (record()'s caller, without exec_mutex()): strict and debug launch it at
// once (debug waits for it), fused launches when recording asked for a cut (size cap, repeated structure:
// want_cut) or, for a compiled graph's program node, when program_cut says it runs alone instead of fusing.
void after_record(c10::DeviceIndex device, Mode mode, bool want_cut, bool program_cut = false);
// A host read of `target`'s result: launches its pending ancestors as one chunk, then everything else pending as
// another, so that the read waits for what it needs while the rest runs (the next step records meanwhile).
void cut_for_read(c10::DeviceIndex device, const Node* target, CutCause cause);
size_t pending_ops(c10::DeviceIndex device);
std::vector<uint64_t> pending_hashes(c10::DeviceIndex device);
std::vector<std::string> pending_describe(c10::DeviceIndex device);  // the repeated-structure rule's window (tests)

// What a node reading the storage takes: its buffer, or the pending result; raises the producer's failure.
// `reader` names the op for the error of a storage that holds no value. Caller holds exec_mutex().
ValueRef value_ref(StorageHandle* h, const std::string& reader);

// The type of a storage's value (its buffer's, or the pending result's); false when it holds none.
bool value_type(StorageHandle* h, ValueType* out);

// Compiled graphs (capture.cpp): while a device captures, the fused-mode policies never cut, and any cut (a host
// read, a sync) breaks the capture.
void set_capturing(c10::DeviceIndex device, bool on);
bool capture_broken(c10::DeviceIndex device);

// Waits for every chunk launched so far on the device.
void wait_device(c10::DeviceIndex device);

struct GraphCounters {
  std::atomic<int64_t> chunks{0};
  std::atomic<int64_t> chunk_ops{0};
  std::atomic<int64_t> chunk_ops_max{0};
  std::atomic<int64_t> chunk_cache_hits{0};
  std::atomic<int64_t> chunk_cache_misses{0};
  std::atomic<int64_t> chunk_cache_evictions{0};
  std::atomic<int64_t> donated_buffers{0};
  std::atomic<int64_t> donated_bytes{0};
  std::atomic<int64_t> failed_chunks{0};
  std::atomic<int64_t> dead_ops{0};
  std::atomic<int64_t> h2d_transfers{0};
  std::atomic<int64_t> h2d_bytes{0};  // recorded, then found unneeded at the cut: never run
  std::array<std::atomic<int64_t>, static_cast<int>(CutCause::kCount)> cuts{};
};
GraphCounters& graph_counters();

// Fused-mode policy knobs (TORCHTPU_FUSED_MAX_OPS, TORCHTPU_FUSED_REPEAT_MIN_OPS).
void set_fused_limits(int64_t max_ops, int64_t repeat_min_ops, int64_t read_split_min_ops, int64_t repeat_min_weight,
                      int64_t program_cut_ops);
// Fused mode's program rule. A program node (a compiled graph) of at least program_cut_ops ops is launched as soon as
// it is recorded, with what is pending before it, so XLA runs it while the host records what follows -- when the
// host reads values often (at most kProgramsPerRead programs recorded between reads, e.g. loss.item() every step),
// because then the device would otherwise idle while the host records up to the read. A loop that reads rarely keeps
// its programs fused with the ops around them (the device is kept busy by the queue; bigger chunks fuse more).
// program_cut_wanted counts the program; caller holds exec_mutex(). note_host_read: the host waits for a value.
bool program_cut_wanted(c10::DeviceIndex device, int64_t ops);
void note_host_read(c10::DeviceIndex device);
void set_chunk_cache_capacity(int64_t n);  // TORCHTPU_CACHE_ENTRIES
void clear_chunk_cache();  // every chunk key misses once more (the advisor reads each program's cost analysis)

}  // namespace torchtpu
