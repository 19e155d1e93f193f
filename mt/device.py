"""Where a model runs and in which precision: the one choice training, translation, benchmarks and the CLI share;
and what this CPU multiplies fast, which that choice and the fast paths read."""

from __future__ import annotations

import functools
import os
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from mt.errors import MtError


def cache_dir() -> Path:
    """mt's cache on this machine: `$MT_CACHE`, default ~/.cache/mt (downloads, the C library, kernel choices)."""
    return Path(os.environ.get("MT_CACHE") or Path.home() / ".cache" / "mt").expanduser()


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


def attention_backends(device: torch.device) -> list[SDPBackend] | None:
    """The kernels `F.scaled_dot_product_attention` may choose on `device`; None: all of them (PyTorch's choice).
    On a GPU, every kernel but cuDNN's, which builds an execution plan for each new shape (300-400 ms on an H200),
    and token-budget batches and decoding steps bring new shapes all the time (docs/benchmarks.md)."""
    if device.type != "cuda":
        return None
    return [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def attention_kernels(device: torch.device) -> AbstractContextManager:
    """Attention on `device` restricted to `attention_backends`."""
    backends = attention_backends(device)
    return sdpa_kernel(backends) if backends is not None else nullcontext()


def reads_wait(t: torch.Tensor) -> bool:
    """Whether reading `t`'s values on the host waits for its device to finish all queued work (a GPU's), which
    searches avoid inside their steps; on the CPU a read costs nothing."""
    return t.device.type != "cpu"


def pad_multiple(device: torch.device) -> int:
    """What a training batch's lengths are rounded up to on `device`: 8 on a GPU, where tensor cores take multiples
    of 8 and a few repeated shapes replace a new one per batch; 1 (no rounding) elsewhere."""
    return 8 if device.type == "cuda" else 1


# oneDNN's ISA caps (ONEDNN_MAX_CPU_ISA) below which it has no bf16 multiply, and so emulates it.
NO_BF16_ISAS = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI")


def native_bf16() -> bool:
    """Whether the CPU multiplies bf16 in hardware (AVX-512 BF16 or AMX), at twice or more the fp32 rate; elsewhere
    oneDNN emulates bf16, more slowly than fp32. ATEN_CPU_CAPABILITY=avx2 or ONEDNN_MAX_CPU_ISA=AVX2 make this
    machine choose as an AVX2 one would."""
    flags = cpuinfo("flags").split()
    capped = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper() in NO_BF16_ISAS
    avx512 = torch.backends.cpu.get_cpu_capability() == "AVX512"
    return ("avx512_bf16" in flags or "amx_bf16" in flags) and avx512 and not capped


@functools.cache
def cpuinfo(field: str) -> str:
    """The first value of `field` in /proc/cpuinfo; "" where there is none."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.split(":", 1)[0].strip() == field:
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""
