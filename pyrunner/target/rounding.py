"""Rounding float32 values to a storage dtype, as the device stores them (one definition for the
CPU plan executor and the CPU run of the rendered source)."""

from __future__ import annotations

import numpy as np


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """Round float32 values to the storage precision of `dtype`, kept as float32 (bf16: nearest even)."""
    x = np.asarray(x, dtype=np.float32)
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        u = x.view(np.uint32).astype(np.uint64)
        u = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
        return u.view(np.float32)
    return x
