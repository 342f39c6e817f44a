import pytest
import torch

import torchtpu


def test_same_seed_same_numbers_and_state_roundtrip():
    torch.manual_seed(123)
    a = torch.randn(4, 5, device="tpu").cpu()
    torch.manual_seed(123)
    b = torch.randn(4, 5, device="tpu").cpu()
    assert torch.equal(a, b)
    state = torch.tpu.get_rng_state()
    assert state.dtype == torch.uint8 and state.numel() == 16
    c = torch.rand(100, device="tpu").cpu()
    torch.tpu.set_rng_state(state)
    d = torch.rand(100, device="tpu").cpu()
    assert torch.equal(c, d)
    e = torch.rand(100, device="tpu").cpu()
    assert not torch.equal(d, e)  # the offset advanced


def test_state_tail_is_seed_and_offset():
    torch.tpu.manual_seed(77)
    s = torch.tpu.get_rng_state()
    assert int(s[:8].view(torch.int64)) == 77 and int(s[8:].view(torch.int64)) == 0
    torch.rand(10, device="tpu")
    assert int(torch.tpu.get_rng_state()[8:].view(torch.int64)) > 0


def test_distributions_and_generator_object():
    g = torch.Generator(device="tpu").manual_seed(5)
    u = torch.rand(20000, device="tpu", generator=g).cpu()
    assert 0.0 <= u.min() and u.max() < 1.0 and abs(u.mean() - 0.5) < 0.01
    n = torch.randn(20000, device="tpu", dtype=torch.float64).cpu()
    assert abs(n.mean()) < 0.03 and abs(n.std() - 1) < 0.03
    b = torch.bernoulli(torch.full((20000,), 0.3, device="tpu")).cpu()
    assert abs(b.mean() - 0.3) < 0.02
    r = torch.randint(3, 9, (1000,), device="tpu").cpu()
    assert r.min() >= 3 and r.max() <= 8 and r.dtype == torch.int64
    h = torch.empty(1000, device="tpu", dtype=torch.bfloat16).uniform_(-2, 2).cpu()
    assert h.min() >= -2 and h.max() < 2
    d = torch.nn.functional.dropout(torch.ones(10000, device="tpu"), 0.25).cpu()
    assert abs((d == 0).float().mean() - 0.25) < 0.02 and torch.allclose(d[d != 0], torch.tensor(1 / 0.75))


def test_random_ops_draw_from_tpu_generator_not_cpu():
    torch.manual_seed(0)
    cpu_before = torch.get_rng_state()
    torch.randn(10, device="tpu")
    assert torch.equal(cpu_before, torch.get_rng_state())
    assert not any(k.startswith("fallback.") for k in torchtpu.metrics.counters())


def test_same_numbers_in_every_mode():
    outs = []
    for m in ("strict", "debug"):
        with torchtpu.mode(m):
            torch.tpu.manual_seed(9)
            outs.append(torch.randn(50, device="tpu").cpu())
    assert torch.equal(outs[0], outs[1])


def test_multinomial_on_the_device_follows_the_distribution_and_cpu_checks():
    before = {k: v for k, v in torchtpu.metrics.counters().items() if k.startswith("fallback.")}
    p = torch.tensor([[0.1, 0.2, 0.7, 0.0], [0.5, 0.5, 0.0, 0.0]], device="tpu")
    torch.tpu.manual_seed(4)
    for replacement in (False, True):
        s = torch.multinomial(p.repeat(4000, 1), 1, replacement=replacement).cpu()
        freq0 = torch.bincount(s[0::2, 0], minlength=4) / 4000
        freq1 = torch.bincount(s[1::2, 0], minlength=4) / 4000
        assert torch.allclose(freq0, torch.tensor([0.1, 0.2, 0.7, 0.0]), atol=0.03), freq0
        assert torch.allclose(freq1, torch.tensor([0.5, 0.5, 0.0, 0.0]), atol=0.03), freq1
    two = torch.multinomial(p, 2).cpu()  # without replacement: distinct categories of nonzero probability
    assert two[1].sort().values.tolist() == [0, 1] and two[0, 0] != two[0, 1] and 3 not in two[0].tolist()
    assert torch.multinomial(p[0], 6, replacement=True).shape == (6,)
    g = torch.Generator(device="tpu").manual_seed(1)
    a = torch.multinomial(p, 2, generator=g).cpu()
    g.manual_seed(1)
    assert torch.equal(a, torch.multinomial(p, 2, generator=g).cpu())
    outs = []
    for m in ("strict", "fused", "debug"):
        with torchtpu.mode(m):
            torch.tpu.manual_seed(9)
            outs.append(torch.multinomial(torch.softmax(torch.arange(50.0, device="tpu") / 9, 0), 5).cpu())
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
    for bad, msg in (
        ([[0.5, -0.1]], "element < 0"),
        ([[float("nan"), 1.0]], "`nan`"),
        ([[0.0, 0.0]], "sum of probabilities <= 0"),
    ):
        with pytest.raises(RuntimeError, match=msg):
            torch.multinomial(torch.tensor(bad, device="tpu"), 1).cpu()
    with pytest.raises(RuntimeError, match="not enough non-negative category"):
        torch.multinomial(p, 3).cpu()
    with pytest.raises(RuntimeError, match="without replacement"):
        torch.multinomial(p, 5)
    # more categories than float32 counts exactly: cpu's and cuda's shape error, before any device work (no compile)
    wide = torch.ones(2**24 + 1, device="tpu")
    compiles = torchtpu.metrics.counters().get("compiles", 0)
    with pytest.raises(RuntimeError, match=r"multinomial: number of categories cannot exceed 2\^24, got 16777217"):
        torch.multinomial(wide, 3)
    assert torchtpu.metrics.counters().get("compiles", 0) == compiles
    after = {k: v for k, v in torchtpu.metrics.counters().items() if k.startswith("fallback.")}
    assert after == before
