"""Runs torch.compile'd graphs bucketed on the CPU and checks them (tests/shapes/test_buckets.py,
tests/shapes/test_bucket_sweep.py).

A checking backend: every graph with symbolic sizes AOTAutograd hands it is run twice, by the graph itself at the
exact sizes and by the bucketed interpreter (torchtpu/shapes) on buffers of the bucket's capacity whose padding
is NaN (or a large integer, or True): the outputs must agree, so the padding is never read into a valid value. Its
report holds one (graph kind, sizes, verdict) per graph call; verdict "ok", "unsupported: ..." (the interpreter
declines: on tpu that bucket captures per exact size instead) or "outputs [...] differ"."""

from __future__ import annotations

import torch

from torchtpu.shapes import Unsupported
from torchtpu.shapes import plan as shape_plan


def garbage_flat(t, cap):
    """t's values first in a flat tensor of cap elements; the rest NaN (floats), True (bools) or 12345."""
    flat = torch.empty(cap, dtype=t.dtype)
    flat.fill_(
        float("nan") if t.dtype.is_floating_point or t.dtype.is_complex else (True if t.dtype == torch.bool else 12345)
    )
    flat[: t.numel()] = t.reshape(-1)
    return flat


def _same(g, w):
    if g.shape != w.shape:
        return False
    if w.dtype.is_complex:
        return torch.allclose(g.cdouble(), w.cdouble(), rtol=1e-4, atol=1e-5, equal_nan=True)
    return torch.allclose(g.double(), w.double(), rtol=1e-4, atol=1e-5, equal_nan=True)


def checking_backend(report):
    from functorch.compile import make_boxed_func
    from torch._decomp import core_aten_decompositions
    from torch._dynamo.backends.common import aot_autograd

    def compiler(kind):
        def compile_graph(gm, example_inputs):
            try:
                plan = shape_plan.Plan(gm)
            except Unsupported as e:  # as torchtpu/compile.py: the graph runs per exact size
                report.append((kind, None, f"unsupported: {e}"))
                return make_boxed_func(gm)

            def call(args):
                want = gm(*args)
                values = plan.values(args)
                try:
                    flats = [
                        garbage_flat(a, plan.capacity(plan.in_shapes[i][1], values))
                        if isinstance(a, torch.Tensor) and plan.padded_input(i)
                        else None
                        for i, a in enumerate(args)
                    ]
                    got = shape_plan.exact_outputs(
                        plan, values, shape_plan.execute(plan, args, flats, torch.tensor(values))
                    )
                except Unsupported as e:
                    report.append((kind, values, f"unsupported: {e}"))
                    return want
                bad = [j for j, (g, w) in enumerate(zip(got, want)) if isinstance(w, torch.Tensor) and not _same(g, w)]
                report.append((kind, values, "ok" if not bad else f"outputs {bad} differ"))
                return want

            call._boxed_call = True
            return call if plan.symbolic() else make_boxed_func(gm)

        return compile_graph

    return aot_autograd(
        fw_compiler=compiler("forward"), bw_compiler=compiler("backward"), decompositions=core_aten_decompositions()
    )
