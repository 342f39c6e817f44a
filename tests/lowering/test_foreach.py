"""_foreach_* ops: one program per call, same values as CPU."""

import torch
from conftest import assert_same

import torchtpu


def _lists(n=3):
    g = torch.Generator().manual_seed(0)
    cs = [torch.randn(3, k + 2, generator=g) for k in range(n)]
    return cs, [c.to("tpu") for c in cs]


def test_foreach_inplace_ops_match_cpu_in_one_launch_each():
    cs, ts = _lists()
    for xs in (cs, ts):
        torch._foreach_mul_(xs, 0.5)
        torch._foreach_add_(xs, [x * 2 for x in xs], alpha=0.3)
        torch._foreach_lerp_(xs, [x + 1 for x in xs], 0.1)
        torch._foreach_addcmul_(xs, xs, xs, value=0.01)
        torch._foreach_addcdiv_(xs, xs, [x.abs() + 1 for x in xs], [0.1, 0.2, 0.3])
        torch._foreach_div_(xs, [2.0, 3.0, 4.0])
    assert_same(cs, ts)
    torchtpu.sync()
    torchtpu.metrics.reset()
    torch._foreach_mul_(ts, 0.25)
    torchtpu.sync()
    assert torchtpu.metrics.counters()["executions"] == 1


def test_foreach_functional_ops():
    cs, ts = _lists()
    assert_same(list(torch._foreach_sqrt([c.abs() for c in cs])), list(torch._foreach_sqrt([t.abs() for t in ts])))
    assert_same(list(torch._foreach_add(cs, 1.5)), list(torch._foreach_add(ts, 1.5)))
    assert_same(list(torch._foreach_maximum(cs, 0.1)), list(torch._foreach_maximum(ts, 0.1)))
