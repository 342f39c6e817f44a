#include "graph/capture.h"

#include <ATen/EmptyTensor.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>

#include <deque>
#include <map>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include "core/allocator.h"
#include "core/generator.h"
#include "executor/executor.h"
#include "graph/chunk.h"
#include "graph/fragment.h"

namespace torchtpu {
namespace {

constexpr c10::DispatchKeySet kTpuKeys{c10::DispatchKey::PrivateUse1};

// What a program's guard compares per input: the layout the captured fragments read with.
struct InputSpec {
  c10::DeviceIndex device = -1;
  at::ScalarType dtype = at::kFloat;
  c10::SmallVector<int64_t, 6> sizes, strides;
  int64_t offset = 0;
  size_t nbytes = 0;
  bool conj = false, neg = false;
  bool has_value = false;
  ValueType value;
  int32_t same_storage_as = -1;  // the first earlier input sharing its storage

  bool operator==(const InputSpec& o) const {
    return device == o.device && dtype == o.dtype && sizes == o.sizes && strides == o.strides && offset == o.offset &&
           nbytes == o.nbytes && conj == o.conj && neg == o.neg && has_value == o.has_value &&
           (!has_value || value == o.value) && same_storage_as == o.same_storage_as;
  }
};

struct OutSpec {
  enum Kind : uint8_t { kInput, kInputView, kNew, kEmpty } kind = kNew;
  int32_t input = -1;    // kInput, kInputView
  int32_t storage = -1;  // kNew: index into Program::storages
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> sizes, strides;
  int64_t offset = 0;
  size_t nbytes = 0;  // kEmpty: its storage's size
  bool conj = false, neg = false;
};

struct NewStorage {
  int32_t result;
  size_t nbytes;
  int32_t constant = -1;  // >= 0: the storage holds that constant leaf (a value the graph uploaded), not a result
};

struct RngSlot {
  at::Generator generator;
  uint64_t increment;
};

struct Program {
  c10::DeviceIndex device = 0;
  int32_t fragment = -1;
  int64_t ops = 0;
  std::vector<InputSpec> inputs;
  std::vector<int32_t> leaf_input;  // per leaf: the input whose storage value it is, or -1: a constant
  std::vector<BufferPtr>
      constants;  // the values of the constant leaves, in leaf order; then of constants only returned
  std::vector<RngSlot> rng;
  std::vector<NewStorage> storages;
  std::vector<OutSpec> outputs;
  std::vector<std::pair<int32_t, int32_t>> mutated;  // (input, result): the graph overwrote the input's storage
  int64_t results = 0;
};

std::mutex g_programs_mu;
std::deque<Program> g_programs;  // deque: references stay valid as it grows

struct Capture {
  bool active = false;
  c10::DeviceIndex device = 0;
  std::vector<BufferPtr> begin;  // per input: its storage's buffer when the capture began
  std::vector<InputSpec> specs;
  std::vector<PhiloxAdvance> rng_log;
};
Capture g_capture;

InputSpec spec_of(const std::vector<at::Tensor>& ts, size_t i) {
  const at::Tensor& t = ts[i];
  InputSpec s;
  s.device = t.device().is_privateuseone() ? t.device().index() : -1;
  s.dtype = t.scalar_type();
  s.sizes.assign(t.sizes().begin(), t.sizes().end());
  s.strides.assign(t.strides().begin(), t.strides().end());
  s.offset = t.storage_offset();
  s.nbytes = t.storage().nbytes();
  s.conj = t.is_conj();
  s.neg = t.is_neg();
  const c10::StorageImpl* st = t.storage().unsafeGetStorageImpl();
  for (size_t j = 0; j < i; ++j) {
    if (ts[j].storage().unsafeGetStorageImpl() == st) {
      s.same_storage_as = static_cast<int32_t>(j);
      break;
    }
  }
  StorageHandle* h = s.device >= 0 ? handle_of(t.storage()) : nullptr;
  s.has_value = h != nullptr && value_type(h, &s.value);
  return s;
}

OutSpec out_spec(const at::Tensor& t) {
  OutSpec o;
  o.dtype = t.scalar_type();
  o.sizes = t.sizes().vec();
  o.strides = t.strides().vec();
  o.offset = t.storage_offset();
  o.nbytes = t.storage().nbytes();
  o.conj = t.is_conj();
  o.neg = t.is_neg();
  return o;
}

at::Tensor tensor_on(c10::Storage storage, const OutSpec& o) {
  auto t =
      at::detail::make_tensor<c10::TensorImpl>(std::move(storage), kTpuKeys, caffe2::TypeMeta::fromScalarType(o.dtype));
  t.unsafeGetTensorImpl()->set_sizes_and_strides(o.sizes, o.strides, o.offset);
  if (o.conj) t._set_conj(true);
  if (o.neg) t._set_neg(true);
  return t;
}

// Turns the captured chunk into a program; returns why not ("" when it is one). Caller holds exec_mutex().
std::string make_program(const Chunk& c, const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& outputs,
                         Program& p, std::vector<int32_t>& check_frags, std::vector<int64_t>& rng_states) {
  if (c.nodes.empty()) return "the graph runs no tpu op";
  p.device = c.device;
  p.ops = static_cast<int64_t>(c.nodes.size());
  p.inputs = g_capture.specs;
  std::unordered_map<const Node*, int32_t> local;
  for (size_t j = 0; j < c.nodes.size(); ++j) local[c.nodes[j].get()] = static_cast<int32_t>(j);
  // the chunk's outputs: program results, and the device-side check vectors (concatenated into one result)
  std::map<std::pair<int32_t, int32_t>, int32_t> result_of;
  std::vector<std::pair<int32_t, int32_t>> results, checks;
  for (const auto& o : c.outputs) {
    const Node& n = *c.nodes[o.first];
    if (n.frag->has_check && static_cast<size_t>(o.second) + 1 == n.live.size()) {
      checks.push_back(o);
      check_frags.push_back(n.fragment);
    } else {
      result_of[o] = static_cast<int32_t>(results.size());
      results.push_back(o);
    }
  }
  p.results = static_cast<int64_t>(results.size());
  std::vector<int32_t> held(results.size(), 0);
  // where a storage's value now comes from: a result of the chunk, or -1
  auto result_of_handle = [&](StorageHandle* h) -> int32_t {
    if (h->state != StorageHandle::State::kPending) return -1;
    auto it = local.find(h->node.get());
    if (it == local.end()) return -1;
    auto r = result_of.find({it->second, h->index});
    return r == result_of.end() ? -1 : r->second;
  };
  // leaves: the inputs' values when the capture began, or constants the graph uploaded
  for (const auto& leaf : c.leaves) {
    int32_t src = -1;
    for (size_t i = 0; i < g_capture.begin.size(); ++i) {
      if (g_capture.begin[i].get() == leaf.get()) {
        src = static_cast<int32_t>(i);
        break;
      }
    }
    p.leaf_input.push_back(src);
    if (src < 0) p.constants.push_back(leaf);
  }
  // inputs the graph overwrote
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (p.inputs[i].same_storage_as >= 0) continue;
    StorageHandle* h = handle_of(inputs[i].storage());
    if (h == nullptr) continue;
    if (inputs[i].storage().nbytes() != p.inputs[i].nbytes) return "the graph resizes input " + std::to_string(i);
    const int32_t k = result_of_handle(h);
    if (k >= 0) {
      p.mutated.emplace_back(static_cast<int32_t>(i), k);
      held[k] += 1;
      continue;
    }
    h->resolve();
    const bool same = h->state == StorageHandle::State::kBuffer
                          ? h->buffer.get() == g_capture.begin[i].get()
                          : h->state == StorageHandle::State::kEmpty && !g_capture.begin[i];
    if (!same) return "input " + std::to_string(i) + " gets a value made outside the graph's ops";
  }
  // outputs
  std::unordered_map<const c10::StorageImpl*, int32_t> new_storage;
  for (const auto& t : outputs) {
    auto which = [&] {  // for the reason a graph runs op by op
      std::ostringstream os;
      os << "output " << p.outputs.size() << " (" << t.scalar_type() << t.sizes() << ")";
      return os.str();
    };
    TORCH_INTERNAL_ASSERT(t.defined());
    if (!t.device().is_privateuseone() || t.device().index() != c.device) return which() + " is not on the device";
    OutSpec o = out_spec(t);
    const c10::StorageImpl* st = t.storage().unsafeGetStorageImpl();
    for (size_t i = 0; i < inputs.size() && o.input < 0; ++i) {
      if (inputs[i].unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
        o.kind = OutSpec::kInput;
        o.input = static_cast<int32_t>(i);
      } else if (inputs[i].storage().unsafeGetStorageImpl() == st) {
        o.kind = OutSpec::kInputView;
        o.input = static_cast<int32_t>(i);
      }
    }
    if (o.input < 0) {
      StorageHandle* h = handle_of(t.storage());
      if (h != nullptr) h->resolve();
      if (h == nullptr || h->state == StorageHandle::State::kEmpty) {
        o.kind = OutSpec::kEmpty;
      } else {
        auto it = new_storage.find(st);
        if (it != new_storage.end()) {
          o.storage = it->second;
        } else {
          const int32_t k = result_of_handle(h);
          int32_t constant = -1;  // a constant the graph uploaded (a CPU constant moved to the device) is returned
          if (k < 0 && h->state == StorageHandle::State::kBuffer && h->buffer) {  // as itself: shared, so never donated
            for (size_t ci = 0; ci < p.constants.size() && constant < 0; ++ci) {
              if (p.constants[ci].get() == h->buffer.get()) constant = static_cast<int32_t>(ci);
            }
            bool an_input = false;  // an input's value when the capture began is no constant
            for (size_t b = 0; b < g_capture.begin.size() && constant < 0 && !an_input; ++b) {
              an_input = g_capture.begin[b].get() == h->buffer.get();
            }
            if (constant < 0 && !an_input) {  // a constant returned and read by no op (a CPU constant uploaded)
              constant = static_cast<int32_t>(p.constants.size());
              p.constants.push_back(h->buffer);
            }
          }
          if (k < 0 && constant < 0) return which() + " holds a value made outside the graph's ops";
          if (k >= 0) held[k] += 1;
          o.storage = static_cast<int32_t>(p.storages.size());
          new_storage[st] = o.storage;
          p.storages.push_back({k, t.storage().nbytes(), constant});
        }
        o.kind = OutSpec::kNew;
      }
    }
    p.outputs.push_back(std::move(o));
  }
  for (size_t k = 0; k < results.size(); ++k) {
    const Node& n = *c.nodes[results[k].first];
    if (n.live[results[k].second] != held[k]) return "a value made inside the graph is held outside its outputs";
  }
  // random-number states: each drawn by a logged advance
  for (const auto& np : c.nodes) {
    size_t io = 0;
    for (const auto& sp : np->frag->scalars) {
      if (sp.kind == ScalarKind::kInt || sp.kind == ScalarKind::kBool) io += 1;
      if (sp.kind != ScalarKind::kRng) continue;
      const auto seed = static_cast<uint64_t>(np->iscalars[io]), offset = static_cast<uint64_t>(np->iscalars[io + 1]);
      io += 2;
      const PhiloxAdvance* found = nullptr;
      for (const auto& a : g_capture.rng_log) {
        if (a.seed == seed && a.offset == offset) {
          found = &a;
          break;
        }
      }
      if (found == nullptr) return "a random-number state was not drawn while the graph ran";
      p.rng.push_back({found->generator, found->increment});
      rng_states.push_back(static_cast<int64_t>(seed));
      rng_states.push_back(static_cast<int64_t>(offset));
    }
  }
  // the program: one private function calling the fragments, scalars baked, random states as parameters
  const ChunkBody b = chunk_body(c, 0, 0, true);
  Fragment f;
  std::ostringstream text, label;
  label << "compiled graph of " << c.nodes.size() << " ops (" << c.nodes.front()->frag->label
        << (c.nodes.size() > 1 ? ", ..., " + c.nodes.back()->frag->label : std::string()) << ")";
  f.label = label.str();
  text << "func.func private @FRAGMENT(";
  bool first = true;
  for (size_t li = 0; li < c.leaves.size(); ++li) {
    f.params.push_back(c.leaves[li]->type);
    f.param_types.push_back(mlir_type(c.leaves[li]->type));
    text << (first ? "" : ", ") << "%l" << li << ": " << f.param_types.back();
    first = false;
  }
  for (size_t r = 0; r < b.rng_types.size(); ++r) {
    f.scalars.push_back({ScalarKind::kRng, b.rng_types[r]});
    text << (first ? "" : ", ") << "%r" << r << ": " << b.rng_types[r];
    first = false;
  }
  std::string ret_names, ret_types;
  for (size_t k = 0; k < results.size(); ++k) {
    const Fragment& src = *c.nodes[results[k].first]->frag;
    f.results.push_back(src.results[results[k].second]);
    f.result_types.push_back(src.result_types[results[k].second]);
    ret_names += (k ? ", " : "") + b.value(c, results[k].first, results[k].second);
    ret_types += (k ? ", " : "") + f.result_types.back();
  }
  std::string check_code;
  if (!checks.empty()) {
    int64_t len = 0;
    std::string names, types;
    for (size_t k = 0; k < checks.size(); ++k) {
      const Fragment& src = *c.nodes[checks[k].first]->frag;
      len += src.results[checks[k].second].numel();
      names += (k ? ", " : "") + b.value(c, checks[k].first, checks[k].second);
      types += (k ? ", " : "") + src.result_types[checks[k].second];
    }
    ValueType vt;
    vt.dtype = at::kLong;
    vt.shape = {len};
    f.results.push_back(vt);
    f.result_types.push_back(mlir_type(vt));
    f.has_check = true;
    check_code = "    %checks = \"stablehlo.concatenate\"(" + names + ") {dimension = 0 : i64} : (" + types + ") -> " +
                 f.result_types.back() + "\n";
    ret_names += std::string(results.empty() ? "" : ", ") + "%checks";
    ret_types += std::string(results.empty() ? "" : ", ") + f.result_types.back();
  }
  text << ") -> (" << ret_types << ") {\n" << b.calls << check_code;
  text << "    \"func.return\"(" << ret_names << ") : (" << ret_types << ") -> ()\n  }";
  f.text = text.str();
  f.deps = b.funcs;
  p.fragment = register_fragment(std::move(f));
  return "";
}

}  // namespace

void capture_begin(c10::DeviceIndex device, const std::vector<at::Tensor>& inputs) {
  cut(device, CutCause::kSync);  // what is pending runs first: the capture starts from buffers
  std::lock_guard<std::recursive_mutex> lk(exec_mutex());
  TORCH_CHECK(!g_capture.active, "tpu: a compiled graph is already being captured (graphs calling graphs?)");
  g_capture = Capture();
  g_capture.active = true;
  g_capture.device = device;
  for (size_t i = 0; i < inputs.size(); ++i) {
    TORCH_CHECK(inputs[i].device().is_privateuseone() && inputs[i].device().index() == device,
                "tpu: capture_begin: input ", i, " is on ", inputs[i].device(), ", not tpu:", static_cast<int>(device));
    StorageHandle* h = handle_of(inputs[i].storage());
    if (h != nullptr) h->resolve();
    g_capture.begin.push_back(h != nullptr && h->state == StorageHandle::State::kBuffer ? h->buffer : BufferPtr());
    g_capture.specs.push_back(spec_of(inputs, i));
  }
  set_capturing(device, true);
  set_philox_log(&g_capture.rng_log);
}

CaptureResult capture_end(c10::DeviceIndex device, const std::vector<at::Tensor>& inputs,
                          const std::vector<at::Tensor>& outputs) {
  set_philox_log(nullptr);
  std::lock_guard<std::recursive_mutex> cut_lock(cut_mutex());
  CaptureResult res;
  Chunk c;
  {
    std::lock_guard<std::recursive_mutex> lk(exec_mutex());
    TORCH_CHECK(g_capture.active && g_capture.device == device, "tpu: capture_end without capture_begin");
    const bool broken = capture_broken(device);
    set_capturing(device, false);
    c = detach_all(device);
    Program p;
    std::vector<int64_t> rng_states;
    res.ops = static_cast<int64_t>(c.nodes.size());
    if (broken) {
      res.why = "the graph reads a value on the host (a host sync, a data-dependent size or a CPU fallback)";
    } else if (!c.failure.empty()) {
      res.why = c.failure;
    } else if (inputs.size() != g_capture.specs.size()) {
      res.why = "capture_end got other inputs than capture_begin";
    } else {
      res.why = make_program(c, inputs, outputs, p, res.check_fragments, rng_states);
    }
    if (res.why.empty()) {
      // this call's node: the captured leaves and random states; the outputs and overwritten inputs take its results
      auto node = new_node(p.fragment, device);
      for (const auto& leaf : c.leaves) {
        ValueRef ref;
        ref.leaf = leaf;
        node->inputs.push_back(std::move(ref));
      }
      node->iscalars.assign(rng_states.begin(), rng_states.end());
      for (const auto& m : p.mutated) handle_of(inputs[m.first].storage())->set_pending(node, m.second);
      for (size_t o = 0; o < outputs.size(); ++o) {
        const OutSpec& s = p.outputs[o];
        if (s.kind == OutSpec::kNew && p.storages[s.storage].constant < 0) {
          handle_of(outputs[o].storage())->set_pending(node, p.storages[s.storage].result);
        }
      }
      for (auto& n : c.nodes) {  // replaced by the program's node: never launched
        n->state = Node::State::kLaunched;
        n->results.assign(n->live.size(), BufferPtr());
        n->inputs.clear();
      }
      record(node, true);
      std::lock_guard<std::mutex> plk(g_programs_mu);
      res.program = static_cast<int32_t>(g_programs.size());
      g_programs.push_back(std::move(p));
    }
    g_capture = Capture();
  }
  if (res.program < 0) launch_detached(c, CutCause::kSync);  // the ops as an ordinary chunk
  return res;
}

std::optional<std::vector<at::Tensor>> run_program(int32_t program, const std::vector<at::Tensor>& inputs) {
  const Program* pp;
  {
    std::lock_guard<std::mutex> plk(g_programs_mu);
    TORCH_CHECK(program >= 0 && static_cast<size_t>(program) < g_programs.size(), "tpu: no program ", program);
    pp = &g_programs[program];
  }
  const Program& p = *pp;
  if (inputs.size() != p.inputs.size()) return std::nullopt;
  std::vector<at::Tensor> outs;
  bool want_cut, program_cut = false;
  const Mode mode = get_mode();
  {
    std::lock_guard<std::recursive_mutex> lk(exec_mutex());
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (!(spec_of(inputs, i) == p.inputs[i])) return std::nullopt;
    }
    program_cut = mode == Mode::kFused && program_cut_wanted(p.device, p.ops);  // counts every program
  }
  // A program launched on its own in fused mode (the rule above) goes alone into its chunk: the eager ops pending
  // before it launch first. Otherwise a chunk holds them with the whole program, and when their shapes change from
  // call to call (Hugging Face's generate: the token ids grow by one each step) every call compiles the whole
  // model again (0.4 s a token for bench/generate.py's model); alone, it is the executable strict mode compiled.
  if (program_cut) cut(p.device, CutCause::kProgram);
  {
    std::lock_guard<std::recursive_mutex> lk(exec_mutex());
    const Fragment& f = fragment(p.fragment);
    auto node = new_node(p.fragment, p.device);
    node->inputs.reserve(p.leaf_input.size());  // a model's step reads every parameter: dozens of inputs
    size_t ci = 0;
    for (int32_t src : p.leaf_input) {
      if (src >= 0) {
        node->inputs.push_back(value_ref(handle_of(inputs[src].storage()), f.label));
      } else {
        ValueRef ref;
        ref.leaf = p.constants[ci++];
        node->inputs.push_back(std::move(ref));
      }
    }
    for (const auto& r : p.rng) {
      auto so = r.generator.get<TpuGeneratorImpl>()->philox_advance(r.increment);
      node->iscalars.push_back(static_cast<int64_t>(so.first));
      node->iscalars.push_back(static_cast<int64_t>(so.second));
    }
    std::vector<c10::Storage> storages;
    {
      const c10::DeviceGuard guard(c10::Device(c10::DeviceType::PrivateUse1, p.device));
      for (const auto& s : p.storages) {
        storages.emplace_back(c10::Storage::use_byte_size_t(), s.nbytes, tpu_allocator(), true);
        if (s.constant >= 0) {
          handle_of(storages.back())->set_buffer(p.constants[s.constant]);
        } else if (s.nbytes) {
          handle_of(storages.back())->set_pending(node, s.result);
        }
      }
      outs.reserve(p.outputs.size());
      for (const auto& o : p.outputs) {
        switch (o.kind) {
          case OutSpec::kInput: outs.push_back(inputs[o.input]); break;
          case OutSpec::kInputView: outs.push_back(tensor_on(inputs[o.input].storage(), o)); break;
          case OutSpec::kNew: outs.push_back(tensor_on(storages[o.storage], o)); break;
          case OutSpec::kEmpty:
            outs.push_back(
                tensor_on(c10::Storage(c10::Storage::use_byte_size_t(), o.nbytes, tpu_allocator(), true), o));
            break;
        }
      }
    }
    for (const auto& m : p.mutated) handle_of(inputs[m.first].storage())->set_pending(node, m.second);
    want_cut = record(node, mode == Mode::kFused);
  }
  after_record(p.device, mode, want_cut, program_cut);
  return outs;
}

ProgramInfo program_info(int32_t program) {
  std::lock_guard<std::mutex> plk(g_programs_mu);
  TORCH_CHECK(program >= 0 && static_cast<size_t>(program) < g_programs.size(), "tpu: no program ", program);
  const Program& p = g_programs[program];
  return {p.fragment,
          p.ops,
          static_cast<int64_t>(p.leaf_input.size()),
          static_cast<int64_t>(p.constants.size()),
          p.results,
          static_cast<int64_t>(p.mutated.size()),
          static_cast<int64_t>(p.rng.size())};
}

}  // namespace torchtpu
