"""The lowering table: importing these modules registers their rules (see registry.py)."""
from . import copy  # noqa: F401
from . import elementwise  # noqa: F401
