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
    f"%v = stablehlo.exponential %a : ({DYN}) -> tensor<4x8xf32>", "%v = stablehlo.exponential %a : tensor<4x8xf32>"
)


# A bucketed storage fed back: its flat buffer holds the exact tensor's row-major data as a prefix (as results come
# back). set_dimension_size gives the flat count; a dynamic_reshape (runtime shape vector) splits it into the bounded
# 4x?(<=8) shape; a plain reshape to the same bounded type does not (it reads the data in padded layout).
FEED_BACK = """
module @probe {{
  func.func public @main(%x: tensor<32xf32>, %n: tensor<i32>, %m: tensor<i32>) -> (tensor<4xf32>) {{
    %d = stablehlo.set_dimension_size %x, %m, dim = 0 : (tensor<32xf32>, tensor<i32>) -> tensor<?xf32, #stablehlo.bounds<32>>
    {split}
    %z = stablehlo.constant dense<0.0> : tensor<f32>
    %rows = stablehlo.reduce(%r init: %z) applies stablehlo.add across dimensions = [1] : ({dyn}, tensor<f32>) -> tensor<4xf32>
    return %rows : tensor<4xf32>
  }}
}}
"""
SPLITS = {
    "dynamic_reshape": """%four = stablehlo.constant dense<4> : tensor<1xi32>
    %nn = stablehlo.reshape %n : (tensor<i32>) -> tensor<1xi32>
    %shape = stablehlo.concatenate %four, %nn, dim = 0 : (tensor<1xi32>, tensor<1xi32>) -> tensor<2xi32>
    %r = stablehlo.dynamic_reshape %d, %shape : (tensor<?xf32, #stablehlo.bounds<32>>, tensor<2xi32>) -> {dyn}""",
    "reshape": "%r = stablehlo.reshape %d : (tensor<?xf32, #stablehlo.bounds<32>>) -> {dyn}",
}

# A count inside a fragment: get_dimension_size of the fragment's bounded-typed parameter is the runtime size (one
# executable serves every size of the bucket); of a static-typed intermediate (the exp below) it folds to the bound.
COUNT = f"""
module @probe {{{{
  func.func public @main(%x: tensor<4x8xf32>, %n: tensor<i32>) -> (tensor<4xf32>, tensor<4xf32>) {{{{
    %d = stablehlo.set_dimension_size %x, %n, dim = 1 : (tensor<4x8xf32>, tensor<i32>) -> {DYN}
    %e:2 = "func.call"(%d) {{{{callee = @frag}}}} : ({DYN}) -> (tensor<4xf32>, tensor<4xf32>)
    return %e#0, %e#1 : tensor<4xf32>, tensor<4xf32>
  }}}}
  func.func private @frag(%a: {DYN}) -> (tensor<4xf32>, tensor<4xf32>) {{{{
    %v = stablehlo.exponential %a : ({DYN}) -> tensor<4x8xf32>
    %z = stablehlo.constant dense<0.0> : tensor<f32>
    %s = stablehlo.reduce(%v init: %z) applies stablehlo.add across dimensions = [1] : (tensor<4x8xf32>, tensor<f32>) -> tensor<4xf32>
    {{mean}}
    return %m, %m2 : tensor<4xf32>, tensor<4xf32>
  }}}}
}}}}
"""
MEAN = "\n    ".join(
    f"%c{k} = stablehlo.get_dimension_size {src}, dim = 1 : ({ty}) -> tensor<i32>\n"
    f"    %f{k} = stablehlo.convert %c{k} : (tensor<i32>) -> tensor<f32>\n"
    f"    %b{k} = stablehlo.broadcast_in_dim %f{k}, dims = [] : (tensor<f32>) -> tensor<4xf32>\n"
    f"    %m{k if k else ''} = stablehlo.divide %s, %b{k} : tensor<4xf32>"
    for k, src, ty in ((0, "%a", DYN), (2, "%v", "tensor<4x8xf32>"))
).replace("%m0 ", "%m ")

# The leading dimension (a varying batch): padded and compact layouts are the same there, so a bucketed tensor is a
# plain prefix of its storage. A matmul (dot_general) with a dynamic M inside a fragment, a softmax over the static
# dim and a sum over the dynamic one; the matmul's result is also returned.
LDYN = "tensor<?x4xf32, #stablehlo.bounds<8, ?>>"
LEADING = f"""
module @probe {{
  func.func public @main(%x: tensor<8x4xf32>, %w: tensor<4x3xf32>, %n: tensor<i32>) -> (tensor<8x3xf32>, tensor<3xf32>) {{
    %d = stablehlo.set_dimension_size %x, %n, dim = 0 : (tensor<8x4xf32>, tensor<i32>) -> {LDYN}
    %r:2 = "func.call"(%d, %w) {{callee = @frag}} : ({LDYN}, tensor<4x3xf32>) -> (tensor<8x3xf32>, tensor<3xf32>)
    return %r#0, %r#1 : tensor<8x3xf32>, tensor<3xf32>
  }}
  func.func private @frag(%a: {LDYN}, %w: tensor<4x3xf32>) -> (tensor<8x3xf32>, tensor<3xf32>) {{
    %y = stablehlo.dot_general %a, %w, contracting_dims = [1] x [0] : ({LDYN}, tensor<4x3xf32>) -> tensor<8x3xf32>
    %ninf = stablehlo.constant dense<0xFF800000> : tensor<f32>
    %z = stablehlo.constant dense<0.0> : tensor<f32>
    %mx = stablehlo.reduce(%y init: %ninf) applies stablehlo.maximum across dimensions = [1] : (tensor<8x3xf32>, tensor<f32>) -> tensor<8xf32>
    %mxb = stablehlo.broadcast_in_dim %mx, dims = [0] : (tensor<8xf32>) -> tensor<8x3xf32>
    %ex = stablehlo.exponential %0 : tensor<8x3xf32>
    %sm = stablehlo.reduce(%ex init: %z) applies stablehlo.add across dimensions = [1] : (tensor<8x3xf32>, tensor<f32>) -> tensor<8xf32>
    %smb = stablehlo.broadcast_in_dim %sm, dims = [0] : (tensor<8xf32>) -> tensor<8x3xf32>
    %p = stablehlo.divide %ex, %smb : tensor<8x3xf32>
    %cols = stablehlo.reduce(%p init: %z) applies stablehlo.add across dimensions = [0] : (tensor<8x3xf32>, tensor<f32>) -> tensor<3xf32>
    return %y, %cols : tensor<8x3xf32>, tensor<3xf32>
  }}
}}
""".replace(
    "%ex = stablehlo.exponential %0",
    "%sub = stablehlo.subtract %y, %mxb : tensor<8x3xf32>\n    %ex = stablehlo.exponential %sub",
)


def main():
    rt = runtime.get()
    x = np.arange(32, dtype=np.float32).reshape(4, 8) / 100
    n = 3
    exe = rt.compile(TEXT)
    rows, total, count, flat = (
        np.asarray(r)
        for r in rt.execute(exe, [jax.device_put(x, rt.device(0)), jax.device_put(np.int32(n), rt.device(0))])
    )
    e = np.exp(x[:, :n])
    print(
        "sum over the dynamic dim:",
        rows.round(4),
        "expected",
        e.sum(1).round(4),
        "masked" if np.allclose(rows, e.sum(1), rtol=1e-5) else "NOT masked",
    )
    print("sum over all dims:", round(float(total), 4), "expected", round(float(e.sum()), 4))
    print("get_dimension_size of a static-typed value:", int(count), f"(true size {n}, bound 8)")
    print(
        "reshape to 32 comes back compact (valid values first):", np.allclose(flat[: 4 * n], e.reshape(-1), rtol=1e-5)
    )
    compact = np.zeros(32, np.float32)
    compact[: 4 * n] = np.arange(1, 4 * n + 1)
    want = np.arange(1, 4 * n + 1).reshape(4, n).sum(1)
    for name, split in SPLITS.items():
        exe = rt.compile(FEED_BACK.format(split=split.format(dyn=DYN), dyn=DYN))
        (got,) = rt.execute(exe, [jax.device_put(a, rt.device(0)) for a in (compact, np.int32(n), np.int32(4 * n))])
        print(f"compact prefix fed back through {name}: row sums {np.asarray(got)} (want {want})")
    exe = rt.compile(COUNT.format(mean=MEAN))
    for size in (3, 5):
        m, m2 = (
            np.asarray(r)
            for r in rt.execute(exe, [jax.device_put(x, rt.device(0)), jax.device_put(np.int32(size), rt.device(0))])
        )
        want = np.exp(x[:, :size]).mean(1)
        print(
            f"mean over the dynamic dim (size {size}, one executable): get_dimension_size of the bounded parameter "
            f"{'right' if np.allclose(m, want, rtol=1e-5) else 'WRONG'}, of a static-typed intermediate "
            f"{'right' if np.allclose(m2, want, rtol=1e-5) else 'wrong (the bound)'}"
        )
    exe = rt.compile(LEADING)
    xl = np.linspace(-1, 1, 32, dtype=np.float32).reshape(8, 4)
    w = np.linspace(0.5, -0.5, 12, dtype=np.float32).reshape(4, 3)
    for size in (3, 6):
        y, cols = (
            np.asarray(r) for r in rt.execute(exe, [jax.device_put(a, rt.device(0)) for a in (xl, w, np.int32(size))])
        )
        yy = xl[:size] @ w
        pp = np.exp(yy - yy.max(1, keepdims=True))
        pp /= pp.sum(1, keepdims=True)
        print(
            f"leading dim (size {size} of 8, one executable): matmul rows {'right' if np.allclose(y.reshape(-1)[: size * 3], yy.reshape(-1), rtol=1e-5) else 'WRONG'} "
            f"(result shape {y.shape}), softmax then sum over the dynamic dim {'masked' if np.allclose(cols, pp.sum(0), rtol=1e-5) else 'NOT masked'}"
        )
    try:
        rt.compile(STATIC_CALLEE)
        print("func.call with a static-typed callee: accepted")
    except Exception as err:  # noqa: BLE001 (the message is the finding)
        print("func.call with a static-typed callee: rejected:", str(err).splitlines()[0][:160])


if __name__ == "__main__":
    main()
