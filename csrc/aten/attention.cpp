// torch.nn.functional.scaled_dot_product_attention on tpu tensors: one op (forward) and one op (backward) instead of
// the ~19 ops of PyTorch's math decomposition. The composite asks `_fused_sdp_choice_stub` (a DispatchStub keyed by
// device type) which backend to use; on tpu it answers "overrideable" and PyTorch calls
// `_scaled_dot_product_fused_attention_overrideable` (+ its backward through autograd), whose kernels here call
// torchtpu's own ops `torchtpu_attn::sdpa` / `sdpa_backward` (torchtpu/lowering/attention.py: the rules, and the
// varying-length rule in torchtpu/shapes/rules_spatial.py). Those go through the op table like any op; these
// wrappers only adapt PyTorch's nine-result signature (sequence lengths as SymInts, the dropout's Philox state in
// philox_seed, no debug mask).
#include <ATen/ATen.h>
#include <ATen/SDPBackend.h>
#include <ATen/native/DispatchStub.h>
#include <ATen/native/transformers/attention.h>
#include <torch/library.h>

#include <ATen/core/dispatch/Dispatcher.h>

namespace torchtpu {
namespace {

bool traced(const at::Tensor& t) {
  // fake or functional tensors (torch.compile, AOTAutograd): the math decomposition gives XLA the whole graph;
  // torch.func's wrappers (vmap has no batching rule for the overrideable op; grad's levels): its ops have them
  const auto ks = t.key_set();
  return ks.has(c10::DispatchKey::Python) || ks.has(c10::DispatchKey::Functionalize) ||
         ks.has(c10::DispatchKey::FuncTorchBatched) || ks.has(c10::DispatchKey::FuncTorchGradWrapper) ||
         ks.has(c10::DispatchKey::BatchedNestedTensor);
}

bool floating(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf ||
         t.scalar_type() == at::kDouble;
}

int64_t choose(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const std::optional<at::Tensor>& mask,
               double /*dropout_p*/, bool /*is_causal*/, std::optional<double> /*scale*/, bool enable_gqa) {
  constexpr auto math = static_cast<int64_t>(at::SDPBackend::math);
  if (!at::globalContext().userEnabledOverrideableSDP()) return math;
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4) return math;
  if (q.is_nested() || traced(q) || traced(k) || traced(v)) return math;
  if (!floating(q) || q.scalar_type() != k.scalar_type() || q.scalar_type() != v.scalar_type()) return math;
  if (mask.has_value() && mask->defined() && (traced(*mask) || mask->requires_grad())) return math;
  // the shapes the math path would refuse (with its own message), and grouped query attention's head counts
  if (q.size(0) != k.size(0) || q.size(0) != v.size(0) || k.size(1) != v.size(1) || k.size(2) != v.size(2) ||
      q.size(3) != k.size(3))
    return math;
  if (q.size(1) != k.size(1) && (!enable_gqa || q.size(1) % k.size(1) != 0)) return math;
  return static_cast<int64_t>(at::SDPBackend::overrideable);
}

c10::OperatorHandle op_handle(const char* name) { return c10::Dispatcher::singleton().findSchemaOrThrow(name, ""); }

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, c10::SymInt, c10::SymInt, at::Tensor, at::Tensor, at::Tensor>
sdpa(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const std::optional<at::Tensor>& bias,
     double dropout_p, bool is_causal, bool /*return_debug_mask*/, std::optional<double> scale) {
  static const auto op = op_handle("torchtpu_attn::sdpa")
                             .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
                                 const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                 const std::optional<at::Tensor>&, bool, std::optional<double>, double)>();
  auto [out, lse, rng] = op.call(q, k, v, bias, is_causal, scale, dropout_p);
  // the dropout's Philox state rides in philox_seed: autograd saves it for the backward, which draws the same mask
  return {out, lse, at::Tensor(), at::Tensor(), q.sym_size(-2), k.sym_size(-2), rng, at::Tensor(), at::Tensor()};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> sdpa_backward(
    const at::Tensor& grad, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& bias,
    std::array<bool, 4> grad_input_mask, const at::Tensor& out, const at::Tensor& lse, const at::Tensor&,
    const at::Tensor&, c10::SymInt, c10::SymInt, double dropout_p, bool is_causal, const at::Tensor& philox_seed,
    const at::Tensor&, std::optional<double> scale) {
  TORCH_CHECK(!grad_input_mask[3], "tpu: _scaled_dot_product_fused_attention_overrideable_backward(query ", q.sizes(),
              "): the gradient of attn_mask (scaled_dot_product_attention takes the math path for a mask that "
              "requires grad)");
  TORCH_CHECK(philox_seed.defined(), "tpu: _scaled_dot_product_fused_attention_overrideable_backward(query ", q.sizes(),
              "): no random state from the forward (philox_seed)");
  static const auto op = op_handle("torchtpu_attn::sdpa_backward")
                             .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
                                 const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                 const std::optional<at::Tensor>&, const at::Tensor&, const at::Tensor&, bool,
                                 std::optional<double>, double, const at::Tensor&)>();
  std::optional<at::Tensor> b;
  if (bias.defined()) b = bias;
  auto [gq, gk, gv] = op.call(grad, q, k, v, b, out, lse, is_causal, scale, dropout_p, philox_seed);
  return {gq, gk, gv, at::Tensor()};
}

}  // namespace
}  // namespace torchtpu

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &torchtpu::choose)
}  // namespace at::native

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_fused_sdp_choice", TORCH_FN(torchtpu::choose));  // the stub's answer, asked as an op (no CPU fallback)
  m.impl("_scaled_dot_product_fused_attention_overrideable", TORCH_FN(torchtpu::sdpa));
  m.impl("_scaled_dot_product_fused_attention_overrideable_backward", TORCH_FN(torchtpu::sdpa_backward));
}
