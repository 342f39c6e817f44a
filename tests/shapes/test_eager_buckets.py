"""Bucketed rows in the eager modes (torchtpu/shapes/eager_buckets.py): a data-dependent count (nonzero, where(cond),
boolean masks, masked_select) puts its rows in a storage of its bucket, and the ops after it run one table entry
(one fragment, in fused mode one chunk program) per bucket instead of one per count. The tensors the user sees
keep their exact sizes and values."""

import copy

import eager_bucket_sweep
import pytest
import torch
import zoo
from conftest import modes_by_pass

import torchtpu
from torchtpu import _C, metrics


def _delta(c0, *keys):
    c1 = metrics.counters()
    return {k: c1.get(k, 0) - c0.get(k, 0) for k in keys}


def test_nonzero_rows_are_bucketed_and_exact_to_the_user():
    x = torch.tensor([0.0, 1.0, 0.0, 2.0, 3.0, 0.0, 4.0, 5.0])
    idx = x.to("tpu").nonzero()
    # row-major rows (cpu's nonzero is column-major: the same values, other strides)
    assert idx.shape == (5, 1) and idx.is_contiguous()
    assert _C._rows_of(idx) == (5, 8)  # 5 valid rows of one int64 in a storage of 8 (the pow2 bucket above 5)
    assert idx.untyped_storage().nbytes() == 8 * 8
    assert torch.equal(idx.cpu(), x.nonzero())
    assert str(idx.cpu()) == str(x.nonzero())
    (token,) = torch.where(x.to("tpu") > 0)
    assert torch.equal(token.cpu(), torch.where(x > 0)[0])
    m = torch.tensor([[True, False, True], [True, True, False]])
    v = torch.arange(6.0).reshape(2, 3)
    assert torch.equal(v.to("tpu")[m.to("tpu")].cpu(), v[m])
    assert torch.equal(v.to("tpu").masked_select(m.to("tpu")).cpu(), v.masked_select(m))


def test_reading_an_uploaded_index_needs_no_host_sync_until_it_is_written():
    """A small upload keeps its host bytes while sizes are bucketed (a nonzero's indices are one): `x[i]` with a
    0-d index reads it as a Python int from them, with no host sync; a write gives the storage a new value."""
    hit = torch.tensor([0.0, 3.0, 0.0, 1.0]).to("tpu").nonzero()  # one host sync: the input's values
    w = torch.arange(12.0).reshape(4, 3).to("tpu")
    c0 = metrics.counters()
    rows = [w[i[0]] for i in hit]  # each index read as an int
    assert [r.cpu().tolist() for r in rows] == [[3.0, 4.0, 5.0], [9.0, 10.0, 11.0]]
    d = _delta(c0, "host_sync.item", "host_reads_from_upload.item")
    assert d == {"host_sync.item": 0, "host_reads_from_upload.item": 2}, d
    hit.add_(1)  # a write: later reads see the device's value
    c0 = metrics.counters()
    assert [i.item() for i in hit[:, 0]] == [2, 4]
    assert _delta(c0, "host_sync.item")["host_sync.item"] == 2
    u = torch.tensor([5, 6, 7]).to("tpu")
    u[1] = 0  # a write through a view
    assert u.tolist() == [5, 0, 7]


def test_buckets_off_keeps_counts_exact():
    torchtpu.set_shape_buckets(None)
    try:
        idx = torch.tensor([0.0, 1.0, 2.0, 0.0, 5.0]).to("tpu").nonzero()
        assert _C._rows_of(idx)[0] == -1 and idx.untyped_storage().nbytes() == idx.nbytes
    finally:
        torchtpu.set_shape_buckets("pow2")


def _mlp():
    nn = torch.nn
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.LayerNorm(32), nn.Linear(32, 5)), (16,)


def _cnn():
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3, stride=2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 5),
    ), (3, 12, 12)


@pytest.mark.parametrize("mode", modes_by_pass("strict", "fused"))
@pytest.mark.parametrize("net", [_mlp, _cnn])
def test_batches_whose_size_varies_compile_once_per_bucket(mode, net):
    """An upload whose dim 0 changes from step to step (a batch of varying size) is bucketed like a nonzero's rows
    from its second size on: training an MLP classifier (linear, relu, layer norm, cross entropy, AdamW) or a CNN
    (convolutions, max and adaptive average pooling) matches cpu at every batch size, and a size of a bucket seen
    before lowers and compiles nothing. The parameters (each uploaded once) and a batch whose size never changes
    stay exact."""
    torchtpu.set_shape_buckets("pow2")  # forgets which uploads varied before (the other mode's run)
    torch.manual_seed(0)
    model, sample = net()
    twin = copy.deepcopy(model).to("tpu")
    assert all(p.untyped_storage().nbytes() == p.nbytes for p in twin.parameters())
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (model, twin)]
    g = torch.Generator().manual_seed(1)
    c_start = metrics.counters()
    later = []
    with torchtpu.mode(mode):
        for step, b in enumerate((8, 7, 5, 6, 3, 8, 5, 4, 7)):  # buckets 8 and 4
            x, y = torch.randn(b, *sample, generator=g), torch.randint(0, 5, (b,), generator=g)
            c0 = metrics.counters()
            losses = []
            for m, opt, dev in ((model, opts[0], "cpu"), (twin, opts[1], "tpu")):
                opt.zero_grad()
                xd = x.to(dev)
                if dev == "tpu" and step > 0:  # its size changed: the batch sits in a storage of its bucket
                    assert xd.shape == x.shape and xd.untyped_storage().nbytes() == (4 if b <= 4 else 8) * x[0].nbytes
                loss = torch.nn.functional.cross_entropy(m(xd), y.to(dev))
                loss.backward()
                opt.step()
                losses.append(loss.item())
            assert abs(losses[1] - losses[0]) <= 1e-5 * abs(losses[0]), (b, losses)
            if step in (2, 3, 5, 6, 8):  # a bucket seen before (8: steps 1, 2; 4: step 4)
                later.append((b, _delta(c0, "lowerings", "compiles", "op_table.bucket_exact")))
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), rtol=1e-4, atol=1e-5)
    assert all(d == {"lowerings": 0, "compiles": 0, "op_table.bucket_exact": 0} for _, d in later), later
    assert _delta(c_start, "upload.bucketed_rows")["upload.bucketed_rows"] == 2 * 8  # x and y from step 1 on
    fixed = []
    for _ in range(3):  # one step each (a host read between them), always 6 rows
        fixed.append(torch.randn(6, 24).to("tpu"))
        fixed[-1].sum().item()
    assert all(t.untyped_storage().nbytes() == t.nbytes for t in fixed)


def test_convolutions_and_pooling_over_a_bucketed_batch_ignore_its_padding():
    """Convolutions (also transposed), max / average / adaptive pooling and their backwards over a batch whose padding
    samples are NaN: each sample on its own, the weight and bias gradients summed over the valid ones only."""
    F = torch.nn.functional
    torch.manual_seed(0)

    def run(x, cot, w, b):
        w, b = w.to("tpu").requires_grad_(), b.to("tpu").requires_grad_()
        y = F.adaptive_avg_pool2d(F.max_pool2d(F.conv2d(x, w, b, padding=1), 2), 2)
        z = F.avg_pool2d(F.conv_transpose2d(F.relu(y), w, stride=2), 2)
        (z * cot).sum().backward()
        return z, [t.cpu() for t in (z, x.grad, w.grad, b.grad)]

    for n in (5, 7):
        x, cot, w, b = torch.randn(n, 3, 8, 8), torch.randn(n, 3, 2, 2), torch.randn(4, 3, 3, 3), torch.randn(4)
        torchtpu.set_shape_buckets(None)  # the reference: exact sizes
        try:
            _, want = run(x.to("tpu").requires_grad_(), cot.to("tpu"), w, b)
        finally:
            torchtpu.set_shape_buckets("pow2")
        c0 = metrics.counters()
        z, got = run(eager_bucket_sweep.bucketed(x, 8, requires_grad=True), eager_bucket_sweep.bucketed(cot, 8), w, b)
        assert _C._rows_of(z)[0] == n
        assert _delta(c0, "op_table.bucket_exact")["op_table.bucket_exact"] == 0
        for g, e in zip(got, want):
            torch.testing.assert_close(g, e, atol=1e-4, rtol=1e-4)


def test_counts_in_one_bucket_share_one_entry():
    """Row-wise ops, a matmul over the rows, index_add and sums over the rows: values as on cpu for every count, and
    counts after the first lower nothing (the table keys the capacity, the count is a runtime value)."""
    torch.manual_seed(0)
    w = torch.randn(8, 6)
    table = torch.randn(20, 8)
    wt, tt = w.to("tpu"), table.to("tpu")
    lowered = []
    for k, n in enumerate((9, 11, 14, 16, 10)):  # one bucket: 16
        mask = torch.zeros(20, dtype=torch.bool)
        mask[torch.randperm(20)[:n]] = True
        idx = mask.nonzero().squeeze(1)
        c0 = metrics.counters()
        ti = mask.to("tpu").nonzero().squeeze(1)
        h = torch.relu(tt[ti] @ wt) * 2 + 1
        out = torch.zeros(20, 6, device="tpu").index_add_(0, ti, h)
        s = h.sum(0)
        y = (h.softmax(-1) * h).sum(-1)
        want_h = torch.relu(table[idx] @ w) * 2 + 1
        assert torch.allclose(out.cpu(), torch.zeros(20, 6).index_add_(0, idx, want_h), atol=1e-5)
        assert torch.allclose(s.cpu(), want_h.sum(0), atol=1e-4)
        assert torch.allclose(y.cpu(), (want_h.softmax(-1) * want_h).sum(-1), atol=1e-5)
        d = _delta(c0, "lowerings", "op_table.bucket_exact")
        assert d["op_table.bucket_exact"] == 0, n
        lowered.append(d["lowerings"])
    assert lowered[0] > 0 and lowered[1:] == [0] * 4, lowered


def test_padding_is_never_read_into_a_value():
    """Poisoned padding (NaN values, an out-of-range index) never reaches a valid value nor a device-side check."""
    torch.manual_seed(0)
    x = torch.randn(5, 4)
    idx = torch.tensor([3, 0, 2, 2, 1])
    bx = eager_bucket_sweep.bucketed(x, 8)
    bi = eager_bucket_sweep.bucketed(idx, 8)  # padding 10**6: a gather of it would fail its bounds check
    table = torch.randn(6, 4)
    with torchtpu.mode("debug"):  # debug raises a failed device-side check at the op
        got = table.to("tpu")[bi] + bx
        acc = torch.zeros(6, 4, device="tpu").index_add_(0, bi, bx)
        tot = bx.sum(0)
        mx = bx.amax(0)
        g = bx.t() @ bx
    assert torch.allclose(got.cpu(), table[idx] + x)
    assert torch.allclose(acc.cpu(), torch.zeros(6, 4).index_add_(0, idx, x))
    assert torch.allclose(tot.cpu(), x.sum(0), atol=1e-6)
    assert torch.equal(mx.cpu(), x.amax(0))
    assert torch.allclose(g.cpu(), x.t() @ x, atol=1e-5)


def test_means_softmaxes_losses_and_scatters_over_the_rows():
    """Ops that need the count itself (mean, var/std over the rows), softmax/log_softmax/logsumexp over them and their
    backwards, a cross-entropy over selected rows (nll_loss: the padding rows are ignored targets), scatter_add /
    scatter_reduce of bucketed rows into an exact tensor, row-wise scatter and gather: on poisoned padding (NaN, index
    10**6) under debug mode's device-side checks, equal to cpu; a second count in the bucket lowers nothing."""
    torch.manual_seed(0)
    lowered = []
    for n in (7, 5):
        x, t = torch.randn(n, 4), torch.randint(0, 4, (n,))
        cols = torch.randint(0, 3, (n, 2))
        bx = eager_bucket_sweep.bucketed(x, 8, requires_grad=True)
        bt, bc = eager_bucket_sweep.bucketed(t, 8), eager_bucket_sweep.bucketed(cols, 8)
        xc = x.clone().requires_grad_()

        def run(x, t, cols):
            mean, var = x.mean(0), x.var(0)
            sd, mu = torch.std_mean(x, 0, correction=0)
            soft = x.softmax(0) * x.log_softmax(0).exp()
            lse = x.logsumexp(0)
            ce = torch.nn.functional.cross_entropy(x * 2, t)
            ce_rows = torch.nn.functional.cross_entropy(x, t, reduction="none")
            into = torch.zeros(4, 4, device=x.device).scatter_add(0, t[:, None].expand(-1, 4).contiguous(), x)
            top = torch.full((4, 4), -5.0, device=x.device).scatter_reduce(  # (its backward: exact zeros)
                0, t[:, None].expand(-1, 4).contiguous(), x, "amax"
            )
            whole = x.mean()  # its backward: the gradient expanded to the rows, divided (no bucketed tensor in sight)
            with torch.no_grad():  # their backwards make zeros of the exact row count (a factory knows no rows)
                rowwise = torch.zeros_like(x).scatter(1, cols, x[:, :2])
                picked = x.gather(1, cols)
            loss = mean.sum() + var.sum() + soft.sum() + lse.sum() + ce + ce_rows.sum() + into.sum() + whole
            loss.backward()
            return mean, var, sd, mu, soft, lse, ce, ce_rows, into, top, rowwise, picked, whole, loss

        c0 = metrics.counters()
        with torchtpu.mode("debug"):
            got = run(bx, bt, bc)
            grad = bx.grad.cpu()
        lowered.append(_delta(c0, "lowerings")["lowerings"])
        want = run(xc, t, cols)
        for k, (a, b) in enumerate(zip(got, want)):
            assert torch.allclose(a.detach().cpu(), b.detach(), atol=1e-5), (n, k)
        assert torch.allclose(grad, xc.grad, atol=1e-5), n
    assert lowered[0] > 0 and lowered[1] == 0, lowered


def test_declined_ops_run_exact():
    """An op without a bucketed rule (a flip of the rows, a sort along them) runs at its exact sizes: counted, and
    right."""
    x = torch.randn(6, 3)
    c0 = metrics.counters()
    b = eager_bucket_sweep.bucketed(x, 8)
    assert torch.equal(b.flip(0).cpu(), x.flip(0))
    assert torch.equal(b.sort(0).values.cpu(), x.sort(0).values)
    assert _delta(c0, "op_table.bucket_exact")["op_table.bucket_exact"] >= 2


def test_exact_tensors_along_the_rows_raise_as_on_cpu():
    """A count that fills its bucket (8 of 8) shares the entry of the smaller counts: an exact tensor that fits the
    rows there (an index, a bias) must not then pass silently with 5 rows, where cpu raises."""
    torch.manual_seed(0)
    w = torch.randn(6, 4)
    other = torch.randint(0, 4, (8,))
    bias = torch.randn(8, 4)
    m = torch.randn(3, 4)
    batch = torch.randn(8, 3, 2)
    for n in (8, 5):
        i = torch.randint(0, 6, (n,))
        a = torch.randn(n, 3)
        bi, ba = eager_bucket_sweep.bucketed(i, 8), eager_bucket_sweep.bucketed(a, 8)
        if n == 8:
            assert torch.equal(w.to("tpu")[bi, other.to("tpu")].cpu(), w[i, other])
            assert torch.allclose(torch.addmm(bias.to("tpu"), ba, m.to("tpu")).cpu(), torch.addmm(bias, a, m))
            assert torch.allclose(torch.bmm(ba.unsqueeze(1), batch.to("tpu")).cpu(), torch.bmm(a.unsqueeze(1), batch))
            continue
        with pytest.raises(Exception, match="bmm"):
            torch.bmm(ba.unsqueeze(1), batch.to("tpu")).cpu()
        with pytest.raises(Exception):
            w[i, other]
        with pytest.raises(Exception, match="shape"):
            w.to("tpu")[bi, other.to("tpu")].cpu()
        with pytest.raises(Exception):
            torch.addmm(bias, a, m)
        with pytest.raises(Exception, match="addmm"):
            torch.addmm(bias.to("tpu"), ba, m.to("tpu")).cpu()


@pytest.mark.parametrize("mode", modes_by_pass("strict", "fused"))
def test_topk_moe_routing_compiles_once(mode):
    """The hand-written top-k router (where, gather, expert MLPs, index_add_), forward and backward: equal to cpu,
    and after two steps no lowering and no compile, whatever the counts routed to each expert."""
    torch.manual_seed(0)
    m = zoo.TopKMoE()
    mt = zoo.TopKMoE().to("tpu")
    mt.load_state_dict(m.state_dict())
    later = []
    with torchtpu.mode(mode):
        for step in range(5):
            x = torch.randn(2, 16, 32)
            xc, xt = x.clone().requires_grad_(), x.to("tpu").requires_grad_()
            c0 = metrics.counters()
            yc, yt = m(xc), mt(xt)
            (yc * yc).sum().backward()
            (yt * yt).sum().backward()
            torch.tpu.synchronize()
            d = _delta(c0, "lowerings", "compiles", "op_table.bucket_exact")
            assert torch.allclose(yt.cpu(), yc, atol=1e-5)
            assert torch.allclose(xt.grad.cpu(), xc.grad, atol=1e-5)
            for p, q in zip(m.parameters(), mt.parameters()):
                assert torch.allclose(q.grad.cpu(), p.grad, atol=1e-4), step
                p.grad = q.grad = None
            assert d["op_table.bucket_exact"] == 0, d
            if step >= 2:
                later.append(d)
    assert all(d["lowerings"] == 0 and d["compiles"] == 0 for d in later), later


@pytest.mark.one_pass("strict")  # the fused pass runs the same steps (test_topk_moe_routing_compiles_once)
def test_mixtral_eager_experts_trains_without_recompiles():
    """Hugging Face Mixtral with transformers' per-expert loop (one_hot, nonzero, where, index_add_): losses as on
    cpu, and no compile after step 2."""
    r = zoo.side_by_side("mixtral_eager_experts", steps=5)
    assert r["max_rel_diff"] < 1e-5, r["max_rel_diff"]
    assert sum(r["tpu"]["compiles"][2:]) == 0, r["tpu"]["compiles"]


OPS = [
    "exp",
    "sigmoid",
    "tanh",
    "nn.functional.gelu",
    "nn.functional.silu",
    "add",
    "mul",
    "div",
    "where",
    "clone",
    "sum",
    "amax",
    "softmax",
    "log_softmax",
    "mm",
    "bmm",
    "addmm",
    "cumsum",
    "topk",
    "sort",
    "cat",
    "nn.functional.layer_norm",
    "nn.functional.embedding",
    "index_select",
    "max",
    "prod",
]
MUST_BUCKET = {"exp", "sigmoid", "tanh", "nn.functional.gelu", "nn.functional.silu", "mm", "where", "prod"}


@pytest.mark.one_pass("strict")
def test_opinfo_samples_bucketed_equal_exact():
    res = eager_bucket_sweep.sweep(ops=OPS, max_samples=2)
    bad = {k: v for k, v in res.items() if any(s in ("wrong", "error", "recompiled") for s, _ in v)}
    assert not bad, bad
    ok = {name for (name, _), v in res.items() if any(s == "ok" for s, _ in v)}
    assert MUST_BUCKET <= ok, {k: v for k, v in res.items() if k[0] in MUST_BUCKET - ok}
    print(f"\neager bucketed OpInfo samples: {dict(eager_bucket_sweep.summarize(res))}")
