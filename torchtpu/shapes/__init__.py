"""Varying sizes: one program per bucket of sizes instead of one per size.

Everything about sizes that change between calls lives here:

- ``policy.py``: the bucket policy (``torchtpu.set_shape_buckets``).
- ``padded.py``: padded tensors (``PT``: a tensor at its bucket's sizes whose valid values are each dim's first
  ``n`` positions), symbolic sizes (``Sz``), masks, and the gathers between compact and padded layouts.
- ``interp.py``: the interpreter that runs an FX graph node by node on padded tensors, and its generic rules
  (pointwise ops, factories, symbolic ints); ``rules_views.py``, ``rules_reduce.py``, ``rules_index.py`` and
  ``rules_spatial.py``: the padded rules of each op family (each proves its op right on padded inputs, or raises
  ``Unsupported``).
- ``plan.py``: what a ``torch.compile(dynamic=True)`` graph's bucketed calls need (compile.py runs it).
- ``eager_buckets.py`` (data-dependent row counts: ``nonzero``, masks, an MoE's routing), ``data_dependent.py``
  (the ops that make such rows) and ``eager_symbolic.py`` with ``padded_trace.py`` (a varying inner size, a
  sequence length): the eager modes' bucketing, lowerers the op table (kernels.py) calls on a miss.

How the interpreter runs a graph:

A graph from ``torch.compile(dynamic=True)`` or ``mark_dynamic`` has symbolic sizes (``s0``). Each symbol's value is
rounded up to its bucket (``set_shape_buckets``: by default the next power of two), and the graph runs on tensors of
the bucket's sizes, *padded*: the valid values of a dimension of exact size ``n`` and padded size ``P`` are its first
``n`` positions, the rest (the padding) hold anything. :func:`run` interprets the graph node by node on such
tensors; where an op would read the padding into a valid position (a sum, a mean, a matmul's contraction, a softmax,
a layer norm's weight gradient, an ``index_put`` with accumulation, a pad after the end) it first replaces the padding
by the op's identity (``where``, NaN-safe) or moves values so that the valid ones stay in front. The true sizes are
a runtime input (a device tensor), so the masks, counts and positions depend on them and not on the program: it
is the same for every size of the bucket. An op it cannot prove right on padded inputs raises :class:`Unsupported`
(the graph is then captured per exact size, as without buckets, and the reason reported).

Dimensions that merge several padded ones (``view(B * T, H)`` of ``[B, T, H]``) keep their factors, so a mask
knows which of the merged positions are valid. Inputs arrive compact (a contiguous tensor of the exact size at the
start of a storage with the bucket's capacity): :func:`run` reads each through its flat storage and gathers it into
the padded layout (padding zeroed), and returns each output compact again (its exact values first in a flat buffer
of the bucket's capacity), so that the tensors the user sees have exact sizes and contiguous strides.

The interpreter runs only while a program is captured (csrc/graph/capture.h records the ops it issues); every
later call of the bucket runs the captured program, with no Python per op. It runs on CPU tensors too, which is
how tests check it against the graph run at the exact sizes.
"""

from __future__ import annotations

# The rule families and the eager lowerers register themselves on import (interp.HANDLERS, kernels.LOWERERS,
# tables.DIRECT).
from . import data_dependent, eager_buckets, eager_symbolic, rules_index, rules_reduce, rules_spatial, rules_views  # noqa: F401
from .padded import Unsupported
from .policy import bucket, enabled, get_shape_buckets, set_shape_buckets

__all__ = ["Unsupported", "bucket", "enabled", "get_shape_buckets", "set_shape_buckets"]
