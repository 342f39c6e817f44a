"""The lowering table: importing these modules registers their rules (see tables.py and kernels.py)."""
from . import conv, copy, creation, distance, elementwise, embedding, indexing, matmul, nn, pool, random, reduction, scan  # noqa: F401
from . import complex, ctc, grid_sample, linalg, margin, optim, order, pad, segment, special, upsample  # noqa: F401
from . import foreach  # noqa: F401  (last: generated from the element rules above)
