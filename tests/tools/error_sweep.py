"""PyTorch's OpInfo ``error_inputs`` on tpu: every case that raises on cpu must raise on tpu, in every eager mode,
for the function, its in-place variant and its out= variant, in every dtype the OpInfo lists for cpu.

A case is (op, error input, variant, dtype): the error input's tensors of its first tensor's dtype are cast to the
dtype (index tensors and others keep theirs), the variant is called on cpu, and only if cpu raises is it run on
tpu (moved keeping aliasing, as out= tensors may overlap an input), with a synchronization after, as cuda's
device-side asserts surface at the next one. "silent" cases return on tpu: a wrong answer where cpu raises.

Run: .venv/bin/python tests/tools/error_sweep.py [--modes strict,fused,debug] [ops...]
Used by tests/executor/test_error_inputs.py (a share of the ops per pass in CI; TORCHTPU_SWEEP=full for all)."""

from __future__ import annotations

import argparse
import collections
import contextlib
import re
import sys
import time
import warnings

import torch
from torch.testing._internal.common_methods_invocations import op_db

from torchtpu import executor

MODES = ("strict", "fused", "debug")
UNSUPPORTED = {torch.complex32}  # dtypes tpu tensors cannot have (a clear error at creation, docs/ops.md)


def mover():
    """cpu -> tpu, one tpu storage per cpu storage, so views that alias on cpu alias on tpu."""
    bases = {}

    def move(x):
        if not isinstance(x, torch.Tensor) or x.device.type != "cpu":
            return x
        st = x.untyped_storage()
        key = (st.data_ptr(), x.dtype)
        if key not in bases:
            bases[key] = (
                torch.empty(0, dtype=x.dtype).set_(st).to("tpu") if st.nbytes() % x.element_size() == 0 else None
            )
        base = bases[key]
        return x.to("tpu") if base is None else base.as_strided(x.shape, x.stride(), x.storage_offset())

    return move


def _first_tensor(sample):
    for x in (sample.input, *sample.args, *sample.kwargs.values()):
        if isinstance(x, torch.Tensor):
            return x
        if isinstance(x, (list, tuple)):
            for y in x:
                if isinstance(y, torch.Tensor):
                    return y
    return None


def _cast(sample, src, dst):
    """A copy of the sample with its tensors of dtype src cast to dst, keeping which ones alias (one copy per
    storage; empty storages, which have no address, each their own). Always a copy: runs may resize or write
    their out= tensors, and an OpInfo's cases may share tensors."""
    made = {}

    def cast(x):
        if not isinstance(x, torch.Tensor):
            return x
        st = x.untyped_storage()
        key = (st.data_ptr() or id(x), x.dtype)
        if key not in made:
            base = torch.empty(0, dtype=x.dtype, device=x.device).set_(st)
            made[key] = base.to(dst) if x.dtype == src and dst != src else base.clone()
        return made[key].as_strided(x.shape, x.stride(), x.storage_offset())

    return sample.transform(cast)


def _call(op, variant, sample, out_dtype=None):
    args, kwargs = sample.args, dict(sample.kwargs)
    if variant == "function":
        return op(sample.input, *args, **kwargs)
    if variant == "inplace":
        return op.inplace_variant(sample.input, *args, **kwargs)
    x = _first_tensor(sample)
    out = torch.empty(0, dtype=out_dtype, device=x.device)
    return op(sample.input, *args, out=out, **kwargs)


def _raises_as_meant(fn, regex):
    """True when fn raises on cpu with the error the OpInfo means (its regex), not one this harness caused."""
    try:
        fn()
    except Exception as e:
        return not regex or re.search(regex, str(e)) is not None
    return False


def cases(op):
    """(variant, dtype, out dtype, sample, regex) for each error input that raises on cpu as the OpInfo means.
    Dtypes: the error input's own, then every other dtype the OpInfo lists for cpu (its tensors of the first
    tensor's dtype cast); out=: an empty out tensor of the input's dtype, bool or int64 (what cpu accepts)."""
    dtypes = sorted(op.supported_dtypes("cpu"), key=str)
    variants = ["function"]
    if op.inplace_variant is not None:
        variants.append("inplace")
    if op.supports_out:
        variants.append("out")
    # the OpInfo builds each case on cpu and on tpu (some only differ there: views, overlapping out= tensors)
    for ei, built in zip(op.error_inputs("cpu"), op.error_inputs("tpu")):
        s, regex = ei.sample_input, ei.error_regex
        first = _first_tensor(s)
        if first is None:
            continue
        for dtype in [first.dtype] + [d for d in dtypes if d != first.dtype]:
            if dtype in UNSUPPORTED:
                continue
            try:
                cs = _cast(s, first.dtype, dtype)
                ts = _cast(built.sample_input, first.dtype, dtype)
            except Exception:
                continue
            for variant in variants:
                outs = [None] if variant != "out" else list(dict.fromkeys([dtype, torch.bool, torch.int64]))
                for od in outs:
                    if _raises_as_meant(lambda: _call(op, variant, _cast(cs, dtype, dtype), od), regex):
                        yield variant, dtype, od, cs, ts, regex
                        break


def sweep(ops, modes=MODES, others=None):
    """Counts and the silent cases [(op, variant, dtype, mode, expected error)] over the ops."""
    warnings.filterwarnings("ignore")
    stats = collections.Counter()
    silent, unmovable = [], []
    for op in ops:
        for variant, dtype, out_dtype, sample, built, regex in cases(op):
            stats["raise_on_cpu"] += 1
            try:
                sample.transform(mover())  # movable at all (a dtype tpu has)
            except Exception as e:
                unmovable.append((op.name, variant, str(dtype), str(e)[:80]))
                continue
            for how in ("moved", "built"):
                for mode in modes:
                    stats["runs"] += 1
                    # a fresh copy per run: a run may resize its out= tensor before it raises, as cpu does
                    tpu_sample = sample.transform(mover()) if how == "moved" else _cast(built, dtype, dtype)
                    with executor.mode(mode):
                        try:
                            _call(op, variant, tpu_sample, out_dtype)
                            torch.tpu.synchronize()
                            silent.append((op.name, variant, str(dtype).replace("torch.", ""), f"{mode}/{how}", regex))
                        except Exception as e:
                            stats["raise_on_tpu"] += 1
                            if regex and re.search(regex, str(e)):
                                stats["same_message"] += 1
                            elif others is not None:
                                msg = f"{type(e).__name__}: {e}"[:300]
                                others.append((op.name, variant, str(dtype), mode, regex, msg))
                        with contextlib.suppress(Exception):
                            torch.tpu.synchronize()  # a late check of this case must not land on the next one
    return stats, silent, unmovable


def error_ops():
    return [op for op in op_db if op.error_inputs_func is not None]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--messages", action="store_true", help="print tpu errors whose message differs from cpu's")
    ap.add_argument("ops", nargs="*")
    args = ap.parse_args()
    ops = [op for op in error_ops() if not args.ops or op.name in args.ops]
    t0 = time.time()
    others = []
    stats, silent, unmovable = sweep(ops, args.modes.split(","), others=others)
    if args.messages:
        for o in others:
            print("other message:", o)
    print(f"{len(ops)} ops, {dict(stats)}, {time.time() - t0:.0f} s")
    by_op = collections.defaultdict(list)
    for name, variant, dtype, mode, regex in silent:
        by_op[name].append(f"{variant}/{dtype}/{mode}")
    print(f"silent: {len(silent)} cases in {len(by_op)} ops")
    for name, where in sorted(by_op.items()):
        print(f"  {name}: {', '.join(where)}")
    for u in unmovable:
        print("unmovable:", u)
    return 1 if silent or unmovable else 0


if __name__ == "__main__":
    sys.exit(main())
