"""The bucket policy: which padded size each varying size gets (``torchtpu.set_shape_buckets``).

One policy serves torch.compile's symbolic sizes (plan.py), the eager modes' data-dependent rows (eager_buckets.py)
and their varying inner sizes (eager_symbolic.py). It is the knob ``shape_buckets`` of torchtpu.config; a change
reaches the C++ path through that knob's listeners (eager_buckets.sync).
"""

from __future__ import annotations

from .. import config

_POLICY = config.get("shape_buckets")
# Uploads (x.to("tpu")) of at most this many bytes keep their host copy while sizes are bucketed: a bucketed graph
# that takes one (a batch of a new length) pads it to its bucket's capacity on the host, with no read back.
UPLOAD_HOST_COPY_BYTES = 256 * 1024


def set_shape_buckets(policy) -> None:
    """How symbolic sizes are bucketed: "pow2" (default: the next power of two), a list of increasing sizes (a size
    above the last is its own bucket), or None / "off" (every size is its own program, as before)."""
    if policy is None:
        policy = "off"
    if not isinstance(policy, str):
        policy = ",".join(str(int(s)) for s in policy)
    config.set("shape_buckets", policy)


def _policy_changed(policy) -> None:
    global _POLICY
    _POLICY = policy


config.on_change("shape_buckets", _policy_changed)


def get_shape_buckets():
    return _POLICY


def enabled() -> bool:
    return _POLICY not in ("off", "", "0", "none")


def bucket(n: int) -> int:
    """The padded size of symbolic size n under the current policy."""
    if n <= 1 or not enabled():
        return n
    if _POLICY == "pow2":
        return 1 << (n - 1).bit_length()
    for b in (int(s) for s in _POLICY.split(",")):
        if n <= b:
            return b
    return n


def alone(b: int) -> bool:
    """Whether bucket b holds a single size (0, 1, 2 under "pow2"; a size past the policy's last bucket)."""
    return b <= 2 or bucket(b - 1) != b
