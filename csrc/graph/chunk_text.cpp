// A chunk's program text: the calls of its nodes' fragments with their scalars unpacked (chunk_body, shared with
// the compiled-graph capture) and the module around them (chunk_text).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "graph/chunk.h"
#include "graph/fragment.h"

namespace torchtpu {
namespace {

const char* kPackF = "%pf";
const char* kPackI = "%pi";

std::string slice1(const std::string& out, const char* pack, int64_t n_pack, const char* elem, int64_t at,
                   int64_t len) {
  std::ostringstream s;
  s << out << " = \"stablehlo.slice\"(" << pack << ") {start_indices = array<i64: " << at
    << ">, limit_indices = array<i64: " << at + len << ">, strides = array<i64: 1>} : (tensor<" << n_pack << "x" << elem
    << ">) -> tensor<" << len << "x" << elem << ">";
  return s.str();
}

std::string pack_value(double v) {
  char buf[40];
  if (std::isfinite(v)) {
    std::snprintf(buf, sizeof(buf), "%.17g", v);
    std::string s(buf);
    if (s.find('.') == std::string::npos) {  // MLIR's float literals need the point: 1e-08 -> 1.0e-08
      const auto e = s.find_first_of("eE");
      s.insert(e == std::string::npos ? s.size() : e, ".0");
    }
    return s;
  }
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  std::snprintf(buf, sizeof(buf), "0x%016llX", static_cast<unsigned long long>(bits));
  return buf;
}

// A slice of length `len` of a scalar pack at `at`; baked, a constant with the node's own values instead.
std::string pack_slice(const std::string& out, const char* pack, int64_t n_pack, const char* elem, int64_t at,
                       int64_t len, const Node* baked, bool is_float, int64_t node_at) {
  if (baked == nullptr) return slice1(out, pack, n_pack, elem, at, len);
  std::ostringstream s;
  s << out << " = \"stablehlo.constant\"() {value = dense<[";
  for (int64_t k = 0; k < len; ++k) {
    s << (k ? ", " : "");
    if (is_float) {
      s << pack_value(baked->fscalars[node_at + k]);
    } else {
      s << baked->iscalars[node_at + k];
    }
  }
  s << "]> : tensor<" << len << "x" << elem << ">} : () -> tensor<" << len << "x" << elem << ">";
  return s.str();
}

}  // namespace

std::string ChunkBody::value(const Chunk& c, int32_t node, int32_t result) const {
  const Fragment& f = *c.nodes[node]->frag;
  return f.results.size() == 1 ? names[node] : names[node] + "#" + std::to_string(result);
}

// The calls of a chunk's nodes. Scalars come from the packs %pf/%pi, or (baked: a captured program) are the
// nodes' own values as constants, with the random-number states from the program's parameters %r<k>.
ChunkBody chunk_body(const Chunk& c, int64_t nf, int64_t ni, bool baked) {
  ChunkBody out;
  std::ostringstream body;
  std::unordered_map<std::string, bool> emitted;
  out.names.resize(c.nodes.size());
  int64_t fo = 0, io = 0;
  for (size_t j = 0; j < c.nodes.size(); ++j) {
    const Fragment& f = *c.nodes[j]->frag;
    const Node* bake = baked ? c.nodes[j].get() : nullptr;
    int64_t nfo = 0, nio = 0;  // offsets into the node's own scalars
    if (!emitted.count(f.name)) {
      emitted[f.name] = true;
      out.funcs.emplace_back(f.name, f.text);
      for (const auto& d : f.deps) {
        if (!emitted.count(d.first)) {
          emitted[d.first] = true;
          out.funcs.push_back(d);
        }
      }
    }
    std::vector<std::string> args;
    for (const auto& w : c.wiring[j]) {
      args.push_back(w[0] >= 0 ? "%l" + std::to_string(w[0]) : out.value(c, w[1], w[2]));
    }
    for (size_t s = 0; s < f.scalars.size(); ++s) {
      const auto& sp = f.scalars[s];
      const std::string v = "%n" + std::to_string(j) + "s" + std::to_string(s);
      switch (sp.kind) {
        case ScalarKind::kFloat: {
          body << "    " << pack_slice(v + "a", kPackF, nf, "f64", fo, 1, bake, true, nfo) << "\n";
          body << "    " << v << "b = \"stablehlo.reshape\"(" << v << "a) : (tensor<1xf64>) -> tensor<f64>\n";
          std::string cur = v + "b";
          if (sp.type == "tensor<bf16>" || sp.type == "tensor<f16>") {  // as c10: double -> float -> half
            body << "    " << v << "c = \"stablehlo.convert\"(" << cur << ") : (tensor<f64>) -> tensor<f32>\n";
            cur = v + "c";
            body << "    " << v << " = \"stablehlo.convert\"(" << cur << ") : (tensor<f32>) -> " << sp.type << "\n";
          } else if (sp.type == "tensor<f64>") {
            body << "    " << v << " = \"stablehlo.reshape\"(" << v << "a) : (tensor<1xf64>) -> tensor<f64>\n";
          } else {
            body << "    " << v << " = \"stablehlo.convert\"(" << cur << ") : (tensor<f64>) -> " << sp.type << "\n";
          }
          fo += 1;
          nfo += 1;
          break;
        }
        case ScalarKind::kComplex: {
          body << "    " << pack_slice(v + "a", kPackF, nf, "f64", fo, 1, bake, true, nfo) << "\n";
          body << "    " << pack_slice(v + "b", kPackF, nf, "f64", fo + 1, 1, bake, true, nfo + 1) << "\n";
          body << "    " << v << "c = \"stablehlo.reshape\"(" << v << "a) : (tensor<1xf64>) -> tensor<f64>\n";
          body << "    " << v << "d = \"stablehlo.reshape\"(" << v << "b) : (tensor<1xf64>) -> tensor<f64>\n";
          body << "    " << v << "e = \"stablehlo.complex\"(" << v << "c, " << v
               << "d) : (tensor<f64>, tensor<f64>) -> tensor<complex<f64>>\n";
          if (sp.type == "tensor<complex<f64>>") {
            body << "    " << v << " = \"stablehlo.reshape\"(" << v << "e) : (tensor<complex<f64>>) -> " << sp.type
                 << "\n";
          } else {
            body << "    " << v << " = \"stablehlo.convert\"(" << v << "e) : (tensor<complex<f64>>) -> " << sp.type
                 << "\n";
          }
          fo += 2;
          nfo += 2;
          break;
        }
        case ScalarKind::kInt:
        case ScalarKind::kBool: {
          body << "    " << pack_slice(v + "a", kPackI, ni, "i64", io, 1, bake, false, nio) << "\n";
          body << "    " << v << "b = \"stablehlo.reshape\"(" << v << "a) : (tensor<1xi64>) -> tensor<i64>\n";
          if (sp.kind == ScalarKind::kBool) {
            body << "    " << v
                 << "z = \"stablehlo.constant\"() {value = dense<0> : tensor<i64>} : () -> tensor<i64>\n";
            body << "    " << v << " = \"stablehlo.compare\"(" << v << "b, " << v
                 << "z) {comparison_direction = #stablehlo<comparison_direction NE>, compare_type = "
                    "#stablehlo<comparison_type SIGNED>} : (tensor<i64>, tensor<i64>) -> tensor<i1>\n";
          } else if (sp.type == "tensor<i64>") {
            body << "    " << v << " = \"stablehlo.reshape\"(" << v << "a) : (tensor<1xi64>) -> tensor<i64>\n";
          } else if (sp.type == "tensor<ui64>") {
            body << "    " << v << " = \"stablehlo.bitcast_convert\"(" << v << "b) : (tensor<i64>) -> tensor<ui64>\n";
          } else {
            body << "    " << v << " = \"stablehlo.convert\"(" << v << "b) : (tensor<i64>) -> " << sp.type << "\n";
          }
          io += 1;
          nio += 1;
          break;
        }
        case ScalarKind::kRng: {
          if (baked) {  // the program's own parameter: fresh states each run
            const std::string r = "%r" + std::to_string(out.rng_types.size());
            out.rng_types.push_back(sp.type);
            body << "    " << v << " = \"stablehlo.bitcast_convert\"(" << r << ") : (" << sp.type << ") -> " << sp.type
                 << "\n";
          } else {
            body << "    " << slice1(v + "a", kPackI, ni, "i64", io, 2) << "\n";
            body << "    " << v << " = \"stablehlo.bitcast_convert\"(" << v << "a) : (tensor<2xi64>) -> " << sp.type
                 << "\n";
          }
          io += 2;
          nio += 2;
          break;
        }
      }
      args.push_back(v);
    }
    out.names[j] = "%n" + std::to_string(j);
    std::string in_types, out_types;
    for (size_t k = 0; k < f.param_types.size(); ++k) in_types += (k ? ", " : "") + f.param_types[k];
    for (size_t k = 0; k < f.scalars.size(); ++k)
      in_types += (f.param_types.empty() && k == 0 ? "" : ", ") + f.scalars[k].type;
    for (size_t k = 0; k < f.result_types.size(); ++k) out_types += (k ? ", " : "") + f.result_types[k];
    body << "    " << out.names[j] << (f.results.size() == 1 ? "" : ":" + std::to_string(f.results.size()))
         << " = \"func.call\"(";
    for (size_t k = 0; k < args.size(); ++k) body << (k ? ", " : "") << args[k];
    body << ") {callee = @" << f.name << "} : (" << in_types << ") -> "
         << (f.results.size() == 1 ? out_types : "(" + out_types + ")") << "\n";
  }
  out.calls = body.str();
  return out;
}

std::string chunk_text(const Chunk& c, int64_t nf, int64_t ni) {
  const ChunkBody b = chunk_body(c, nf, ni, false);
  std::ostringstream m;
  m << "module @torchtpu attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {\n";
  m << "  func.func public @main(";
  bool first = true;
  for (size_t li = 0; li < c.leaves.size(); ++li) {
    m << (first ? "" : ", ") << "%l" << li << ": " << mlir_type(c.leaves[li]->type)
      << (c.alias[li] >= 0 ? " {tf.aliasing_output = " + std::to_string(c.alias[li]) + " : i32}"
          : c.donated[li]  ? " {jax.buffer_donor = true}"
                           : "");
    first = false;
  }
  if (nf) {
    m << (first ? "" : ", ") << "%pf: tensor<" << nf << "xf64>";
    first = false;
  }
  if (ni) {
    m << (first ? "" : ", ") << "%pi: tensor<" << ni << "xi64>";
    first = false;
  }
  std::string ret_names, ret_types;
  for (size_t k = 0; k < c.outputs.size(); ++k) {
    const auto& o = c.outputs[k];
    ret_names += (k ? ", " : "") + b.value(c, o.first, o.second);
    ret_types += (k ? ", " : "") + c.nodes[o.first]->frag->result_types[o.second];
  }
  m << ") -> (" << ret_types << ") {\n" << b.calls;
  m << "    \"func.return\"(" << ret_names << ") : (" << ret_types << ") -> ()\n  }\n";
  for (const auto& fn : b.funcs) m << "  " << fn.second << "\n";
  m << "}\n";
  return m.str();
}

}  // namespace torchtpu
