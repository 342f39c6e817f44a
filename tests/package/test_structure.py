"""The package's shape: its modules import down the layers only (no cycle, no import that climbs back up), and no
file grows past the size a reader can hold (Python 900 lines, C++ 800). The layers are docs/architecture.md's
"Python package" table; a new module must be placed in one."""

from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PKG = os.path.join(ROOT, "torchtpu")

# bottom to top: a module may import modules of its own layer or below (never in a cycle)
LAYERS = [
    ["torchtpu._C", "torchtpu.version", "torchtpu.config", "torchtpu.dtypes", "torchtpu.errors", "torchtpu.untraced"],
    ["torchtpu.metrics", "torchtpu.hlo", "torchtpu.runtime", "torchtpu.checks"],
    ["torchtpu.emit", "torchtpu.cache", "torchtpu.jaxfn", "torchtpu.arguments"],
    ["torchtpu.views", "torchtpu.trace"],
    ["torchtpu.tables", "torchtpu.optable", "torchtpu.executor"],
    ["torchtpu.lowering", "torchtpu.lowering.*"],
    ["torchtpu.kernels", "torchtpu.fallback"],
    ["torchtpu.shapes", "torchtpu.shapes.*"],
    [
        "torchtpu.compile",
        "torchtpu.collectives",
        "torchtpu.distributed",
        "torchtpu.device",
        "torchtpu.jax_ops",
        "torchtpu.advisor",
    ],
    ["torchtpu", "torchtpu.__main__", "torchtpu.cuda_as_tpu"],
]
MAX_PY_LINES = 900
MAX_CPP_LINES = 800


def _modules():
    mods = {"torchtpu._C": None}  # the C++ extension
    for dirpath, _, files in os.walk(PKG):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                mods[name[: -len(".__init__")] if name.endswith(".__init__") else name] = path
    return mods


def _imports(mods):
    """module -> [(imported module, line)] for every import of the package, at module level or inside functions."""
    out = {}
    for m, path in mods.items():
        if path is None:
            continue
        pkg = m if path.endswith("__init__.py") else m.rpartition(".")[0]
        edges = out.setdefault(m, [])
        for node in ast.walk(ast.parse(open(path).read(), path)):
            targets = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = pkg.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                if base.split(".")[0] != "torchtpu":
                    continue
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.split(".")[0] == "torchtpu"]
            for t in targets:
                while t not in mods and "." in t:
                    t = t.rpartition(".")[0]
                if t != m:
                    edges.append((t, node.lineno))
    return out


def _layer(m):
    for i, names in enumerate(LAYERS):
        for n in names:
            if m == n or (n.endswith(".*") and m.startswith(n[:-1])):
                return i
    return None


def test_every_module_has_a_layer():
    missing = sorted(m for m in _modules() if _layer(m) is None)
    assert not missing, f"place these modules in a layer of tests/package/test_structure.py LAYERS: {missing}"


def test_imports_go_down_the_layers():
    mods = _modules()
    up = [
        f"{m}:{line} imports {t} (layer {_layer(m)} -> {_layer(t)})"
        for m, edges in _imports(mods).items()
        for t, line in edges
        if _layer(m) is not None and _layer(t) is not None and _layer(t) > _layer(m)
    ]
    assert not up, "imports that climb the layers:\n" + "\n".join(up)


def test_no_import_cycle():
    graph = {m: sorted({t for t, _ in e}) for m, e in _imports(_modules()).items()}
    index, low, stack, on, cycles, counter = {}, {}, [], set(), [], [0]

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def _line_counts(top, exts):
    for dirpath, _, files in os.walk(top):
        for f in files:
            if f.endswith(exts):
                path = os.path.join(dirpath, f)
                with open(path) as fh:
                    yield os.path.relpath(path, ROOT), sum(1 for _ in fh)


def test_files_stay_small():
    big = [f"{p}: {n} lines" for p, n in _line_counts(PKG, (".py",)) if n >= MAX_PY_LINES]
    big += [
        f"{p}: {n} lines" for p, n in _line_counts(os.path.join(ROOT, "csrc"), (".cpp", ".h")) if n >= MAX_CPP_LINES
    ]
    assert not big, f"split these files (Python < {MAX_PY_LINES} lines, C++ < {MAX_CPP_LINES}): {big}"


def test_tests_mirror_the_package():
    """tests/ holds folders, one per part of the package; what is not a test (the zoo, the sweeps) lives in
    tests/tools, except a worker a test runs as a process beside it. Test basenames are unique (pytest imports them
    by basename)."""
    tests = os.path.join(ROOT, "tests")
    top = sorted(f for f in os.listdir(tests) if f.endswith(".py"))
    assert top == ["conftest.py"], f"tests/ itself holds only conftest.py; move these into a folder: {top}"
    seen, misplaced = {}, []
    for dirpath, dirnames, files in os.walk(tests):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for f in files:
            if not f.endswith(".py") or dirpath == tests:
                continue
            rel = os.path.relpath(os.path.join(dirpath, f), ROOT)
            in_tools = os.path.basename(dirpath) == "tools"
            if f.startswith("test_"):
                assert f not in seen, f"two test modules named {f}: {seen[f]} and {rel}"
                seen[f] = rel
                if in_tools:
                    misplaced.append(rel)
            elif not in_tools and not f.endswith("_worker.py"):
                misplaced.append(rel)
    assert not misplaced, f"tests in tests/tools or helpers outside it: {misplaced}"
