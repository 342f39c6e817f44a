"""The one dtype table: each torch dtype the device holds, its StableHLO element type and its numpy/jax name.

Everything that converts between the three (the StableHLO printer, buffers coming back from PJRT, host
transfers, JAX lowerings) reads this table.
"""

from __future__ import annotations

import numpy as np
import torch

# torch dtype -> (StableHLO element type, numpy dtype name as jax spells it)
_TABLE = {
    torch.float32: ("f32", "float32"),
    torch.float64: ("f64", "float64"),
    torch.float16: ("f16", "float16"),
    torch.bfloat16: ("bf16", "bfloat16"),
    torch.complex64: ("complex<f32>", "complex64"),
    torch.complex128: ("complex<f64>", "complex128"),
    torch.int8: ("i8", "int8"),
    torch.int16: ("i16", "int16"),
    torch.int32: ("i32", "int32"),
    torch.int64: ("i64", "int64"),
    torch.uint8: ("ui8", "uint8"),
    torch.uint16: ("ui16", "uint16"),
    torch.uint32: ("ui32", "uint32"),
    torch.uint64: ("ui64", "uint64"),
    torch.bool: ("i1", "bool"),
}
_FROM_NP = {np_name: dt for dt, (_, np_name) in _TABLE.items()}
_BITS_UINT = {8: torch.uint8, 16: torch.uint16, 32: torch.uint32, 64: torch.uint64}
_COMPONENT = {torch.complex64: torch.float32, torch.complex128: torch.float64}
_COMPLEX_OF = {v: k for k, v in _COMPONENT.items()}


def supported(dtype: torch.dtype) -> bool:
    return dtype in _TABLE


def elem_type(dtype: torch.dtype) -> str:
    try:
        return _TABLE[dtype][0]
    except KeyError:
        raise TypeError(f"dtype {dtype} is not supported on tpu") from None


def from_numpy(np_dtype) -> torch.dtype:
    """torch dtype of a numpy/jax dtype (a jax Array's .dtype)."""
    return _FROM_NP[str(np_dtype)]


def to_numpy(dtype: torch.dtype) -> np.dtype:
    if dtype == torch.bfloat16:
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(_TABLE[dtype][1])


def uint_of_width(dtype: torch.dtype) -> torch.dtype:
    return _BITS_UINT[dtype.itemsize * 8]


def component(dtype: torch.dtype) -> torch.dtype:
    """The real dtype of a complex dtype's parts (float32 for complex64); other dtypes are their own."""
    return _COMPONENT.get(dtype, dtype)


def complex_of(dtype: torch.dtype) -> torch.dtype:
    return _COMPLEX_OF[dtype]
