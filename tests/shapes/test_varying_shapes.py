"""Sizes that change from step to step: a hand-written top-k mixture-of-experts router (data-dependent token counts
per expert, `index_add_`) and a training loop over batches whose sequence length varies between 17 and 64. The
eager modes bucket the routed counts (tests/shapes/test_eager_buckets.py) and the varying length
(tests/shapes/test_eager_symbolic.py; torch.compile with dynamic=True: tests/shapes/test_buckets.py); these tests hold
what must stay true: the values match cpu, nothing falls back to the CPU, the host reads are the ones the code asks for,
and a size seen before compiles nothing."""

import copy
import itertools
import warnings

import pytest
import torch
import zoo

import torchtpu


def _host_syncs_by_cause(counters):
    return {k[len("host_sync.") :]: v for k, v in counters.items() if k.startswith("host_sync.")}


def test_topk_router_layer_forward_and_backward_match_cpu():
    torch.manual_seed(0)
    layer = zoo.TopKMoE()
    twin = copy.deepcopy(layer).to("tpu")
    x = torch.randn(3, 10, 32)
    cot = torch.randn(3, 10, 32)
    outs, grads = [], []
    for dev, m in (("cpu", layer), ("tpu", twin)):
        xd = x.detach().to(dev).requires_grad_()
        out = m(xd)
        (out * cot.to(dev)).sum().backward()
        outs.append(out.detach().cpu())
        grads.append([xd.grad.cpu()] + [p.grad.cpu() for p in m.parameters()])
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-5)
    assert len(grads[0]) == len(grads[1]) == 1 + 1 + 4 * 4  # x, router, 4 experts x (2 weights + 2 biases)
    for got, want in zip(grads[1], grads[0]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.one_pass("strict")  # slow; the fused pass runs the varying-length loop
def test_topk_router_model_trains_like_cpu_reading_only_the_counts():
    steps = 2
    r = zoo.side_by_side("topk_moe", steps=steps)
    assert r["max_rel_diff"] < 1e-5, (r["cpu"]["losses"], r["tpu"]["losses"])
    assert not r["fallbacks"], r["fallbacks"]
    # per step: each expert's token count (where -> nonzero; 2 layers x 4 experts) and the loss
    assert _host_syncs_by_cause(r["counters"]) == {"nonzero": steps * 2 * 4, "item": steps}


@pytest.mark.one_pass("fused")  # slow; the strict pass runs the top-k router model
def test_training_over_lengths_from_17_to_64_matches_cpu_and_a_length_seen_before_compiles_nothing():
    steps = 2
    r = zoo.side_by_side("gpt2_varlen", steps=steps)
    batches = zoo._varlen_batches(steps)
    assert len({b["input_ids"].shape[1] for b in batches}) == steps  # a new length every step
    assert all(17 <= b["input_ids"].shape[1] <= 64 for b in batches)
    assert r["max_rel_diff"] < 1e-5, (r["cpu"]["losses"], r["tpu"]["losses"])
    assert not r["fallbacks"], r["fallbacks"]
    assert _host_syncs_by_cause(r["counters"]) == {"item": steps}
    _, twin = r["models"]
    opt = torch.optim.AdamW(twin.parameters(), lr=1e-3)

    def train(rounds):
        for b in itertools.chain(*[batches] * rounds):
            opt.zero_grad()
            loss = twin(**zoo._to(b, "tpu")).loss
            loss.backward()
            opt.step()
            loss.item()

    # Warm-up. Fused mode makes one program per step, and which ones this new optimizer needs differs from
    # side_by_side's: its step 1 is keyed apart (AdamW's step count 1 is a value the signatures tell apart from
    # others), so the first length needs a program for a later step too.
    train(2)
    c0 = torchtpu.metrics.counters()
    train(1)
    assert torchtpu.metrics.counters().get("compiles", 0) == c0.get("compiles", 0)


def test_a_dim_that_changes_between_calls_is_counted_and_said_once():
    """Outside the data-dependent rows, a size that changes between calls (a sequence length) compiles anew in the
    eager modes: each such lowering is counted, and the process is told once, with what to do instead."""
    from torchtpu.shapes import eager_buckets as eb

    eb._SIZES.clear()
    eb._warned_varying.clear()
    lin = torch.nn.Linear(7, 5).to("tpu")
    c0 = torchtpu.metrics.counters().get("lowerings.size_changes", 0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for t in range(17, 19 + eb.VARYING_AFTER):
            lin(torch.ones(3, t, 7, device="tpu")).relu().sum().item()
        for t in (17, 18):  # sizes seen before: nothing lowered, nothing said
            lin(torch.ones(3, t, 7, device="tpu")).relu().sum().item()
    said = [str(w.message) for w in caught if "sizes of dim 1" in str(w.message)]
    assert len(said) == 1, said
    assert "dynamic=True" in said[0] and "test_varying_shapes.py" in said[0], said[0]
    assert torchtpu.metrics.counters()["lowerings.size_changes"] - c0 >= eb.VARYING_AFTER + 1
    # layers of many widths lowered in one step (no host read between them), and a pyramid whose two dims change
    # together, say nothing
    eb._SIZES.clear()
    eb._warned_varying.clear()
    c0 = torchtpu.metrics.counters().get("lowerings.size_changes", 0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            sum(torch.ones(5, w, 3, device="tpu").relu().sum() for w in range(17, 19 + eb.VARYING_AFTER)).item()
        assert torchtpu.metrics.counters()["lowerings.size_changes"] - c0 >= eb.VARYING_AFTER  # lowered, counted
        for w in (3, 6, 12, 24, 48, 96, 192, 384, 768):
            torch.ones(2, w, 96 * 8 // w, device="tpu").relu().sum().item()
    assert not [w for w in caught if "sizes of dim" in str(w.message)]
