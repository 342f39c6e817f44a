"""Writes docs/config.md from torchtpu/config.py (every TORCHTPU_* knob): `.venv/bin/python scripts/gen_config_doc.py`.
tests/package/test_config.py fails when the page and the declarations differ."""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADER = """# Configuration

Every `TORCHTPU_*` environment variable, declared once in `torchtpu/config.py` (its type, default and meaning);
this page is generated from it by `scripts/gen_config_doc.py`. "at import" knobs are read once when torchtpu is
imported (change them with the API named, where there is one: `torchtpu.set_mode`, `torchtpu.set_shape_buckets`,
`torchtpu.executor.set_check_nans`); "at call" knobs are read each time they are used. In code,
`torchtpu.config.get(name)` reads a knob and `torchtpu.config.set(name, value)` overrides it for the process.

"""


def page() -> str:
    import importlib.util

    spec = importlib.util.spec_from_file_location("_torchtpu_config", os.path.join(ROOT, "torchtpu", "config.py"))
    config = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = config  # (dataclasses look their module up)
    spec.loader.exec_module(config)  # config.py imports nothing of torchtpu: no need to load the package
    return HEADER + config.docs_table()


if __name__ == "__main__":
    with open(os.path.join(ROOT, "docs", "config.md"), "w") as f:
        f.write(page())
    print("wrote docs/config.md")
