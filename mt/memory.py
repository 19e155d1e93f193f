"""Keep freed CPU memory in the process, so that PyTorch's tensors reuse it rather than fault it in anew.

PyTorch has no caching allocator on CPU: every tensor is a `malloc` and every free a `free`. glibc serves the
large ones (activations, gradients, logits: megabytes each) with `mmap` and returns them to the system when they
are freed, or trims them off the top of its heap, so the next step's tensors of the same sizes come back as fresh
pages that the kernel must fault in and zero. Raising glibc's thresholds (as `mallopt` allows: mmap only above
32 MiB, trim only above 1 GiB of free memory at the top of the heap) keeps those pages for the next step, which
makes training steps and beam search faster (docs/performance.md), for a resident size that stays at its
high-water mark instead of falling between steps.

`MT_MALLOC=default` leaves glibc as it is (benchmarks use it to compare the two side by side). Elsewhere than
glibc (macOS, musl) nothing changes.
"""

from __future__ import annotations

import ctypes
import os
import platform

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
SETTINGS = {M_MMAP_THRESHOLD: 32 << 20, M_TRIM_THRESHOLD: 1 << 30, M_TOP_PAD: 256 << 20}


def keep_freed_memory() -> bool:
    """Set glibc's thresholds as above for this process; whether they were set."""
    if os.environ.get("MT_MALLOC", "keep") == "default" or platform.libc_ver()[0] != "glibc":
        return False
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    return mallopt is not None and all(mallopt(option, value) == 1 for option, value in SETTINGS.items())
