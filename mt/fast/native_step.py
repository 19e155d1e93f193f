"""The decoding step in C, and the encoder, for a few rows on x86 CPUs with AVX2: `Transformer.decode_step` (the
target embedding, the decoder layers, the output layer) in one call to native_step.c, fp32 or int8.

Why: a lone sentence's step is some twenty products of one vector with a weight matrix and a hundred small
operations around them. Through PyTorch each costs microseconds of dispatch whatever its size, and its one-row
products read the weights at half the speed the memory allows (docs/performance.md). In C the step costs what
reading its weights costs. It reads its own copy of the decoder's weights, packed in panels of outputs so that a few
rows' sums stay in registers while the weights stream in memory order: one more byte per weight in int8, four in
fp32 (mt/fast/native_layout.py lays them out). Beside the step the library holds beam search's two helpers for a
few rows (native_search.c: each row's best tokens and log-probabilities, the cache rows a step moves;
mt/decode/few_rows.py), and the encoder (`mt_encode`): for a lone sentence PyTorch's encoder likewise spends more
time dispatching than multiplying.

`install(model, precision)` (called by `mt.fast.paths.for_inference`) swaps `NativeDecodeStep` in for the
`decode_step` of each Transformer in the model, and `NativeEncode` for its `encode`: up to `max_rows` rows (source
positions) they run in C, above them, or under autocast, in PyTorch. The C source is compiled once per machine by
the system's C compiler into `$MT_CACHE/native` (default ~/.cache/mt/native): for AVX2, or for AVX-512 with VNNI
where PyTorch runs AVX-512 and the CPU has VNNI (int8's sums of four products then take one instruction). Without
a compiler, on a CPU without AVX2 and FMA, or with `MT_NATIVE=0`, decoding stays in PyTorch. int8 here multiplies
the weights PyTorch quantized by activations quantized a row at a time, unsigned with a zero point: to 8 bits with
VNNI, to 7 with AVX2, whose pairs of products would otherwise saturate (PyTorch's own int8 layers likewise keep
activations to 7 bits, but scale a whole batch at once): the same weights, slightly different rounding.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
import warnings
from pathlib import Path

import torch
from torch import Tensor, nn

from mt.data.tokenizer import PAD
from mt.errors import MtError
from mt.fast.contract import NATIVE_ENCODE, NATIVE_STEP
from mt.fast.native_layout import Layout, Unreadable, supported
from mt.model.cache import DecoderCache
from mt.model.transformer import Transformer

SOURCES = [Path(__file__).with_name(name) for name in ("native_step.c", "native_search.c")]
FLAGS = ["-O3", "-mavx2", "-mfma", "-fPIC", "-shared", "-fno-math-errno"]
# int8: sums of four products in one instruction, where PyTorch runs AVX-512 (not under ATEN_CPU_CAPABILITY=avx2)
VNNI_FLAGS = ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni"]
# Source positions (sentences x length) up to which the C encoder is the faster, on one of PyTorch's threads and on
# more (the C encoder runs on one): 8 sentences, or a lone one (docs/performance.md)
ENCODE_MAX_ROWS, ENCODE_MAX_ROWS_THREADED = 256, 32
PRECISIONS = ("fp32", "int8")
STALE_DAYS = 30  # a library of another source or flags built this long ago goes when a new one is built


def enabled() -> bool:
    """The MT_NATIVE environment variable: 1 (the default) or 0 (decoding stays in PyTorch)."""
    value = os.environ.get("MT_NATIVE", "1")
    if value not in ("0", "1"):
        raise MtError(f"MT_NATIVE={value!r}: set it to 1 (the C decoding step where it runs, the default) or 0")
    return value == "1"


def instruction_set() -> str | None:
    """What native_step.c is built for on this CPU: "AVX-512 VNNI" or "AVX2" (with FMA, which every AVX2 CPU since
    2013 has), as far as PyTorch's own capability goes; None on other CPUs."""
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in ("AVX2", "AVX512"):
        return None
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return "AVX2"  # PyTorch found AVX2 and there is no cpuinfo to ask (macOS)
    if not {"avx2", "fma"} <= flags:
        return None
    return "AVX-512 VNNI" if capability == "AVX512" and {"avx512_vnni", "avx512vl", "avx512bw"} <= flags else "AVX2"


LOCK = threading.Lock()  # one compilation at a time, and one answer, for threads loading models at once


def library() -> ctypes.CDLL | None:
    """native_step.c compiled and loaded, or None where it cannot run (see the module docstring)."""
    with LOCK:
        return load()


@functools.cache
def load() -> ctypes.CDLL | None:
    isa = instruction_set()
    if isa is None:
        return None
    compiler = shlex.split(os.environ.get("CC", "")) or [shutil.which("cc") or shutil.which("gcc") or ""]
    if not compiler[0]:
        return None
    try:
        lib = ctypes.CDLL(str(compiled(compiler, FLAGS + (VNNI_FLAGS if isa == "AVX-512 VNNI" else []))))
    except (OSError, subprocess.CalledProcessError) as e:  # no cache to write, a noexec one, the compiler failed
        detail = e.stderr[-2000:] if isinstance(e, subprocess.CalledProcessError) else e
        warnings.warn(f"mt: no C decoding step ({SOURCES[0].name}: {detail}); decoding stays in PyTorch", stacklevel=3)
        return None
    pointer, i32 = ctypes.c_void_p, ctypes.c_int
    lib.mt_step.argtypes = [pointer, pointer, pointer, i32, i32, i32, i32, pointer, pointer, pointer, pointer]
    lib.mt_step.restype = i32
    lib.mt_move_rows.argtypes = [pointer, i32, i32, i32, i32, pointer, pointer, i32]
    lib.mt_move_rows.restype = i32
    lib.mt_top_logprobs.argtypes = [pointer, i32, i32, i32, i32, pointer, pointer]
    lib.mt_top_logprobs.restype = None
    lib.mt_int8_panel.restype = i32
    lib.mt_weight_slots.restype = i32
    lib.mt_weight_names.argtypes = [i32]
    lib.mt_weight_names.restype = ctypes.c_char_p
    lib.mt_encode.argtypes = [pointer, pointer, pointer, i32, i32, pointer, pointer, pointer]
    lib.mt_encode.restype = i32
    lib.instruction_set = isa
    return lib


def compiled(compiler: list[str], flags: list[str]) -> Path:
    """The shared library of native_step.c and native_search.c in mt's cache, compiled with `flags` first if it is
    not there."""
    code = b"".join(source.read_bytes() for source in SOURCES)
    key = hashlib.sha256(code + " ".join([*compiler, *flags]).encode()).hexdigest()[:16]
    folder = Path(os.environ.get("MT_CACHE") or Path.home() / ".cache" / "mt").expanduser() / "native"
    path = folder / f"native_step-{key}.so"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(dir=folder, prefix=path.name, suffix=".partial")  # renamed into place
        os.close(handle)
        partial = Path(name)
        try:
            subprocess.run([*compiler, *flags, *map(str, SOURCES), "-o", str(partial), "-lm"], capture_output=True,
                           text=True, check=True)
            os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)
        remove_stale(folder, path)
    return path


def remove_stale(folder: Path, kept: Path) -> None:
    """Removes the libraries in `folder` other than `kept` built over STALE_DAYS ago: every revision of the sources
    leaves one behind (tens of KB), and one still wanted is built again in a second."""
    cutoff = time.time() - STALE_DAYS * 86400
    for old in folder.glob("native_step-*.so"):
        try:
            if old != kept and old.stat().st_mtime < cutoff:
                old.unlink()
        except OSError:  # gone already, or not this user's to remove
            pass


def install(model: nn.Module, precision: str) -> None:
    """Swaps `NativeDecodeStep` in for the decoding step of each CPU Transformer in `model` (from
    `for_inference`, fp32 or int8), where the C step runs on this machine."""
    if precision not in PRECISIONS or not enabled():
        return
    for module in model.modules():
        if not isinstance(module, Transformer) or not supported(module) or library() is None:
            continue
        try:
            if NATIVE_STEP[precision].declines(module.cfg) is None and not isinstance(module.decode_step,
                                                                                    NativeDecodeStep):
                module.decode_step = NativeDecodeStep(module, precision,
                                                      max_rows(module, precision, library().instruction_set))
            if NATIVE_ENCODE[precision].declines(module.cfg) is None and not isinstance(module.encode, NativeEncode):
                module.encode = NativeEncode(module, precision, ENCODE_MAX_ROWS)
        except Unreadable:  # a module its contract accepts but of a kind the C code does not read: PyTorch decodes
            continue


def max_rows(model: Transformer, precision: str, instruction_set: str) -> int:
    """Up to how many rows the C step is the faster one (docs/performance.md): 8 in fp32. In int8 with AVX-512 VNNI
    16; with AVX2 its int8 products are bound by arithmetic from a few rows on, where PyTorch's int8 matmuls are
    not: a decoder of a few million weights still gains at 8 rows (its PyTorch step is mostly fixed costs), one of
    tens of millions up to 4."""
    if precision == "fp32":
        return 8
    if instruction_set == "AVX-512 VNNI":
        return 16  # 64 products an instruction: base's 26M weights still 1.2x at 16 rows, level at 32
    cfg = model.cfg
    # a step's weights: per layer self-attention's 4 d^2, cross-attention's query and output 2 d^2, the FFN's 2 d d_ff
    weights = cfg.n_dec_layers * (6 * cfg.d_model ** 2 + 2 * cfg.d_model * cfg.d_ff) + cfg.d_model * cfg.tgt_vocab_size
    return 8 if weights <= 12_000_000 else 4  # small preset 4.8M: 1.7-2.3x at 8 rows; base 26M: 1.1-1.2x at 4, <1 at 6


class NativeDecodeStep:
    """`Transformer.decode_step` through native_step.c for up to `max_rows` rows, the model's own for more."""

    def __init__(self, model: Transformer, precision: str, max_rows: int):
        self.model, self.plain = model, model.decode_step
        self.max_rows, self.precision = max_rows, precision
        self.vocab, self.max_len = model.cfg.tgt_vocab_size, model.cfg.max_len
        lib = library()
        self.step, self.mover, self.top, self.instruction_set = (lib.mt_step, lib.mt_move_rows, lib.mt_top_logprobs,
                                                                 lib.instruction_set)
        self.weights = Layout(model, precision, "decoder", lib)

    def __call__(self, tokens: Tensor, cache: DecoderCache) -> tuple[Tensor, DecoderCache]:
        buffers = [b for layer in zip(cache.self_k, cache.self_v, cache.mem_k, cache.mem_v, strict=True)
                   for b in layer]  # per layer, in native_step.c's order
        if not self.fits(tokens, cache, buffers):
            return self.plain(tokens, cache)  # it also raises the errors of a step past the cache or the positions
        rows, t = tokens.size(0), cache.length
        # Held in names until C has read them: a temporary's memory is freed as soon as its address is taken.
        ids, src_mask = tokens.long().contiguous(), cache.src_mask.contiguous()
        logits = torch.empty(rows, self.vocab, dtype=torch.float32)
        w = self.weights
        status = self.step(w.dims, w.eps_scale, w.params, rows, t, cache.beam, src_mask.size(-1), ids.data_ptr(),
                           (ctypes.c_void_p * len(buffers))(*[b.data_ptr() for b in buffers]), src_mask.data_ptr(),
                           logits.data_ptr())
        if status == -2:
            return self.plain(tokens, cache)  # a token outside the vocabulary: PyTorch's step says so
        if status != 0:
            raise MemoryError("the C decoding step could not allocate its working memory")
        return logits, DecoderCache(cache.mem_k, cache.mem_v, cache.self_k, cache.self_v, cache.src_mask, t + 1,
                                    cache.beam, self.move_rows)

    def top_logprobs(self, logits: Tensor, width: int,
                     barred: int | None = None) -> tuple[list[list[float]], list[list[int]]]:
        """Each row's `width` most likely tokens other than `barred`, best first, and their log-probabilities
        (log-softmax over the whole row), in one call into C: what beam search over a few rows ranks
        (mt/decode/few_rows.py)."""
        if width < 1 or logits.dim() != 2 or logits.device.type != "cpu":
            raise ValueError(f"the C ranking takes CPU logits (rows, vocabulary) and width >= 1, not "
                             f"{tuple(logits.shape)} on {logits.device} and width {width}")
        logits = logits.float().contiguous()
        rows, vocab = logits.shape
        values, tokens = (ctypes.c_float * (rows * width))(), (ctypes.c_int64 * (rows * width))()
        self.top(logits.data_ptr(), rows, vocab, width, -1 if barred is None else barred, values, tokens)
        return ([values[r * width:(r + 1) * width] for r in range(rows)],
                [tokens[r * width:(r + 1) * width] for r in range(rows)])

    def move_rows(self, cache: DecoderCache, to: list[int], sources: list[int]) -> None:
        """`DecoderCache.select`'s copies of the rows beam search moves, in place, in one call into C: a few rows of
        each self-attention buffer at every filled position, as the C step left them (fp32, contiguous)."""
        buffers = cache.self_k + cache.self_v
        rows, length = buffers[0].size(1), cache.length
        if len(to) != len(sources) or not all(0 <= r < rows for r in to + sources):
            raise IndexError(f"beam search moved rows {sources} to {to}: not one source per row, or outside the "
                             f"cache's {rows} rows")
        pointers = (ctypes.c_void_p * len(buffers))(*[b.data_ptr() for b in buffers])
        rows_of = ctypes.c_int64 * len(to)
        if self.mover(pointers, len(buffers), length, rows, buffers[0][0, 0].numel(), rows_of(*to), rows_of(*sources),
                      len(to)) != 0:
            raise MemoryError("the C decoding step could not allocate its working memory")

    def fits(self, tokens: Tensor, cache: DecoderCache, buffers: list[Tensor]) -> bool:
        """Whether the C step takes this step: few enough rows on CPU, outside autocast, within the cache and the
        positions, every buffer fp32 and contiguous in the shapes it reads, the weights still laid out."""
        rows, t, k = tokens.size(0), cache.length, cache.self_k[0]
        if (rows > self.max_rows or tokens.device.type != "cpu" or torch.is_autocast_enabled("cpu")
                or t >= min(k.size(0), self.max_len) or k.size(1) != rows
                or cache.mem_k[0].size(0) * cache.beam != rows or cache.src_mask.dtype != torch.bool):
            return False
        return all(b.dtype == torch.float32 and b.is_contiguous() for b in buffers) and self.weights.current()


class NativeEncode:
    """`Transformer.encode` through native_step.c for batches of up to `max_rows` source positions, the model's own
    for more."""

    def __init__(self, model: Transformer, precision: str, max_rows: int):
        self.model, self.plain, self.max_rows = model, model.encode, max_rows
        lib = library()
        self.encode = lib.mt_encode
        self.weights = Layout(model, precision, "encoder", lib)

    def __call__(self, src: Tensor) -> tuple[Tensor, Tensor]:
        n, s = src.shape
        limit = self.max_rows if torch.get_num_threads() == 1 else min(self.max_rows, ENCODE_MAX_ROWS_THREADED)
        if (n * s > limit or src.device.type != "cpu" or s > self.model.cfg.max_len or self.model.training
                or torch.is_autocast_enabled("cpu") or not self.weights.current()):
            return self.plain(src)
        ids, src_mask = src.long().contiguous(), (src != PAD)[:, None, None, :]  # held while C reads them
        memory = torch.empty(n, s, self.model.cfg.d_model)
        w = self.weights
        status = self.encode(w.dims, w.eps_scale, w.params, n, s, ids.data_ptr(), src_mask.data_ptr(),
                             memory.data_ptr())
        if status == -2:
            return self.plain(src)  # a token outside the vocabulary: PyTorch's embedding says so
        if status != 0:
            raise MemoryError("the C encoder could not allocate its working memory")
        return memory, src_mask
