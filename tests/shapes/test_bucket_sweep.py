"""The OpInfo sweep over bucketed sizes (tests/tools/bucket_sweep.py), on the CPU: a sample's graphs run by the bucketed
interpreter on NaN padding must equal the graphs at their exact sizes; an op without a rule declines (counted), never
answers wrong. CI runs the ops below, which cover every family of rules (reductions and their counts, scans, views
that merge and split padded dims, cat/split/pad/slices, contractions, indexing, normalization, losses, resampling);
`python tests/tools/bucket_sweep.py` runs all of op_db (docs/architecture.md gives its last counts)."""

import bucket_sweep
import pytest

OPS = [
    "var_mean",
    "logsumexp",
    "prod",
    "softmax",
    "log_softmax",
    "cumsum",
    "logcumsumexp",
    "cat",
    "hstack",
    "split",
    "unbind",
    "flip",
    "rot90",
    "constant_pad_nd",
    "narrow",
    "reshape",
    "view",
    "flatten",
    "permute",
    "squeeze",
    "mm",
    "bmm",
    "einsum",
    "addmm",
    "index_put",
    "masked_fill",
    "tril",
    "diff",
    "repeat_interleave",
    "nn.functional.cross_entropy",
    "nn.functional.nll_loss",
    "native_batch_norm",
    "nn.functional.unfold",
    "nn.functional.pixel_shuffle",
    "masked.var",
    "frexp",
    "take",
    "gather",
    "chunk",
]
# (scatter_reduce, sort, index_select, norms, pad, diff/trapezoid, diagonals: CPU-checked in
# tests/shapes/test_buckets.py; the whole of op_db in `python tests/tools/bucket_sweep.py`)
# their first two samples decline today (each still right: that bucket compiles per exact size); take and chunk
# answered wrong or raised before (tests/tools/bucket_sweep.py found them)
DECLINED = {
    "take": "indices into a flattened tensor padded inside",
    "chunk": "its last piece's size shrinks as the dim grows",
}


@pytest.mark.one_pass("strict")  # no device: the same in both passes
def test_bucketed_op_samples_equal_their_exact_graphs():
    res = bucket_sweep.sweep(ops=OPS, max_samples=2)
    assert {name for name, _ in res} == set(OPS)
    bad = {k: v for k, v in res.items() if any(s in ("wrong", "error") for s, _ in v)}
    assert not bad, bad
    ok = {name for (name, _), v in res.items() if any(s == "ok" for s, _ in v)}
    assert ok == set(OPS) - set(DECLINED), {k: v for k, v in res.items() if k[0] in set(OPS) ^ ok ^ set(DECLINED)}
    print(f"\nbucketed OpInfo samples: {dict(bucket_sweep.summarize(res))}")
