"""The lowering table: importing these modules registers their rules (see tables.py and kernels.py)."""

# registration order: foreach is generated from the element rules, so it comes last
# isort: off
from . import conv, copy, creation, distance, elementwise, embedding, indexing, matmul, nn  # noqa: F401
from . import pool, random, reduction, scan, complex, ctc, grid_sample, linalg, margin, optim  # noqa: F401
from . import order, pad, segment, special, upsample, asserts, attention  # noqa: F401
from . import foreach  # noqa: F401  (last: generated from the element rules above)
# isort: on
