"""``python -m torchtpu run|advise [options] script.py [script args]``: an unmodified script with tpu as the target.

run     runs the script; every ``--every`` optimizer steps prints one progress line (ops, chunks, compiles, host
        syncs, fallbacks since the previous line); at exit the metrics report (``--report``: the full one).
advise  runs the script; after ``--warmup`` optimizer steps it runs the advisor (torchtpu/advisor.py) on the next
        steps (one plain, one recorded: a step is what happens between two ``optimizer.step()`` calls), prints
        its report (and ``--png``'s roofline plot), then lets the script finish.
Both: ``--mode strict|fused|debug``; ``--cuda-as-tpu`` runs a script written for ``device="cuda"`` on tpu and
lists what it redirected.
"""

from __future__ import annotations

import argparse
import runpy
import sys


def _parser():
    ap = argparse.ArgumentParser(prog="python -m torchtpu")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("run", "advise"):
        p = sub.add_parser(name)
        p.add_argument("--mode", choices=("strict", "fused", "debug"))
        p.add_argument("--cuda-as-tpu", action="store_true")
        if name == "run":
            p.add_argument("--every", type=int, default=10, help="progress line every N optimizer steps")
            p.add_argument("--report", action="store_true", help="the full metrics report at exit (else totals)")
        else:
            p.add_argument("--generation", default="v5e")
            p.add_argument("--warmup", type=int, default=2)
            p.add_argument("--png", help="write the roofline plot here")
        p.add_argument("script")
        p.add_argument("args", nargs=argparse.REMAINDER)
    return ap


class _Steps:
    """Counts optimizer steps through torch's global post-step hook and calls `on_step(n)` after each."""

    def __init__(self, on_step):

        self.n = 0
        self.on_step = on_step
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self.handle = register_optimizer_step_post_hook(self._hook)

    def _hook(self, opt, args, kwargs):
        self.n += 1
        self.on_step(self.n)


def main(argv=None) -> int:
    a = _parser().parse_args(argv)
    import torch

    import torchtpu
    from torchtpu import metrics

    if a.mode:
        torchtpu.set_mode(a.mode)
    if a.cuda_as_tpu:
        from torchtpu import cuda_as_tpu

        cuda_as_tpu.enable()
    out = sys.stderr
    if a.cmd == "run":
        metrics.step_line()

        def progress(n):
            if n % a.every == 0:
                print(f"[torchtpu] step {n}: {metrics.step_line()}", file=out, flush=True)

        steps = _Steps(progress)
    else:
        from torchtpu import advisor

        state = {}

        def advise(n):
            if n == a.warmup:
                state["probe"] = advisor._Probe().__enter__()
            elif n == a.warmup + 1 and "probe" in state:
                state["probe"].__exit__(None, None, None)
                state["record"] = advisor._Record().__enter__()
            elif n == a.warmup + 2 and "record" in state:
                r, p = state.pop("record"), state.pop("probe")
                r.__exit__(None, None, None)
                rep = advisor.Report.of(p, r, a.generation)
                print(rep.text(), file=out, flush=True)
                if a.png:
                    print(f"[torchtpu] roofline plot: {rep.plot(a.png)}", file=out, flush=True)
                state["done"] = True

        steps = _Steps(advise)
    sys.argv = [a.script] + a.args
    try:
        runpy.run_path(a.script, run_name="__main__")
    finally:
        if a.cmd == "advise" and "record" in state:  # the script ended inside the recorded step
            state["record"].__exit__(None, None, None)
        if a.cmd == "advise" and not state.get("done"):
            print(
                f"[torchtpu] advise: the script made {steps.n} optimizer step(s); the advisor needs "
                f"{a.warmup + 2} (--warmup {a.warmup} + 2)",
                file=out,
            )
        if a.cmd == "run":
            c = metrics.counters()
            fb = sum(v for k, v in c.items() if k.startswith("fallback."))
            print(
                f"[torchtpu] {steps.n} optimizer steps; in all: ops {c.get('ops', 0)}, programs run "
                f"{c.get('executions', 0)}, compiles {c.get('compiles', 0)} ({c.get('compile_seconds', 0):.1f} s), "
                f"host syncs {c.get('host_syncs', 0)}, CPU fallbacks {fb}",
                file=out,
                flush=True,
            )
            if a.report:
                print(metrics.report(), file=out, flush=True)
        if a.cuda_as_tpu:
            from torchtpu import cuda_as_tpu

            print(
                "[torchtpu] --cuda-as-tpu redirected: "
                + (", ".join(f"{k} x{v}" for k, v in cuda_as_tpu.redirected()) or "nothing"),
                file=out,
                flush=True,
            )
        del torch
    return 0


if __name__ == "__main__":
    sys.exit(main())
