"""Bucketed sizes for torch.compile(dynamic=True / mark_dynamic) (torchtpu/shapes): one program per bucket.

Two halves. On the CPU, every graph AOTAutograd hands a checking backend is also run by the bucketed interpreter on
buffers of the bucket's capacity whose padding is NaN (or a large integer): its outputs must equal the graph's own at
the exact sizes — the padding is never read into a valid value. On tpu, compiled training over varying lengths
matches CPU eager and captures once per bucket."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from bucket_check import checking_backend

import torchtpu
from torchtpu import shapes


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    shapes.set_shape_buckets("pow2")


# -- the interpreter on the CPU ----------------------------------------------------------------------------------------
def _check(fn, calls, dynamic_dims=None):
    report = []
    f = torch.compile(fn, backend=checking_backend(report), dynamic=dynamic_dims is None or None)
    for args in calls:  # dynamic_dims: dims of the first argument, or {argument: dims}
        for i, dims in (dynamic_dims if isinstance(dynamic_dims, dict) else {0: dynamic_dims or ()}).items():
            for d in dims:
                torch._dynamo.mark_dynamic(args[i], d)
        out = f(*args)
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.sum().backward()
    assert report, "no symbolic graph was made"
    assert all(r[2] == "ok" for r in report), report
    return report


@pytest.mark.one_pass("strict")  # no device: the same in both passes
def test_policy():
    assert [shapes.bucket(n) for n in (0, 1, 2, 3, 17, 32, 33, 64)] == [0, 1, 2, 4, 32, 32, 64, 64]
    shapes.set_shape_buckets([16, 48])
    assert [shapes.bucket(n) for n in (3, 16, 17, 48, 49)] == [16, 16, 48, 48, 49]
    shapes.set_shape_buckets(None)
    assert not shapes.enabled() and shapes.bucket(17) == 17


@pytest.mark.one_pass("strict")  # no device: the same in both passes
def test_reductions_softmax_matmul_read_no_padding():
    torch.manual_seed(0)
    w = torch.randn(8, 8, requires_grad=True)

    def fn(x):
        s = (x @ w).softmax(-1)  # softmax over a static dim
        a = x.softmax(0) * x.mean(0, keepdim=True)  # softmax and mean over the dynamic dim
        g = x.T @ x / x.shape[0]  # a contraction over the dynamic dim, a size as a value
        return s.sum() + a.amax(0).sum() + g.sum() + x.var(0).sum()

    _check(fn, [(torch.randn(n, 8, requires_grad=True),) for n in (5, 7, 3)])

    def factories(x):  # sizes as shapes (full, zeros, arange) and as a value (a count)
        n = torch.scalar_tensor(x.shape[0], dtype=torch.float32)
        return x.sum(0) / n + torch.full((x.shape[0],), 2.0).sum() + torch.arange(x.shape[0]).sum()

    _check(factories, [(torch.randn(n, 4),) for n in (5, 7)])


@pytest.mark.one_pass("strict")  # no device: the same in both passes
def test_cat_pad_and_slices_along_the_dynamic_dim():
    def fn(x, y):
        c = torch.cat([x, y, x], dim=1)  # three padded runs, one after the other
        p = F.pad(x, (2, 3), value=7.0)  # written right after the valid values
        return c.cumsum(1)[:, 1:].sum(1) + p.sum(1) + p[:, 1:].amax(1) + (y[:, 2:] * y[:, 2:]).sum(1)

    # backward: slice_scatter of the slices' gradients, cat's split
    _check(fn, [(torch.randn(3, n, requires_grad=True), torch.randn(3, n + 2, requires_grad=True)) for n in (5, 9, 6)])


@pytest.mark.one_pass("strict")  # no device: the same in both passes
def test_attention_without_a_causal_mask_ignores_padded_keys():
    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v).sum(2)

    _check(fn, [tuple(torch.randn(2, 2, n, 4, requires_grad=True) for _ in range(3)) for n in (5, 7, 12)])


@pytest.mark.one_pass("strict")  # no device: the same in both passes
def test_cnn_with_batchnorm_over_a_varying_batch():
    torch.manual_seed(0)
    m = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 8, 3),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 4),
    )
    report = []
    f = torch.compile(lambda x, y: F.cross_entropy(m(x), y), backend=checking_backend(report))
    for n in (5, 6, 3):  # the batch statistics and the weight gradients over the valid samples only
        x, y = torch.randn(n, 3, 12, 12), torch.randint(0, 4, (n,))
        torch._dynamo.mark_dynamic(x, 0)
        torch._dynamo.mark_dynamic(y, 0)
        f(x, y).backward()
    assert len(report) == 6 and all(r[2] == "ok" for r in report), report


@pytest.mark.one_pass("strict")  # no device: the same in both passes
def test_gpt_graphs_run_bucketed_on_nan_padding():
    # (Hugging Face GPT-2's four graphs pass this check too — bench/dynamic.py runs them compiled; not here, for CI
    # time: tracing transformers' code takes ~40 s)
    import train_gpt

    torch.manual_seed(0)
    model = train_gpt.GPT(ctx=64)
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
    rep = _check(model, [(torch.randint(0, 64, (2, t)), torch.randint(0, 64, (2, t))) for t in (17, 45)])
    assert [r[0] for r in rep] == ["forward", "backward"] * 2


# -- on tpu ------------------------------------------------------------------------------------------------------------
def _counters():
    return torchtpu.metrics.counters()


def _varlen_train(model, loss_fn, data):
    twin = copy.deepcopy(model).to("tpu")
    opt_c = torch.optim.SGD(model.parameters(), lr=0.1)
    opt_t = torch.optim.SGD(twin.parameters(), lr=0.1)
    f = torch.compile(lambda *a: loss_fn(twin, *a), backend="tpu", dynamic=True)
    compiles, rel = [], []
    for args in data:
        lc = loss_fn(model, *args)
        lc.backward()
        opt_c.step()
        opt_c.zero_grad()
        c0 = _counters().get("compiles", 0)
        lt = f(*(a.to("tpu") for a in args))
        lt.backward()
        opt_t.step()
        opt_t.zero_grad()
        rel.append(abs(lt.item() - lc.item()) / abs(lc.item()))
        compiles.append(_counters().get("compiles", 0) - c0)
    return compiles, rel


@pytest.mark.one_pass("fused")  # the strict pass runs the CPU checks
def test_compiled_gpt_over_lengths_17_to_64_captures_once_per_bucket():
    import train_gpt

    torch.manual_seed(0)
    model = train_gpt.GPT(d=32, layers=1, ctx=64)
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.0
    lengths = [17, 30, 23, 40, 33, 51, 20]  # buckets 32 and 64
    g = torch.Generator().manual_seed(0)
    data = [(torch.randint(0, 64, (2, t), generator=g), torch.randint(0, 64, (2, t), generator=g)) for t in lengths]
    torchtpu.metrics.reset()
    compiles, rel = _varlen_train(model, lambda m, x, y: m(x, y), data)
    c = _counters()
    assert max(rel) < 1e-5, rel
    assert c.get("compile.bucketed_captures") == 4  # forward and backward, two buckets
    assert c.get("compile.bucketed_runs") == 2 * len(lengths) - 4
    assert not c.get("compile.bucket_declined")
    # a bucket's first step captures its programs (and in fused mode its second compiles the chunk they fuse into
    # with the optimizer); every later length of a bucket compiles nothing
    later = [
        n
        for i, n in enumerate(compiles)
        if [shapes.bucket(t) for t in lengths[:i]].count(shapes.bucket(lengths[i])) >= 2
    ]
    assert len(later) == 3 and later == [0, 0, 0], compiles


@pytest.mark.one_pass("strict")  # strict: every eager op (autograd's zero fills among them) is its own program
def test_unread_outputs_and_new_batches_cost_no_program_and_no_read_back():
    """A model returning more than its loss (Hugging Face's hidden states and key/value caches): autograd gives the
    backward zeros for the outputs the loss never reads, at their exact sizes. They hold no value (torch.zeros is
    free until written) and the bucketed backward takes them at its capacity as they are; the token batches, copied
    from the host at their exact sizes, are padded to the capacity from the bytes they were uploaded from. So every
    length of a bucket after its first compiles nothing and reads nothing back but the loss."""
    torch.manual_seed(0)
    emb, proj = nn.Embedding(64, 16), nn.Linear(16, 64)

    def step(e, p, x, y):
        h = torch.tanh(e(x))
        return F.cross_entropy(p(h).flatten(0, 1), y.flatten()), h, h * 2  # h, h * 2: outputs the loss never reads

    te, tp = copy.deepcopy(emb).to("tpu"), copy.deepcopy(proj).to("tpu")
    f = torch.compile(step, backend="tpu", dynamic=True)
    g = torch.Generator().manual_seed(0)
    torchtpu.metrics.reset()
    for i, t in enumerate([17, 23, 29, 20, 31]):  # one bucket (32)
        x, y = torch.randint(0, 64, (2, t), generator=g), torch.randint(0, 64, (2, t), generator=g)
        c0 = _counters()
        loss, h, _ = step(emb, proj, x, y)
        loss.backward()
        lt, ht, _ = f(te, tp, x.to("tpu"), y.to("tpu"))
        lt.backward()
        torch.testing.assert_close(lt.item(), loss.item(), rtol=1e-5, atol=0)
        torch.testing.assert_close(ht.cpu(), h.detach())
        c1 = _counters()
        if i >= 3:  # the first compile the programs, and the gradients' accumulation (add_) over their layouts
            assert c1.get("compiles", 0) == c0.get("compiles", 0), (i, t)
            assert c1.get("host_syncs", 0) - c0.get("host_syncs", 0) == 2, (i, t)  # lt.item(), ht.cpu()
    torch.testing.assert_close(te.weight.grad.cpu(), emb.weight.grad)
    torch.testing.assert_close(tp.weight.grad.cpu(), proj.weight.grad)
    c = _counters()
    assert not c.get("host_sync.bucket_input"), c
    # the first batch is copied to its capacity from its host bytes; from the second length on the upload itself
    # stores a batch compact at its bucket's capacity (eager_symbolic.py), which the program reads as it is
    assert c.get("compile.bucket_input_host_copies", 0) == c.get("compile.bucket_input_copies", 0) == 2, c
    assert c.get("upload.varying_inner", 0) == 2 * 4, c
    assert not c.get("compile.bucket_declined")


class _GroupedMoE(nn.Module):
    """Hugging Face's grouped-matmul experts, written out: tokens sorted by expert, grouped matmuls over the counts'
    offsets, the inverse permutation written with index_put, per-token sums (the padded tokens sort last and no
    group holds them)."""

    def __init__(self, d=16, e=4, k=2, f=32):
        super().__init__()
        self.router = nn.Linear(d, e, bias=False)
        self.w1 = nn.Parameter(torch.randn(e, d, f) * 0.2)
        self.w2 = nn.Parameter(torch.randn(e, f, d) * 0.2)
        self.k, self.e = k, e

    def forward(self, x):
        B, T, d = x.shape
        h = x.reshape(-1, d)
        w, ids = torch.topk(F.softmax(self.router(h), -1), self.k, -1)
        ids_g, perm = torch.sort(ids.reshape(-1))
        offs = torch.cumsum(torch.histc(ids_g.float(), bins=self.e, min=0, max=self.e - 1), 0, dtype=torch.int32)
        y = torch._grouped_mm(F.silu(torch._grouped_mm(h[perm // self.k], self.w1, offs=offs)), self.w2, offs=offs)
        y = y * w.reshape(-1)[perm].unsqueeze(-1)
        inv = torch.empty_like(perm)
        inv[perm] = torch.arange(perm.numel(), device=x.device)
        return y[inv].view(B * T, self.k, d).sum(1).view(B, T, d)


@pytest.mark.one_pass("strict")
def test_grouped_mm_experts_over_varying_lengths_run_once_per_bucket():
    """MoE routing under torch.compile(dynamic=True) with the length varying: topk, a sort along the padded tokens,
    histc, indexing through a merged padded dim, grouped matmuls and a non-accumulating index_put (the inverse
    permutation) all bucketed; losses and weights equal CPU eager's."""
    torch.manual_seed(0)

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.moe, self.head = nn.Embedding(64, 16), _GroupedMoE(), nn.Linear(16, 64)

        def forward(self, x, y):
            h = self.emb(x)
            return F.cross_entropy(self.head(h + self.moe(h)).flatten(0, 1), y.flatten())

    lengths = [17, 23, 29, 20, 31]  # one bucket (32)
    g = torch.Generator().manual_seed(0)
    data = [(x, x) for x in (torch.randint(0, 64, (2, t), generator=g) for t in lengths)]
    model = LM()
    torchtpu.metrics.reset()
    compiles, rel = _varlen_train(model, lambda m, x, y: m(x, y), data)
    c = _counters()
    assert max(rel) < 1e-5, rel
    assert not c.get("compile.bucket_declined"), c
    assert c.get("compile.bucketed_runs", 0) >= 2 * (len(lengths) - 1)
    assert compiles[2:] == [0] * (len(lengths) - 2), compiles


def test_a_python_float_argument_is_a_runtime_value_not_a_capture():
    # dynamic=True: Dynamo passes the float as a 0-dim float64 CPU tensor; each call copies it to the device
    fn = torch.compile(lambda x, s: (x * s).sum(0), backend="tpu", dynamic=True)
    for n, scale in ((3, 0.5), (5, 0.25), (6, 2.0)):
        x = torch.randn(n, 4)
        torch.testing.assert_close(fn(x.to("tpu"), scale).cpu(), (x * scale).sum(0), rtol=1e-6, atol=1e-6)
    c = _counters()
    assert c.get("compile.bucketed_captures") == 2 and not c.get("compile.eager_graphs")  # buckets 4 and 8


def test_mark_dynamic_batch_and_an_op_without_a_rule_is_captured_per_size():
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)).to("tpu")
    cm = torch.compile(m, backend="tpu")
    torchtpu.metrics.reset()
    for n in (5, 6, 7):
        x = torch.randn(n, 8, device="tpu")
        torch._dynamo.mark_dynamic(x, 0)
        torch.testing.assert_close(cm(x).cpu(), m(x).cpu(), rtol=1e-5, atol=1e-5)
    assert _counters().get("compile.bucketed_captures") == 1  # sizes 5, 6, 7: bucket 8
    torch._dynamo.reset()
    fn = torch.compile(lambda x: x.roll(1, 0).cumsum(0), backend="tpu", dynamic=True)  # roll: no bucketed rule
    before = _counters().get("compile.captures", 0)
    for n in (5, 6):
        x = torch.randn(n, 4)
        torch.testing.assert_close(fn(x.to("tpu")).cpu(), x.roll(1, 0).cumsum(0), rtol=1e-5, atol=1e-5)
    assert _counters().get("compile.bucket_declined") == 1
    assert _counters().get("compile.captures", 0) - before == 2  # one per exact size, as without buckets


@pytest.mark.one_pass("strict")
def test_default_compile_of_a_cnn_buckets_the_batch_after_it_changes_running_stats_right():
    # torch.compile's automatic dynamic shapes: the first batch size is static; a second makes the batch symbolic, and
    # from then on each bucket is one program (a smaller last batch costs no new compile for each size)
    torch.manual_seed(0)
    m = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(8 * 6 * 6, 4),
    )
    t = copy.deepcopy(m).to("tpu")
    oc, ot = torch.optim.SGD(m.parameters(), lr=0.1), torch.optim.SGD(t.parameters(), lr=0.1)
    f = torch.compile(lambda x, y: F.cross_entropy(t(x), y), backend="tpu")
    torchtpu.metrics.reset()
    for n in (8, 5, 6, 3, 7):
        x, y = torch.randn(n, 3, 12, 12), torch.randint(0, 4, (n,))
        lc = F.cross_entropy(m(x), y)
        lc.backward()
        oc.step()
        oc.zero_grad()
        lt = f(x.to("tpu"), y.to("tpu"))
        lt.backward()
        ot.step()
        ot.zero_grad()
        assert abs(lt.item() - lc.item()) <= 1e-5 * abs(lc.item())
    torch.testing.assert_close(t[1].running_mean.cpu(), m[1].running_mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(t[1].running_var.cpu(), m[1].running_var, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(t[0].weight.detach().cpu(), m[0].weight.detach(), rtol=1e-5, atol=1e-6)
    c = torchtpu.metrics.counters()
    assert c.get("compile.bucketed_captures") == 4  # buckets 8 (sizes 5, 6, 7) and 4 (size 3), forward and backward


@pytest.mark.one_pass("strict")  # no device: the same in both passes
def test_advanced_indexing_with_broadcast_index_tensors():
    def fn(x):  # transformers builds its masks this way: x[batch_idx, kv_idx]
        b = torch.arange(x.shape[0]).view(-1, 1, 1)
        t = torch.arange(x.shape[1]).view(1, -1, 1)
        return x.cumsum(1)[b, t].sum(1) + x[:, torch.arange(x.shape[1] - 1)].sum(1).unsqueeze(1)

    _check(fn, [(torch.randn(3, n),) for n in (5, 7, 9)])


@pytest.mark.one_pass("strict")  # no device: the same in both passes
def test_convolutions_and_pooling_over_padded_lengths_and_image_sizes():
    torch.manual_seed(0)
    audio = nn.Sequential(
        nn.Conv1d(2, 8, 5, stride=2, padding=2),
        nn.ReLU(),
        nn.MaxPool1d(3, stride=2, padding=1),
        nn.Conv1d(8, 8, 3, dilation=2),
        nn.AvgPool1d(2),
        nn.ConvTranspose1d(8, 4, 3, stride=2),
    )
    # a varying length: conv, strided max pool with padding, dilated conv, average pool, transposed conv
    _check(lambda x: audio(x).mean(-1).sum(), [(torch.randn(3, 2, n, requires_grad=True),) for n in (37, 45, 60)])
    image = nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1), nn.MaxPool2d(2, ceil_mode=True), nn.Conv2d(6, 6, 3), nn.AvgPool2d(2)
    )
    # a varying height and width: max pooling's indices over a plane padded inside count exact positions
    _check(lambda x: image(x).sum(), [(torch.randn(2, 3, h, w, requires_grad=True),) for h, w in ((19, 23), (27, 30))])
    # unbatched planes [C, H, W]: the spatial dims start at dim 1
    _check(
        lambda x: F.max_pool2d(x, 2).sum() + F.avg_pool2d(x, 3, 1, 1).sum(),
        [(torch.randn(3, h, 4, requires_grad=True),) for h in (5, 7, 6)],
    )


@pytest.mark.one_pass("strict")  # no device: the same in both passes
def test_topk_select_and_split_along_a_padded_dim():
    def fn(x):
        v, i = x.topk(3, dim=1)  # the largest of each row's valid values only
        last = x.flatten()[-1] + x.flatten()[4]  # select from the true end of a merged dim padded inside
        a, b, c = x.split([2, x.shape[1] - 4, 2], dim=1)  # pieces after a symbolic one start at a runtime offset
        return v.sum() + i.float().sum() + last + a.sum() + b.amax(1).sum() + c.sum()

    _check(fn, [(torch.randn(3, n, requires_grad=True),) for n in (5, 7, 11)])


@pytest.mark.one_pass("strict")  # no device: the same in both passes
def test_pooling_upsampling_and_padding_over_padded_planes():
    # the batch and channels vary, the spatial sizes do not: each plane is computed on its own, padding stays padding
    def fn(x):
        y = F.max_pool2d(x, 2) + F.avg_pool2d(x, 2) + F.adaptive_avg_pool2d(x, (3, 3))
        z = F.interpolate(y, scale_factor=2, mode="bilinear") + F.interpolate(y, scale_factor=2, mode="nearest")
        n = F.instance_norm(x)  # each (sample, channel) plane's statistics: batch norm over [1, B*C, H, W]
        return F.pad(z, (1, 1, 2, 0), mode="reflect").sum() + F.max_pool1d(x.flatten(2), 4).sum() + (n * n).sum()

    _check(fn, [(torch.randn(b, c, 6, 6, requires_grad=True),) for b, c in ((2, 3), (3, 5), (5, 7))], (0, 1))


def test_compiled_max_pool1d_over_varying_lengths_is_one_frame():
    # torch's C++ max_pool1d reads its output length as an int (a guard per length: a new Dynamo frame each): on tpu
    # it is traced as max_pool1d_with_indices, which keeps the length symbolic
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Conv1d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool1d(2), nn.AvgPool1d(2))
    model = copy.deepcopy(ref).to("tpu")
    f = torch.compile(model, backend="tpu", dynamic=True)
    torchtpu.metrics.reset()
    torch._dynamo.utils.counters.clear()
    for n in (40, 37, 55, 61, 45):  # one bucket (64)
        x = torch.randn(2, 3, n)
        a = f(x.to("tpu")).mean(-1).sum()
        a.backward()
        b = ref(x).mean(-1).sum()
        b.backward()
        assert abs(float(a) - float(b)) < 1e-5
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    c = _counters()
    assert c.get("compile.bucketed_captures") == 2 and not c.get("compile.bucket_declined")  # forward and backward
    for p, q in zip(ref.parameters(), model.parameters()):
        torch.testing.assert_close(q.grad.cpu(), p.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.one_pass("strict")  # no device: the same in both passes
def test_norms_products_and_index_select_along_a_padded_dim():
    def fn(x, i):
        n = x.norm(dim=1) + torch.linalg.vector_norm(x, ord=-1.5, dim=1) + x.norm(p=float("inf")) + x.norm()
        c = F.normalize(x, dim=1) + F.cosine_similarity(x, x.flip(1), dim=1).unsqueeze(1)
        p = (x.detach().abs() + 0.5).prod() + x.max() - x.min()  # (prod's backward slices: declined)
        s = x.index_select(1, i).sum() + x.t().index_select(0, i).sum() + x.repeat(2, 3).sum(1).mean()
        return n.sum() + c.sum() + p + s

    _check(fn, [(torch.randn(3, n, requires_grad=True), torch.tensor([0, 2, 1])) for n in (5, 7, 11)])


@pytest.mark.one_pass("strict")  # no device: the same in both passes
def test_scatter_and_gather_of_a_varying_number_of_rows():
    # a varying number of rows scattered into a fixed table (segment sums, MoE combine), and the backward of sort
    # and gather along a padded dim (scatters with an index padded along the scattered dim)
    def fn(x, seg):
        table = torch.zeros(4, x.shape[1]).scatter_add(0, seg.unsqueeze(1).expand_as(x), x)
        top = torch.full((4, x.shape[1]), -1e9).scatter_reduce(0, seg.unsqueeze(1).expand_as(x), x, "amax")
        v, i = x.sort(0)
        g = x.gather(0, i.flip(0))
        return table.sum() + (top * top).sum() + (v * torch.arange(x.shape[0]).unsqueeze(1)).sum() + (g * g).sum()

    _check(fn, [(torch.randn(n, 3, requires_grad=True), torch.randint(0, 4, (n,))) for n in (5, 7, 11)])


@pytest.mark.one_pass("strict")  # no device: the same in both passes
def test_replicate_and_circular_padding_and_slices_short_of_the_end():
    def fn(x):
        p = F.pad(x, (2, 3), mode="replicate") * 1.5 + F.pad(x, (2, 3), mode="circular")  # a padded spatial dim
        d = torch.diff(x, dim=2)  # backward: slice_scatter of a source short of the base's end
        t = torch.trapezoid(x, dim=2)
        return (p * p).sum() + (d * d).sum() + t.sum()

    _check(fn, [(torch.randn(2, 3, n, requires_grad=True),) for n in (5, 7, 11)])


@pytest.mark.one_pass("strict")  # no device: the same in both passes
def test_diagonals_of_padded_matrices():
    # sizes min(n, m) and max(0, min(n, m - 1)): ShapeEnv's own Min/Max
    def fn(x):
        d = x.diagonal() + 1.0
        e = x.diagonal(offset=1).sum() + torch.diag_embed(d).sum(0).sum()
        return (d * d).sum() + e

    _check(fn, [(torch.randn(n, m, requires_grad=True),) for n, m in ((5, 7), (6, 9), (7, 11))])


@pytest.mark.one_pass("strict")  # no device: the same in both passes
def test_spectrogram_of_a_varying_length():
    # framing (unfold) and FFTs over the static frame dim, a varying number of frames: torch.stft and its backward
    w = torch.hann_window(32)

    def fn(x):
        s = torch.stft(x, 32, hop_length=8, window=w, return_complex=True)
        frames = x.unfold(1, 16, 8)
        return s.abs().pow(2).mean() + frames.std(-1).sum() + torch.view_as_real(s).sum()

    _check(fn, [(torch.randn(2, n, requires_grad=True),) for n in (100, 130, 170)])


@pytest.mark.one_pass("strict")  # no device: the same in both passes
def test_grid_sample_over_a_varying_batch_and_output_size():
    # the input's own size is static (the grid's coordinates are relative to it); batch and output positions vary
    def fn(x, grid):
        return (F.grid_sample(x, grid, align_corners=False) ** 2).sum()

    calls = [
        (torch.randn(b, 3, 8, 8, requires_grad=True), (torch.rand(b, h, 5, 2) * 2 - 1).requires_grad_())
        for b, h in ((2, 5), (3, 7), (5, 6))
    ]
    _check(fn, calls, {0: (0,), 1: (0, 1)})


@pytest.mark.one_pass("strict")  # no device: the same in both passes
def test_group_norm_over_a_varying_batch():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(4, 8), nn.SiLU(), nn.Conv2d(8, 4, 3))
    _check(lambda x: net(x).square().mean(), [(torch.randn(b, 3, 6, 6, requires_grad=True),) for b in (3, 5, 7)], (0,))
