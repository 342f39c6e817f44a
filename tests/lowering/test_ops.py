"""Every lowered op against CPU: float32, bfloat16 and the integer/bool dtypes it supports,
forward and (for float ops) gradient. Each case asserts that no CPU fallback ran."""

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_same

import torchtpu

FLOAT = [torch.float32, torch.bfloat16]
INT = [torch.int32, torch.int64]
ALL = FLOAT + INT + [torch.bool]


def make(shape, dtype, seed=0, positive=False, low=None):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if not dtype.is_floating_point:
        lo = 1 if positive else -9
        return torch.randint(lo if low is None else low, 10, shape, generator=g, dtype=dtype)
    x = torch.randn(shape, generator=g)
    if positive:
        x = x.abs() + 0.1
    return x.to(dtype)


def tol(dtype):
    return dict(rtol=1.6e-2, atol=1e-2) if dtype == torch.bfloat16 else dict(rtol=2e-5, atol=2e-5)


# name -> (fn, input builders (shape, positive?), dtypes, grad?)
CASES = {
    "add": (lambda a, b: a + b * 2, [(3, 4), (4,)], ALL[:-1], True),
    "add_bool": (lambda a, b: a + b, [(3, 4), (3, 4)], [torch.bool], False),
    "sub_alpha": (lambda a, b: torch.sub(a, b, alpha=3), [(3, 4), (3, 1)], FLOAT + INT, True),
    "mul": (lambda a, b: a * b, [(2, 3, 4), (3, 1)], ALL, True),
    "div": (lambda a, b: a / b, [(3, 4), (3, 4, "pos")], FLOAT + INT, True),
    "div_floor": (lambda a, b: torch.div(a, b, rounding_mode="floor"), [(5, 6), (5, 6, "pos")], FLOAT + INT, False),
    "div_trunc": (lambda a, b: torch.div(a, b, rounding_mode="trunc"), [(5, 6), (5, 6, "pos")], FLOAT + INT, False),
    "remainder": (lambda a, b: torch.remainder(a, b), [(5, 6), (5, 6, "pos")], FLOAT + INT, False),
    "remainder_neg": (lambda a, b: torch.remainder(a, -b), [(5, 6), (5, 6, "pos")], INT, False),
    "scalar_promote": (lambda a: a * 2.5 + 1, [(3, 4)], FLOAT + INT, True),
    "rsub": (lambda a: 1 - a, [(3, 4)], FLOAT + INT, True),
    "pow_scalar": (lambda a: a**3, [(3, 4)], FLOAT + INT, True),
    "pow_tensor": (lambda a, b: torch.pow(a, b), [(3, 4, "pos"), (3, 4)], FLOAT, True),
    "sqrt": (torch.sqrt, [(3, 4, "pos")], FLOAT, True),
    "rsqrt": (torch.rsqrt, [(3, 4, "pos")], FLOAT, True),
    "exp": (torch.exp, [(3, 4)], FLOAT, True),
    "log": (torch.log, [(3, 4, "pos")], FLOAT, True),
    "tanh": (torch.tanh, [(3, 4)], FLOAT, True),
    "sigmoid": (torch.sigmoid, [(3, 4)], FLOAT, True),
    "relu": (torch.relu, [(3, 4)], FLOAT + INT, True),
    "gelu": (F.gelu, [(3, 4)], FLOAT, True),
    "gelu_tanh": (lambda a: F.gelu(a, approximate="tanh"), [(3, 4)], FLOAT, True),
    "silu": (F.silu, [(3, 4)], FLOAT, True),
    "neg_abs": (lambda a: -a.abs(), [(3, 4)], FLOAT + INT, True),
    "compare": (lambda a, b: torch.stack([a < b, a <= b, a > b, a >= b, a == b, a != b]), [(3, 4), (4,)], ALL, False),
    "compare_scalar": (lambda a: (a > 0) & (a != 2), [(3, 4)], FLOAT + INT, False),
    "where": (lambda c, a, b: torch.where(c, a, b), [("bool", 3, 4), (3, 4), (4,)], FLOAT + INT, True),
    "where_scalar": (lambda c, a: torch.where(c, a, 0.5), [("bool", 3, 4), (3, 4)], FLOAT, True),
    "clamp": (lambda a: a.clamp(-0.5, 0.7), [(3, 4)], FLOAT, True),
    "clamp_int": (lambda a: a.clamp(min=-2, max=3), [(3, 4)], INT, False),
    "clamp_tensor": (lambda a, lo: torch.clamp(a, min=lo), [(3, 4), (4,)], FLOAT, True),
    "masked_fill": (lambda a, m: a.masked_fill(m, -1.5), [(3, 4), ("bool", 3, 4)], FLOAT, True),
    "mm": (torch.mm, [(3, 5), (5, 4)], FLOAT, True),
    "bmm": (torch.bmm, [(2, 3, 5), (2, 5, 4)], FLOAT, True),
    "addmm": (lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2), [(4,), (3, 5), (5, 4)], FLOAT, True),
    "matmul_nd": (torch.matmul, [(2, 3, 5), (5, 4)], FLOAT, True),
    "linear": (F.linear, [(2, 3, 5), (4, 5), (4,)], FLOAT, True),
    "sum": (lambda a: (a.sum(), a.sum(1), a.sum((0, 2), keepdim=True)), [(2, 3, 4)], ALL, True),
    "mean": (lambda a: (a.mean(), a.mean(-1, keepdim=True)), [(2, 3, 4)], FLOAT, True),
    "max_min": (lambda a: (a.max(), a.min(), a.amax(1), a.amin((0, 1))), [(2, 3, 4)], FLOAT + INT, True),
    "max_dim": (lambda a: a.max(1), [(3, 5)], FLOAT + INT, True),
    "argmax": (lambda a: (a.argmax(), a.argmax(1), a.argmin(0, keepdim=True)), [(4, 5)], FLOAT + INT, False),
    "var_std": (lambda a: (a.var(), a.std(1), a.var(0, unbiased=False)), [(4, 5)], FLOAT, True),
    "prod": (lambda a: a.prod(1), [(3, 4)], [torch.float32] + INT, True),
    "any_all": (lambda a: (a.any(), a.all(1), (a > 0).any(0)), [(3, 4)], ALL, False),
    "logsumexp": (lambda a: torch.logsumexp(a, 1), [(3, 4)], FLOAT, True),
    "softmax": (lambda a: a.softmax(-1), [(3, 4)], FLOAT, True),
    "log_softmax": (lambda a: a.log_softmax(0), [(3, 4)], FLOAT, True),
    "layer_norm": (lambda a, w, b: F.layer_norm(a, (4,), w, b), [(2, 3, 4), (4,), (4,)], FLOAT, True),
    "cross_entropy": (lambda a, t: F.cross_entropy(a, t), [(5, 7), ("cls", 5, 7)], FLOAT, True),
    "cross_entropy_ignore": (
        lambda a, t: F.cross_entropy(a, t, ignore_index=2, reduction="sum"),
        [(5, 7), ("cls", 5, 7)],
        [torch.float32],
        True,
    ),
    "nll_none": (
        lambda a, t: F.nll_loss(a.log_softmax(1), t, reduction="none"),
        [(5, 7), ("cls", 5, 7)],
        [torch.float32],
        True,
    ),
    "embedding": (lambda w, i: F.embedding(i, w), [(7, 3), ("cls", 4, 7)], FLOAT, True),
    "cat_stack": (lambda a, b: (torch.cat([a, b], 1), torch.stack([a, b])), [(2, 3), (2, 3)], ALL, True),
    "split": (lambda a: [p * 1 for p in a.split(2, dim=1)], [(3, 5)], FLOAT, True),
    "index_select": (lambda a, i: a.index_select(1, i), [(3, 7), ("cls", 5, 7)], ALL, True),
    "gather": (lambda a, i: a.gather(1, i), [(3, 7), ("cls", 3, 4, 7)], FLOAT + INT, True),
    "scatter": (lambda a, i, s: a.scatter(1, i[:, :1], s), [(3, 7), ("cls", 3, 4, 7), (3, 4)], FLOAT, False),
    "scatter_add": (lambda a, i, s: a.scatter_add(1, i, s), [(3, 7), ("cls", 3, 4, 7), (3, 4)], FLOAT, True),
    "index": (lambda a, i: (a[i], a[:, i], a[i, i]), [(7, 7), ("cls", 3, 7)], ALL, True),
    "index_put": (lambda a, i, v: a.index_put((i,), v, accumulate=True), [(7, 3), ("cls", 5, 7), (5, 3)], FLOAT, True),
    "tril_triu": (lambda a: (a.tril(), a.triu(1), a.tril(-1)), [(4, 5)], ALL, True),
    "arange_full": (
        lambda a: a + torch.arange(4, device=a.device) * torch.full((4,), 2, device=a.device),
        [(3, 4)],
        FLOAT + INT,
        True,
    ),
    "zeros_ones_like": (lambda a: torch.zeros_like(a) + torch.ones_like(a) * a, [(3, 4)], ALL[:-1], True),
    "conv2d": (lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1), [(2, 3, 7, 7), (4, 3, 3, 3), (4,)], FLOAT, True),
    "conv1d_groups_dilation": (lambda x, w: F.conv1d(x, w, groups=2, dilation=2), [(2, 4, 9), (6, 2, 3)], FLOAT, True),
    "conv_transpose2d": (
        lambda x, w: F.conv_transpose2d(x, w, stride=2, padding=1, output_padding=1),
        [(2, 3, 5, 5), (3, 4, 3, 3)],
        FLOAT,
        True,
    ),
    "conv3d": (lambda x, w: F.conv3d(x, w, padding=1), [(1, 2, 4, 4, 4), (3, 2, 2, 2, 2)], [torch.float32], True),
    "batch_norm_train": (
        lambda x, w, b: F.batch_norm(
            x,
            torch.zeros(3, device=x.device, dtype=x.dtype),
            torch.ones(3, device=x.device, dtype=x.dtype),
            w,
            b,
            training=True,
        ),
        [(4, 3, 5), (3,), (3,)],
        FLOAT,
        True,
    ),
    "avg_pool2d": (
        lambda x: F.avg_pool2d(x, 3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
        [(2, 3, 7, 7)],
        FLOAT,
        True,
    ),
    "max_pool2d": (lambda x: F.max_pool2d(x, 2), [(2, 3, 6, 6)], FLOAT, True),
    "lerp_addc": (
        lambda a, b, c: (
            torch.lerp(a, b, 0.3),
            torch.addcmul(a, b, c, value=0.5),
            torch.addcdiv(a, b, c.abs() + 1, value=2),
        ),
        [(3, 4), (3, 4), (3, 4)],
        [torch.float32],
        True,
    ),
    "to_dtype": (
        lambda a: (a.to(torch.float32), a.to(torch.int32), a.to(torch.bool), a.to(torch.bfloat16)),
        [(3, 4)],
        ALL,
        False,
    ),
}

PARAMS = [(name, dt) for name, (_, _, dts, _) in sorted(CASES.items()) for dt in dts]


def build(specs, dtype, seed0=0):
    out = []
    for k, spec in enumerate(specs):
        seed = seed0 + k
        if spec[0] == "bool":
            out.append(make(spec[1:], torch.bool, seed))
        elif spec[0] == "cls":
            *shape, n = spec[1:]
            out.append(torch.randint(0, n, shape, generator=torch.Generator().manual_seed(seed)))
        else:
            pos = spec[-1] == "pos"
            shape = spec[:-1] if pos else spec
            out.append(make(shape, dtype, seed, positive=pos))
    return out


def _float_leaves(xs):
    return [x for x in xs if x.dtype.is_floating_point]


@pytest.mark.parametrize("name,dtype", PARAMS, ids=[f"{n}-{str(d)[6:]}" for n, d in PARAMS])
def test_op_matches_cpu(name, dtype):
    fn, specs, _, grad = CASES[name]
    cpu_in = build(specs, dtype)
    tpu_in = [x.to("tpu") for x in cpu_in]
    assert_same(fn(*cpu_in), fn(*tpu_in), **tol(dtype))
    assert not any(k.startswith("fallback.") for k in torchtpu.metrics.counters()), torchtpu.metrics.counters()
    if grad and dtype.is_floating_point:
        cpu_in = [x.detach().requires_grad_(x.dtype.is_floating_point) for x in cpu_in]
        tpu_in = [x.detach().to("tpu").requires_grad_(x.dtype.is_floating_point) for x in cpu_in]

        def scalar(out):
            outs = out if isinstance(out, (tuple, list)) else [out]
            outs = [o.values if hasattr(o, "values") and not isinstance(o, torch.Tensor) else o for o in outs]
            return sum((o.float() * (k + 1)).sum() for k, o in enumerate(outs) if o.dtype.is_floating_point)

        scalar(fn(*cpu_in)).backward()
        scalar(fn(*tpu_in)).backward()
        for a, b in zip(_float_leaves(cpu_in), _float_leaves(tpu_in)):
            assert_same(a.grad, b.grad, **tol(dtype))
        assert not any(k.startswith("fallback.") for k in torchtpu.metrics.counters()), torchtpu.metrics.counters()


def test_integer_division_signs_and_nan_propagation():
    a = torch.tensor([7, -7, 7, -7])
    b = torch.tensor([2, 2, -2, -2])
    ta, tb = a.to("tpu"), b.to("tpu")
    assert_same(a // b, ta // tb)
    assert_same(a % b, ta % tb)
    x = torch.tensor([1.0, float("nan"), 3.0])
    assert_same(x.max(), x.to("tpu").max())
    assert_same(torch.maximum(x, torch.ones(3)), torch.maximum(x.to("tpu"), torch.ones(3, device="tpu")))
    assert_same(x.argmax(), x.to("tpu").argmax())


def test_unique_runs_on_device_with_one_counted_host_sync():
    x = torch.tensor([[3, 1, 2], [3, 5, 1]])
    torchtpu.metrics.reset()
    v, inv, cnt = torch.unique(x.to("tpu"), return_inverse=True, return_counts=True)
    ev, einv, ecnt = torch.unique(x, return_inverse=True, return_counts=True)
    assert torch.equal(v.cpu(), ev) and torch.equal(inv.cpu(), einv) and torch.equal(cnt.cpu(), ecnt)
    c = torchtpu.metrics.counters()
    assert c["host_sync.unique"] == 1 and not any(k.startswith("fallback.") for k in c)
