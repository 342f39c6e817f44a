"""Generation speed, measured in one run: a Llama-shaped Hugging Face model (hidden 256, 4 layers, 8 heads, 4 KV
heads) decoding greedily, on PyTorch CPU eager, tpu in every eager mode, tpu compiled (HF's fast path) and JAX.

Run: .venv/bin/python bench/generate.py [--prompt 12] [--short 8] [--long 40] [--write]

Rows (each in its own process with an empty TORCHTPU_CACHE_DIR, so "first call" includes every compile):
- ``generate``: ``model.generate(ids, do_sample=False)`` as a user writes it. Eager rows use the dynamic cache;
  "compiled" rows set ``generation_config.cache_implementation = "static"``, which is Hugging Face's fast path:
  transformers compiles the decode step with ``torch.compile(backend="tpu")`` for tpu models. Hugging Face's loop
  reads one flag back per token (its stop check) on every device.
- ``decode loop``: the same greedy loop written out, to compare with JAX: a static cache, one step per token
  (forward, argmax, cache update; ``torch.compile(backend="tpu")`` on tpu, one ``jax.jit`` in JAX, bench/jax_llama.py)
  and one host read per token, as in Hugging Face's loop.
ms per token = (time of ``--long`` new tokens - time of ``--short``) / (long - short), best of 3 rounds, so the
prompt's prefill cancels. The tpu decode loop's row also times the JAX loop in its own process, alternating with
it round by round, and its "/ JAX loop" is to that figure: the machine's speed drifts between the rows' processes
(the JAX row alone has measured 1.19 and 2.7 ms per token minutes apart). "first call" is the first ``--long``
generation of a cold process (compiles included). Programs (XLA executions) and host syncs are per generated
token, the long call's counts less the short one's (torchtpu.metrics); compiles are those of the timed calls,
after the first two (0: nothing compiles again). The machines are shared and noisy: read the ratios,
measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

CONFIG = dict(
    vocab_size=2048,
    hidden_size=256,
    intermediate_size=688,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    max_position_embeddings=512,
    initializer_range=0.2,  # wide enough that greedy decoding does not repeat one token
    bos_token_id=0,
    eos_token_id=None,
    pad_token_id=0,
)
# name -> (kind, device, TORCHTPU_MODE, label)
ROWS = {
    "cpu": ("generate", "cpu", None, "PyTorch CPU eager, dynamic cache"),
    "strict": ("generate", "tpu", "strict", "tpu strict, dynamic cache"),
    "fused": ("generate", "tpu", "fused", "tpu fused, dynamic cache"),
    "debug": ("generate", "tpu", "debug", "tpu debug, dynamic cache"),
    "compiled": ("static", "tpu", "strict", "tpu compiled, static cache (strict around it)"),
    "compiled-fused": ("static", "tpu", "fused", "tpu compiled, static cache (fused around it)"),
    "loop-cpu": ("loop", "cpu", None, "decode loop: PyTorch CPU eager"),
    "loop-tpu": ("loop", "tpu", "strict", "decode loop: tpu, step compiled"),
    "loop-jax": ("jax", None, None, "decode loop: JAX, step in one jax.jit"),
}


def build():
    import torch
    import transformers as T

    torch.manual_seed(0)
    return T.LlamaForCausalLM(T.LlamaConfig(**CONFIG)).eval()


def prompt_ids(n):
    import torch

    return torch.randint(1, CONFIG["vocab_size"], (1, n), generator=torch.Generator().manual_seed(1))


def hf_generate(model, ids, static):
    if static:
        model.generation_config.cache_implementation = "static"

    def run(n):
        return model.generate(ids, max_new_tokens=n, do_sample=False, pad_token_id=0).cpu()

    return run


def torch_loop(model, ids, max_len, device):
    """The greedy loop written out: a static cache, one (compiled on tpu) step per token, one read per token."""
    import torch
    import transformers as T

    cache = T.StaticCache(config=model.config, max_cache_len=max_len)

    def step(tok, pos):
        logits = model(input_ids=tok[:, None], past_key_values=cache, cache_position=pos, use_cache=True).logits
        return logits[:, -1].argmax(-1), pos + 1

    if device == "tpu":
        step = torch.compile(step, backend="tpu", fullgraph=True)
    t = ids.shape[1]

    def run(n):
        cache.reset()
        logits = model(input_ids=ids, past_key_values=cache, cache_position=torch.arange(t, device=device)).logits
        tok = logits[:, -1].argmax(-1)
        pos = torch.tensor([t], device=device)
        out = [tok]
        for _ in range(n - 1):
            tok, pos = step(tok, pos)
            out.append(tok)
            bool((tok < 0).all())  # Hugging Face's stop check: one read per token
        return torch.cat([ids, torch.stack(out, 1)], 1).cpu()

    return run


def jax_loop(model, ids, max_len):
    import jax
    import jax_llama

    decoder = jax_llama.make_decoder(model.config, max_len)
    params = {k: jax.device_put(v) for k, v in jax_llama.params_of(model).items()}
    prompt = ids.numpy()

    def run(n):
        import torch

        return torch.from_numpy(jax_llama.generate(decoder, params, prompt, n))

    return run


def measure(name, args):
    """One row, in this process: first-call seconds, ms per token, tokens, programs and syncs per token."""
    import torch

    kind, device, mode, _ = ROWS[name]
    if device == "tpu":
        import torchtpu  # noqa: F401
        from torchtpu import metrics
    model = build()
    ids = prompt_ids(args.prompt)
    with torch.no_grad():
        if device == "tpu":
            model = model.to("tpu")
            ids = ids.to("tpu")
        if kind in ("generate", "static"):
            run = hf_generate(model, ids, kind == "static")
        elif kind == "loop":
            run = torch_loop(model, ids, args.prompt + args.long, device)
        else:
            run = jax_loop(model, ids, args.prompt + args.long)
        t0 = time.perf_counter()
        tokens = run(args.long)
        first = time.perf_counter() - t0
        run(args.short)
        # the tpu decode loop's JAX reference, timed in the same rounds (the machine's speed drifts between processes)
        jax_run = jax_loop(build(), prompt_ids(args.prompt), args.prompt + args.long) if name == "loop-tpu" else None
        if jax_run is not None:
            jax_run(args.long)
        best = {args.short: float("inf"), args.long: float("inf")}
        jax_best = dict(best)
        seen = {}
        for _ in range(3):
            for n in (args.short, args.long):
                if device == "tpu":
                    metrics.reset()
                t0 = time.perf_counter()
                run(n)
                best[n] = min(best[n], time.perf_counter() - t0)
                if device == "tpu":
                    seen[n] = metrics.counters()
                if jax_run is not None:
                    t0 = time.perf_counter()
                    jax_run(n)
                    jax_best[n] = min(jax_best[n], time.perf_counter() - t0)
        per_gen = {}
        if device == "tpu":  # per generated token: the long run's counts less the short run's
            a, b = seen[args.short], seen[args.long]
            span = args.long - args.short
            per_gen = {
                "programs": (b.get("executions", 0) - a.get("executions", 0)) / span,
                "syncs": (b.get("host_syncs", 0) - a.get("host_syncs", 0)) / span,
                "compiles": sum(c.get("compiles", 0) for c in (a, b)),
                "fallbacks": sum(v for c in (a, b) for k, v in c.items() if k.startswith("fallback.")),
            }
    span = (args.long - args.short) / 1e3
    ms = (best[args.long] - best[args.short]) / span
    if jax_run is not None:
        per_gen["jax_ms"] = (jax_best[args.long] - jax_best[args.short]) / span
    return dict(first=first, ms=ms, tokens=tokens.tolist(), **per_gen)


def child_env(name):
    _, device, mode, _ = ROWS[name]
    env = dict(os.environ)
    if mode:
        env["TORCHTPU_MODE"] = mode
    return env


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompt", type=int, default=12)
    ap.add_argument("--short", type=int, default=8)
    ap.add_argument("--long", type=int, default=40)
    ap.add_argument("--row", help="measure one row in this process and print it as JSON (used by the parent)")
    ap.add_argument("--write", action="store_true", help="also write the table into docs/performance.md")
    ap.add_argument("rows", nargs="*", default=list(ROWS))
    args = ap.parse_args()
    if args.row:
        print("ROW " + json.dumps(measure(args.row, args)))
        return
    results = {}
    for name in args.rows:
        with tempfile.TemporaryDirectory() as cache:
            env = dict(child_env(name), TORCHTPU_CACHE_DIR=cache)
            cmd = [sys.executable, os.path.abspath(__file__), "--row", name]
            cmd += ["--prompt", str(args.prompt), "--short", str(args.short), "--long", str(args.long)]
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
        line = [x for x in p.stdout.splitlines() if x.startswith("ROW ")]
        if p.returncode or not line:
            print(f"{name}: failed (exit {p.returncode})\n{p.stderr[-3000:]}", file=sys.stderr)
            continue
        results[name] = json.loads(line[-1][4:])
    table = render(results, args)
    print(table)
    if args.write:
        write_doc(table)


def render(results, args):
    cpu = results.get("cpu", {}).get("ms")
    jax_ms = results.get("loop-jax", {}).get("ms")
    ref = results.get("cpu", {}).get("tokens")
    lines = [
        f"Llama-shaped model (hidden 256, 4 layers, 8 heads / 4 KV heads, vocab {CONFIG['vocab_size']}), greedy, "
        f"prompt {args.prompt} tokens, ms per token over new tokens {args.short}..{args.long}, batch 1",
        "",
        "| row | ms / token | / CPU eager | / JAX loop | first call | programs / token | host syncs / token | "
        "compiles in the timed calls | CPU fallbacks | tokens = CPU's |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, r in results.items():
        label = ROWS[name][3]
        ratio_cpu = f"{r['ms'] / cpu:.2f}x" if cpu else "-"
        ratio_jax = f"{r['ms'] / jax_ms:.2f}x" if jax_ms else "-"
        if "jax_ms" in r:  # its own JAX reference, timed in the same process and rounds
            ratio_jax = f"{r['ms'] / r['jax_ms']:.2f}x (JAX {r['jax_ms']:.2f} ms in the same rounds)"
        prog = f"{r['programs']:.1f}" if "programs" in r else "-"
        syncs = f"{r['syncs']:.1f}" if "syncs" in r else "-"
        comp = str(r["compiles"]) if "compiles" in r else "-"
        fb = str(r["fallbacks"]) if "fallbacks" in r else "-"
        same = "yes" if ref is not None and r["tokens"] == ref else ("-" if ref is None else "NO")
        lines.append(
            f"| {label} | {r['ms']:.2f} | {ratio_cpu} | {ratio_jax} | {r['first']:.1f} s | {prog} | {syncs} | "
            f"{comp} | {fb} | {same} |"
        )
    return "\n".join(lines)


def write_doc(table):
    path = os.path.join(ROOT, "docs", "performance.md")
    text = open(path).read()
    begin, end = "<!-- generate:begin -->", "<!-- generate:end -->"
    block = f"{begin}\n{table}\n{end}"
    if begin in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n## Generation (bench/generate.py)\n\n" + block + "\n"
    with open(path, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
