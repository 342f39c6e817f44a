"""A varying inner size in the eager modes (torchtpu/shapes/eager_symbolic.py): batches whose sequence length changes
from step to step are stored compact at their length's bucket, and the ops on them run one table entry per bucket with
the length as a runtime value. The tensors the user sees keep their exact sizes and values."""

import pytest
import torch
from conftest import modes_by_pass

import torchtpu
from torchtpu import metrics


def _delta(c0, *keys):
    c1 = metrics.counters()
    return {k: c1.get(k, 0) - c0.get(k, 0) for k in keys}


def _ops(x, w):
    """Pointwise, reductions and a softmax along the varying dim, a scan along it, a matmul over the static one;
    the log of the padding's zeros is -inf, which no valid value may read."""
    y = torch.log(x.abs() + 1) @ w
    z = torch.log(torch.relu(y))  # -inf where y <= 0, and in the padding
    m = torch.where(torch.isfinite(z), z, torch.zeros_like(z))
    return [y, m.sum(1), y.softmax(1), y.cumsum(1), y.amax(1), (y * y).mean()]


@pytest.mark.parametrize("mode", modes_by_pass("strict", "fused"))
def test_a_varying_length_lowers_and_compiles_once_per_bucket(mode):
    torch.manual_seed(0)
    w = torch.randn(8, 6)
    wd = w.to("tpu")
    lowered = []
    with torchtpu.mode(mode):
        for step, n in enumerate((20, 25, 23, 31, 18, 40, 33, 29)):  # buckets 32 (from step 1), 64, 32
            x = torch.randn(2, n, 8)
            c0 = metrics.counters()
            xd = x.to("tpu")
            got = [t.cpu() for t in _ops(xd, wd)]
            for g, want in zip(got, _ops(x, w)):
                torch.testing.assert_close(g, want, rtol=1e-4, atol=1e-4)
            if step:
                assert xd.untyped_storage().nbytes() == 2 * (32 if n <= 32 else 64) * 8 * 4
            d = _delta(c0, "lowerings", "compiles", "op_table.bucket_exact")
            assert d["op_table.bucket_exact"] == 0, (n, d)
            lowered.append(d)
    # the first length is exact (a size that never changed); each bucket's first length lowers, the rest nothing
    assert all(d["lowerings"] == 0 and d["compiles"] == 0 for i, d in enumerate(lowered) if i not in (0, 1, 5)), lowered
    assert all(lowered[i]["lowerings"] + lowered[i]["compiles"] > 0 for i in (1, 5)), lowered  # (or strict's entries)


def test_a_length_that_never_changes_stays_exact_and_outputs_are_compact():
    xs = [torch.randn(3, 24) for _ in range(3)]
    for x in xs:  # the same length every step
        xd = x.to("tpu")
        assert xd.untyped_storage().nbytes() == xd.nbytes
        xd.sum().item()
    x = torch.randn(3, 21)
    xd = x.to("tpu")  # now it varies: 21 of the bucket 32
    y = xd * 2
    assert y.shape == (3, 21) and y.is_contiguous() and y.untyped_storage().nbytes() == 3 * 32 * 4
    assert torch.equal(y.cpu(), x * 2)
    assert torch.equal(y.view(-1)[5:40].cpu(), (x * 2).view(-1)[5:40])  # a view of the compact values
    assert torch.equal(y.t().contiguous().cpu(), (x * 2).t())


def _varlen_training(make, lengths, firsts):
    """make()'s model trained with AdamW on cpu and on tpu over batches of these lengths: losses as on cpu, nothing
    runs at exact sizes after the first length, and nothing is lowered or compiled after the first length and the
    buckets' first varying lengths (firsts)."""
    import zoo

    torch.manual_seed(0)
    model, _, loss_fn = make()
    twin = __import__("copy").deepcopy(model).to("tpu")
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (model, twin)]
    g = torch.Generator().manual_seed(0)
    later, exact = [], []
    for step, n in enumerate(lengths):
        ids = torch.randint(0, zoo.VOCAB, (2, n), generator=g)
        batch = {"input_ids": ids, "labels": ids}
        c0 = metrics.counters()
        losses = []
        for m, opt, dev in ((model, opts[0], "cpu"), (twin, opts[1], "tpu")):
            opt.zero_grad()
            loss = loss_fn(m, zoo._to(batch, dev))
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert abs(losses[1] - losses[0]) <= 1e-5 * abs(losses[0]), (n, losses)
        d = _delta(c0, "lowerings", "compiles", "op_table.bucket_exact")
        if step:
            exact.append((n, d["op_table.bucket_exact"]))
            if n not in firsts:
                later.append((n, d))
    assert all(e == 0 for _, e in exact), exact
    assert all(d["lowerings"] == 0 and d["compiles"] == 0 for _, d in later), later
    # ids and labels from the second length on
    assert metrics.counters().get("upload.varying_inner", 0) == 2 * (len(lengths) - 1)


@pytest.mark.one_pass("strict")  # slow; the fused pass runs tests/shapes/test_varying_shapes.py's loop
def test_hugging_face_gpt2_over_lengths_of_one_bucket_lowers_nothing_new():
    """The issue's varying-length loop in eager mode: HF GPT-2 (embeddings, position ids from arange, causal
    attention, layer norms, the shifted cross-entropy) over lengths of the buckets 64 and 32. The bucket 32 starts at
    L = 32, the hidden size: a (2L, 32) view of a (2, L, 4, 8) storage keeps its 32 static, and a (2, L, 32) view of
    a (2L, 32) storage takes its stride 32 * 32 for 32L (executor/sym.cpp view_forms)."""
    import zoo

    _varlen_training(zoo.gpt2, (36, 44, 52, 40, 61, 32, 20, 27), firsts=(44, 32))


@pytest.mark.one_pass("strict")
def test_hugging_face_mixtral_over_varying_lengths_lowers_nothing_new():
    """HF Mixtral (rotary embeddings, grouped-query attention, top-2 routing sorted into _grouped_mm, histc counts,
    the inverse permutation by index_put of arange(4L)) over lengths of the bucket 64: after its first varying length
    nothing is lowered or compiled and no op runs at exact sizes (x.float(), clones and F.pad of varying tensors
    stay in the bucket)."""
    import zoo

    _varlen_training(zoo.mixtral, (40, 50, 44, 61, 33), firsts=(50,))


def test_varying_length_programs_move_whole_rows_and_divide_in_floating_point(monkeypatch):
    """The program of an op on a `(B, L, H)` tensor reads its input and compacts its result as rows of H values (one
    gather of rows, not one of single values), and the compaction unravels positions by L with a floating-point
    division: XLA:CPU gathers single values and divides int64 values one at a time (the HF GPT-2 step's programs
    ran 2-3x slower so)."""
    import re

    import torchtpu.cache

    texts = []
    compile_text = torchtpu.cache.get_or_compile

    def spy(rt, text, device_index=0):
        texts.append(text)
        return compile_text(rt, text, device_index)

    monkeypatch.setattr(torchtpu.cache, "get_or_compile", spy)
    with torchtpu.mode("strict"):
        for n in (37, 45, 50):  # from the second length on: the bucket 64
            x = torch.randn(2, n, 24)
            y = torch.tanh(x.to("tpu")) * 3
            torch.testing.assert_close(y.cpu(), torch.tanh(x) * 3)
    bucketed = [t for t in texts if "tensor<3072xf32>" in t]  # the storage of (2, 64, 24) floats, flat
    assert bucketed, "no program at the bucket's capacity"
    for text in bucketed:
        gathers = re.findall(r"slice_sizes = array<i64: ([0-9, ]+)>", text)
        assert gathers and all(g == "1, 24" for g in gathers), gathers
        assert not re.search(r'"stablehlo\.(divide|remainder)"[^\n]*-> tensor<[0-9x]*xi64>', text)


@pytest.mark.parametrize("f64", [True, False])
def test_floor_divmod_through_floating_point_is_exact(monkeypatch, f64):
    """floor_divmod's division in float64 (XLA:CPU) or float32 (TPUs, below 2^22) gives integer division's result
    for every value up to its bound, for divisors that are sizes."""
    from torchtpu.shapes import padded

    monkeypatch.setattr(padded, "_has_f64", lambda: f64)
    bound = 1 << 22
    r = torch.arange(bound, dtype=torch.int64)
    for e in (1, 2, 3, 7, 64, 97, 1000, 4093, 65537, bound - 1):
        for div in (e, torch.tensor(e)):
            q, m = padded.floor_divmod(r, div, bound)
            assert torch.equal(q, r // e) and torch.equal(m, r % e), e
