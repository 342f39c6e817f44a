"""The data-dependent ops whose results are bucketed rows: the host learns the count (a counted host sync) and the
rows go to the device in a storage of the count's bucket (eager_buckets.rows_tensor), so the ops after them lower
once per bucket, not once per count. Registered as Python kernels (tables.DIRECT).
"""

from __future__ import annotations

import torch

from .. import executor, metrics
from ..tables import PREPROCESS, direct
from .eager_buckets import rows_tensor


@direct("nonzero")
def nonzero(self):
    metrics.inc("op.nonzero")
    idx = torch.nonzero(executor.read_host(self, "nonzero"))
    # the count's bucket (sticky per input shape): later ops compile once per bucket, not once per count
    return rows_tensor(idx, self.device, ("nonzero", tuple(self.shape), self.dtype), self.numel())


@direct("masked_select")
def masked_select(self, mask):
    metrics.inc("op.masked_select")
    shape = torch.broadcast_shapes(self.shape, mask.shape)
    m = executor.read_host(
        mask.expand(shape) if mask.device.type == "tpu" else mask.expand(shape).to(self.device), "masked_select"
    )
    flat_idx = rows_tensor(torch.nonzero(m.reshape(-1)).reshape(-1), self.device, ("masked_select", shape), m.numel())
    return self.expand(shape).reshape(-1).index_select(0, flat_idx)


def _masks_to_indices(args, kwargs):
    """Boolean mask indices become the long indices of their true elements (a host sync, as on cuda)."""
    x, indices, *rest = args
    if not any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices):
        return args, kwargs
    out = []
    for i in indices:
        if i is not None and i.dtype in (torch.bool, torch.uint8):
            out.extend(nonzero(i).unbind(1))
        else:
            out.append(i)
    return (x, out, *rest), kwargs


PREPROCESS["index.Tensor"] = _masks_to_indices
PREPROCESS["index_put"] = _masks_to_indices
PREPROCESS["_index_put_impl_"] = _masks_to_indices
