"""Probe of XLA's bounded dynamic dimensions on this platform (the facts docs/architecture.md's "Bounded dynamic
shapes" section rests on). Hand-written StableHLO through torchtpu's runtime; prints what each case returns.

    .venv/bin/python scripts/dynamic_dims_probe.py
"""
import jax
import numpy as np

from torchtpu import runtime

B = "#stablehlo.bounds<?, 8>"
DYN = f"tensor<4x?xf32, {B}>"

# A 4x8 argument given the runtime size 3 in dim 1, then a fragment (func.call) and ops with static result types.
TEXT = f"""
module @probe {{
  func.func public @main(%x: tensor<4x8xf32>, %n: tensor<i32>) -> (tensor<4xf32>, tensor<f32>, tensor<f32>, tensor<32xf32>) {{
    %d = stablehlo.set_dimension_size %x, %n, dim = 1 : (tensor<4x8xf32>, tensor<i32>) -> {DYN}
    %e = "func.call"(%d) {{callee = @frag}} : ({DYN}) -> tensor<4x8xf32>
    %z = stablehlo.constant dense<0.0> : tensor<f32>
    %rows = stablehlo.reduce(%e init: %z) applies stablehlo.add across dimensions = [1] : (tensor<4x8xf32>, tensor<f32>) -> tensor<4xf32>
    %all = stablehlo.reduce(%e init: %z) applies stablehlo.add across dimensions = [0, 1] : (tensor<4x8xf32>, tensor<f32>) -> tensor<f32>
    %c = stablehlo.get_dimension_size %e, dim = 1 : (tensor<4x8xf32>) -> tensor<i32>
    %cf = stablehlo.convert %c : (tensor<i32>) -> tensor<f32>
    %flat = stablehlo.reshape %e : (tensor<4x8xf32>) -> tensor<32xf32>
    return %rows, %all, %cf, %flat : tensor<4xf32>, tensor<f32>, tensor<f32>, tensor<32xf32>
  }}
  func.func private @frag(%a: {DYN}) -> tensor<4x8xf32> {{
    %v = stablehlo.exponential %a : ({DYN}) -> tensor<4x8xf32>
    return %v : tensor<4x8xf32>
  }}
}}
"""

STATIC_CALLEE = TEXT.replace(f"@frag(%a: {DYN})", "@frag(%a: tensor<4x8xf32>)").replace(
    f"%v = stablehlo.exponential %a : ({DYN}) -> tensor<4x8xf32>", "%v = stablehlo.exponential %a : tensor<4x8xf32>")


def main():
    rt = runtime.get()
    x = np.arange(32, dtype=np.float32).reshape(4, 8) / 100
    n = 3
    exe = rt.compile(TEXT)
    rows, total, count, flat = (np.asarray(r) for r in rt.execute(
        exe, [jax.device_put(x, rt.device(0)), jax.device_put(np.int32(n), rt.device(0))]))
    e = np.exp(x[:, :n])
    print("sum over the dynamic dim:", rows.round(4), "expected", e.sum(1).round(4),
          "masked" if np.allclose(rows, e.sum(1), rtol=1e-5) else "NOT masked")
    print("sum over all dims:", round(float(total), 4), "expected", round(float(e.sum()), 4))
    print("get_dimension_size of a static-typed value:", int(count), f"(true size {n}, bound 8)")
    print("reshape to 32 comes back compact (valid values first):",
          np.allclose(flat[:4 * n], e.reshape(-1), rtol=1e-5))
    try:
        rt.compile(STATIC_CALLEE)
        print("func.call with a static-typed callee: accepted")
    except Exception as err:  # noqa: BLE001 (the message is the finding)
        print("func.call with a static-typed callee: rejected:", str(err).splitlines()[0][:160])


if __name__ == "__main__":
    main()
