"""Where a model runs and in which precision: the one choice training, translation, benchmarks and the CLI share."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch

from mt.errors import MtError
from mt.linear import native_bf16


def pick_device(name: str) -> torch.device:
    """`auto` is the GPU when one is visible, else the CPU; `cuda` without a GPU is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise MtError("device cuda asked for, but no CUDA device is visible; use auto or cpu")
    return torch.device(name)


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of `precision` on `device`; None means full fp32.

    auto: bf16 on GPUs that have it, else fp16 (with a grad scaler); on a CPU, bf16 where it multiplies bf16 in
    hardware (AVX-512 BF16 or AMX), else fp32, since emulated bf16 is slower than fp32. fp16 runs on a CPU too,
    slowly: it is there to test the GPU's fp16 path (autocast and grad scaler) on any machine.
    """
    if precision == "auto":
        if device.type != "cuda":
            return torch.bfloat16 if native_bf16() else None
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


def autocast(dtype: torch.dtype | None, device: torch.device) -> AbstractContextManager:
    """Mixed precision in `dtype` on `device`, or nothing for fp32."""
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else nullcontext()
