"""Fused eager and the C++ per-op path: ops recorded into a pending graph and run as one XLA program per chunk;
a warmed-up step runs no Python lowering code; chunks are keyed by structure, so step 2 on compiles nothing."""

import os
import sys

import pytest
import torch
import torch.nn.functional as F

import torchtpu
from torchtpu import _C


def test_chunk_holds_many_ops_and_keeps_temporaries_off_the_device():
    x = torch.randn(64, device="tpu")
    torchtpu.sync()
    with torchtpu.mode("fused"):
        torchtpu.metrics.reset()
        y = x
        for _ in range(20):
            y = torch.tanh(y * 1.5 + 0.25)
        assert _C._pending_ops(0) == 60
        out = y.cpu()
    c = torchtpu.metrics.counters()
    assert c["executions"] == 1 and c["chunk_ops"] == 60 and c["cuts.host_read"] == 1
    assert c["transfers.d2h"] == 1  # the 59 temporaries never left the program
    ref = x.cpu()
    for _ in range(20):
        ref = torch.tanh(ref * 1.5 + 0.25)
    torch.testing.assert_close(out, ref)


@pytest.mark.pins_mode
def test_fused_matches_strict_and_random_numbers_agree():
    outs = {}
    for m in ("strict", "fused"):
        with torchtpu.mode(m):
            torch.manual_seed(123)
            a = torch.randn(16, 16, device="tpu")
            d = F.dropout(a, 0.5, training=True)
            outs[m] = ((a @ a.t()).softmax(-1) + d).cpu()
    torch.testing.assert_close(outs["fused"], outs["strict"], rtol=1e-6, atol=1e-6)


@pytest.mark.pins_mode
def test_training_step_two_on_compiles_nothing_in_every_mode():
    import train_gpt as gpt

    build = lambda: gpt.small_gpt(dropout=False)  # noqa: E731
    cpu, _, _ = gpt.train(build, "cpu", 5)
    for m in ("strict", "fused", "debug"):
        losses, _, compiles = gpt.train(build, "tpu", 5, mode=m)
        assert sum(compiles[2:]) == 0, (m, compiles)
        assert max(abs(a - b) / abs(a) for a, b in zip(cpu, losses)) < 1e-5, (m, cpu, losses)


@pytest.mark.pins_mode
def test_warmed_up_training_step_runs_no_python_lowering_code():
    """On an op-table hit no Python runs but the one jaxlib call that launches: the rules, the tracer and the
    StableHLO builder are not even entered."""
    import train_gpt as gpt

    pkg = os.path.dirname(torchtpu.__file__)
    lowering_files = {
        os.path.join(pkg, f)
        for f in ("kernels.py", "trace.py", "emit.py", "hlo.py", "views.py", "jaxfn.py", "tables.py")
    }
    lowering_dir = os.path.join(pkg, "lowering")
    for m in ("strict", "fused"):
        torch.manual_seed(0)
        model = gpt.small_gpt(dropout=True)[0].to("tpu")  # dropout on: the random ops too
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        data = [(x.to("tpu"), y.to("tpu")) for x, y in gpt.batches(4, 16, 32, 64)]
        entered = []

        host_reads = {"_local_scalar_dense", "covers_storage", "is_contiguous"}  # loss.item(): not lowering

        def prof(frame, event, arg):
            if event == "call" and frame.f_code.co_name not in host_reads:
                f = frame.f_code.co_filename
                if f in lowering_files or f.startswith(lowering_dir):
                    entered.append(f"{os.path.basename(f)}:{frame.f_code.co_name}")

        with torchtpu.mode(m):
            for i, (x, y) in enumerate(data):
                if i == 2:
                    misses = _C._counters()["op_table.misses"]
                    sys.setprofile(prof)
                try:
                    loss = model(x, y)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                    loss.item()
                finally:
                    if i == 3:
                        sys.setprofile(None)
        assert not entered, (m, sorted(set(entered))[:10])
        assert _C._counters()["op_table.misses"] == misses


def test_loop_without_syncs_is_cut_by_its_repeats_and_compiles_nothing_more():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).to("tpu")
    opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(8, 16, device="tpu"), torch.randn(8, 4, device="tpu")
    with torchtpu.mode("fused"):
        counts = []
        for step in range(120):
            opt.zero_grad()
            F.mse_loss(m(x), y).backward()
            opt.step()
            if step % 40 == 39:
                counts.append(torchtpu.metrics.counters().get("compiles", 0))
        assert _C._pending_ops(0) < 256 + 64  # the repeated-structure rule cut it, no size cap needed
        c = torchtpu.metrics.counters()
        assert c.get("cuts.repeat", 0) >= 2 and "cuts.size_cap" not in c
        assert counts[1] == counts[2], counts  # the repeats reuse one executable
        torchtpu.sync()


@pytest.mark.pins_mode
def test_a_loop_of_few_wide_nodes_is_cut_by_weight_not_after_256_of_them():
    """An optimizer step alone is a few foreach nodes over every parameter: the repeated-structure rule also counts
    the tensors they write (1024 by default), so its chunks hold a few steps, not 256 foreach nodes' thousands of
    tensor updates (tens of seconds of compiling each)."""
    torch.manual_seed(0)
    params = [torch.randn(3, 5) for _ in range(16)]
    grads = [torch.randn(3, 5) for _ in params]
    results = []
    for device in ("cpu", "tpu"):
        ps = [p.clone().to(device).requires_grad_() for p in params]
        opt = torch.optim.Adam(ps, lr=0.01, foreach=True)
        torchtpu.sync()
        with torchtpu.mode("fused"):
            torchtpu.metrics.reset()
            for _ in range(40):
                for p, g in zip(ps, grads):
                    p.grad = g.to(device)
                opt.step()
            c = torchtpu.metrics.counters()
            results.append([p.detach().cpu() for p in ps])
    assert c.get("cuts.repeat", 0) >= 3, sorted(c.items())
    # before: a period of 7 nodes was too short to count and 256 nodes too few to cut, so nothing was cut before
    # the size cap (4096 nodes: 580 steps); the first chunk holds the state's 32 zero_ nodes and a few steps
    assert c.get("chunk_ops_max", 0) <= 100, c
    assert c.get("compiles", 0) <= 6, c  # the repeats reuse one executable
    torch.testing.assert_close(results[1], results[0], rtol=2e-5, atol=1e-6)


def test_size_cap_cuts_a_long_graph():
    _C._set_fused_limits(50, 0, 0, 1 << 40, 0)
    try:
        x = torch.ones(8, device="tpu")
        torchtpu.sync()
        with torchtpu.mode("fused"):
            torchtpu.metrics.reset()
            for i in range(120):
                x = x * 1.001 + i % 3
            assert torchtpu.metrics.counters().get("cuts.size_cap", 0) == 4
            assert _C._pending_ops(0) == 40
            v = x.cpu()
        ref = torch.ones(8)
        for i in range(120):
            ref = ref * 1.001 + i % 3
        torch.testing.assert_close(v, ref)
    finally:
        torchtpu.executor.fused_limits_from_env()


def test_errors_in_a_chunk_name_the_op_and_line():
    w = torch.randn(10, 4, device="tpu")
    with torchtpu.mode("fused"):
        with pytest.raises(IndexError, match=r"embedding .*test_fused.py:\d+.*index 12"):
            e = F.embedding(torch.tensor([3, 12], device="tpu"), w) * 2
            e.sum().item()


def test_in_place_updates_donate_in_fused_mode_too():
    n = 1 << 20
    x = torch.ones(n, device="tpu")  # (torch.zeros holds no buffer until written: nothing to donate the first time)
    torchtpu.sync()
    with torchtpu.mode("fused"):
        torchtpu.metrics.reset()
        for _ in range(5):
            x.add_(1.0)
            torchtpu.sync()
    assert torchtpu.metrics.counters()["donated_bytes"] >= 5 * 4 * n
    assert x.cpu()[0].item() == 6.0


def test_in_place_updates_are_paired_with_their_buffers_so_xla_copies_less(monkeypatch):
    """Each donated buffer is paired with its storage's new value (tf.aliasing_output). Left to XLA (buffer
    donors), donors are matched to outputs of their type in order, and the program copies tensors in and out:
    an AdamW step's chunk had 24 copies that way, 6 paired (2026-12-01)."""
    import re

    from torchtpu import runtime

    rt = runtime.get()
    texts = []
    compile_ = type(rt).compile

    def spy(self, text, device_index=0):
        texts.append(text)
        return compile_(self, text, device_index)

    def copies(text):
        exe = compile_(rt, text)
        return "\n".join(m.to_string() for m in exe.hlo_modules()).split("\nENTRY ")[1].count(" copy(")

    monkeypatch.setattr(type(rt), "compile", spy)
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)).to("tpu")
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    with torchtpu.mode("fused"):
        for _ in range(3):
            for p in m.parameters():
                p.grad = torch.ones_like(p)
            opt.step()
            torchtpu.sync()
    text = texts[-1]
    assert "tf.aliasing_output" in text
    paired = copies(text)
    donors = copies(re.sub(r"tf\.aliasing_output = \d+ : i32", "jax.buffer_donor = true", text))
    assert paired * 2 <= donors, (paired, donors)


def test_step_line_reports_per_step():
    torchtpu.metrics.step_line()
    x = torch.ones(4, device="tpu")
    (x + 1).sum().item()
    line = torchtpu.metrics.step_line()
    assert "ops" in line and "chunks" in line and "compiles" in line and "host syncs 1" in line
