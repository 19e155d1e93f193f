"""The decoding step in C, and the encoder, for a few rows on x86 CPUs with AVX2: `Transformer.decode_step` (the
target embedding, the decoder layers, the output layer) in one call to native_step.c, fp32 or int8.

Why: a lone sentence's step is some twenty products of one vector with a weight matrix and a hundred small
operations around them. Through PyTorch each costs microseconds of dispatch whatever its size, and its one-row
products read the weights at half the speed the memory allows (docs/performance.md). In C the step costs what
reading its weights costs. It reads its own copy of the decoder's weights, packed in panels of outputs so that a few
rows' sums stay in registers while the weights stream in memory order: one more byte per weight in int8, four in
fp32 (mt/fast/native_layout.py lays them out). Beside the step the library holds the searches' helpers for a few
rows (native_search.c: each row's best tokens and log-probabilities, the cache rows a step moves, a whole greedy
search and a lone sentence's beam search; mt/decode/few_rows.py), and the encoder (`mt_encode`): for a lone
sentence PyTorch's encoder likewise spends more time dispatching than multiplying.

`install(model, precision)` (called by `mt.fast.paths.for_inference`) swaps `NativeDecodeStep` in for the
`decode_step` of each Transformer in the model, and `NativeEncode` for its `encode`, where the model's contract
allows (mt/fast/contract.py): up to as many rows (source positions) as C is measured the faster for on this machine
(mt/fast/choose.py) they run in C, above them, or under autocast, in PyTorch. On several threads C splits the
sentences into a shard a thread, run at once on PyTorch's own OpenMP threads. The C source is compiled once per
machine by the system's C compiler into `$MT_CACHE/native` (default ~/.cache/mt/native): for AVX2, or for AVX-512
with VNNI where PyTorch runs AVX-512 and the CPU has VNNI (int8's sums of four products then take one instruction).
Without a compiler, on a CPU without AVX2 and FMA, or with `MT_NATIVE=0`, decoding stays in PyTorch. int8 here
multiplies the weights PyTorch quantized by activations quantized a row at a time, unsigned with a zero point: to 8
bits with VNNI, to 7 with AVX2, whose pairs of products would otherwise saturate (PyTorch's own int8 layers likewise
keep activations to 7 bits, but scale a whole batch at once): the same weights, slightly different rounding.
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
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch
from torch import Tensor, nn

from mt.data.tokenizer import BOS, EOS, PAD
from mt.device import cache_dir
from mt.errors import MtError
from mt.fast.choose import Kept, measured_limit
from mt.fast.contract import NATIVE_ENCODE, NATIVE_STEP
from mt.fast.native_layout import Layout, Unreadable, supported
from mt.fast.native_rank import NativeRanking
from mt.model.cache import DecoderCache
from mt.model.transformer import Transformer

SOURCES = [Path(__file__).with_name(name) for name in ("native_step.c", "native_search.c")]
# -fopenmp: the shards of a step run on OpenMP's threads, PyTorch's own (its libgomp.so.1 is the one loaded)
FLAGS = ["-O3", "-mavx2", "-mfma", "-fPIC", "-shared", "-fno-math-errno", "-fopenmp"]
# int8: sums of four products in one instruction, where PyTorch runs AVX-512 (not under ATEN_CPU_CAPABILITY=avx2)
VNNI_FLAGS = ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni"]
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


def unavailable() -> str | None:
    """Why this process decodes without the C step, or None where it has it: what `mt bench` says."""
    if not enabled():
        return "MT_NATIVE=0"
    if instruction_set() is None:
        return "a CPU without AVX2 and FMA"
    if not compiler():
        return "no C compiler (cc, gcc or $CC)"
    return None if library() is not None else "its compilation failed (the warning above says why)"


LOCK = threading.Lock()  # one compilation at a time, and one answer, for threads loading models at once


def library() -> ctypes.CDLL | None:
    """native_step.c compiled and loaded, or None where it cannot run (see the module docstring)."""
    with LOCK:
        return load()


def compiler() -> list[str]:
    """The C compiler and its own flags: $CC, else cc or gcc on the PATH; [] where there is none."""
    found = shlex.split(os.environ.get("CC", "")) or [shutil.which("cc") or shutil.which("gcc") or ""]
    return found if found[0] else []


@functools.cache
def load() -> ctypes.CDLL | None:
    isa = instruction_set()
    if isa is None:
        return None
    cc = compiler()
    if not cc:
        warnings.warn("mt: no C compiler (cc, gcc or $CC), so no C decoding step: decoding stays in PyTorch, slower "
                      "for a few sentences; install one (apt-get install gcc) to have it", stacklevel=3)
        return None
    try:
        flags = FLAGS + (VNNI_FLAGS if isa == "AVX-512 VNNI" else [])
        try:
            lib = ctypes.CDLL(str(compiled(cc, flags)))
        except subprocess.CalledProcessError:  # a compiler without OpenMP: the shards then run one after another
            lib = ctypes.CDLL(str(compiled(cc, [f for f in flags if f != "-fopenmp"])))
    except (OSError, subprocess.CalledProcessError) as e:  # no cache to write, a noexec one, the compiler failed
        detail = e.stderr[-2000:] if isinstance(e, subprocess.CalledProcessError) else e
        warnings.warn(f"mt: no C decoding step ({SOURCES[0].name}: {detail}); decoding stays in PyTorch", stacklevel=3)
        return None
    pointer, i32 = ctypes.c_void_p, ctypes.c_int
    lib.mt_step.argtypes = [pointer, pointer, pointer, i32, i32, i32, i32, pointer, pointer, pointer, pointer, i32]
    lib.mt_step.restype = i32
    lib.mt_move_rows.argtypes = [pointer, i32, i32, i32, i32, pointer, pointer, i32]
    lib.mt_move_rows.restype = i32
    lib.mt_top_logprobs.argtypes = [pointer, i32, i32, i32, i32, pointer, pointer, i32]
    lib.mt_top_logprobs.restype = None
    lib.mt_int8_panel.restype = i32
    lib.mt_weight_slots.restype = i32
    lib.mt_weight_names.argtypes = [i32]
    lib.mt_weight_names.restype = ctypes.c_char_p
    lib.mt_encode.argtypes = [pointer, pointer, pointer, i32, i32, pointer, pointer, pointer, i32]
    lib.mt_encode.restype = i32
    lib.mt_greedy.argtypes = [pointer, pointer, pointer, *[i32] * 7, *[pointer] * 6]
    lib.mt_greedy.restype = i32
    lib.mt_beam.argtypes = [pointer, pointer, pointer, *[i32] * 7, ctypes.c_double, i32, pointer, pointer, i32, i32,
                            *[pointer] * 5]
    lib.mt_beam.restype = i32
    lib.instruction_set = isa
    return lib


def compiled(compiler: list[str], flags: list[str]) -> Path:
    """The shared library of native_step.c and native_search.c in mt's cache, compiled with `flags` first if it is
    not there."""
    code = b"".join(source.read_bytes() for source in SOURCES)
    key = hashlib.sha256(code + " ".join([*compiler, *flags]).encode()).hexdigest()[:16]
    folder = cache_dir() / "native"
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
                module.decode_step = NativeDecodeStep(module, precision)
            if NATIVE_ENCODE[precision].declines(module.cfg) is None and not isinstance(module.encode, NativeEncode):
                module.encode = NativeEncode(module, precision)
        except Unreadable:  # a module its contract accepts but of a kind the C code does not read: PyTorch decodes
            continue


def shape_of(model: Transformer, part: str) -> str:
    cfg = model.cfg
    layers, vocab = (cfg.n_dec_layers, cfg.tgt_vocab_size) if part == "decoder" else (cfg.n_enc_layers,
                                                                                        cfg.src_vocab_size)
    return f"{layers} layers of {cfg.d_model}x{cfg.d_ff}, {cfg.n_heads} heads, {cfg.norm}-norm, vocabulary {vocab}"


# Rows timed for the C step's crossover, and source positions (sentences of 16) for the encoder's
STEP_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
ENCODE_POSITIONS = (16, 32, 64, 128, 256, 512, 1024, 2048)


def step_buffers(cache: DecoderCache) -> list[Tensor]:
    """The cache's buffers per layer in native_step.c's order: self-attention keys and values, encoder keys and
    values."""
    return [b for layer in zip(cache.self_k, cache.self_v, cache.mem_k, cache.mem_v, strict=True) for b in layer]


def addresses(tensors: list[Tensor]) -> ctypes.Array:
    """The tensors' data addresses, as the C code takes an array of buffers."""
    return (ctypes.c_void_p * len(tensors))(*[t.data_ptr() for t in tensors])


class NativeDecodeStep:
    """`Transformer.decode_step` through native_step.c for as many rows as it is measured the faster for on this
    machine (`rows_limit`; `max_rows` fixes it), the model's own for more."""

    def __init__(self, model: Transformer, precision: str, max_rows: int | None = None):
        self.model, self.plain = model, model.decode_step
        self.max_rows, self.precision = max_rows, precision
        self.limits = Kept()  # threads → the most rows it takes, measured
        self.vocab, self.max_len = model.cfg.tgt_vocab_size, model.cfg.max_len
        lib = library()
        self.step, self.mover, self.instruction_set = lib.mt_step, lib.mt_move_rows, lib.instruction_set
        self.rank = NativeRanking(lib, self.vocab)  # each row's best next tokens, for the searches
        self.greedy_in_c, self.beam_in_c = lib.mt_greedy, lib.mt_beam
        self.weights = Layout(model, precision, "decoder", lib)

    def __call__(self, tokens: Tensor, cache: DecoderCache) -> tuple[Tensor, DecoderCache]:
        buffers = step_buffers(cache)
        if not self.fits(tokens, cache, buffers):
            return self.plain(tokens, cache)  # it also raises the errors of a step past the cache or the positions
        return self.run(tokens, cache, buffers)

    def run(self, tokens: Tensor, cache: DecoderCache, buffers: list[Tensor]) -> tuple[Tensor, DecoderCache]:
        rows, t = tokens.size(0), cache.length
        # Held in names until C has read them: a temporary's memory is freed as soon as its address is taken.
        ids, src_mask = tokens.long().contiguous(), cache.src_mask.contiguous()
        logits = torch.empty(rows, self.vocab, dtype=torch.float32)
        w = self.weights
        status = self.step(w.dims, w.eps_scale, w.params, rows, t, cache.beam, src_mask.size(-1), ids.data_ptr(),
                           addresses(buffers), src_mask.data_ptr(), logits.data_ptr(), torch.get_num_threads())
        if status == -2:
            return self.plain(tokens, cache)  # a token outside the vocabulary: PyTorch's step says so
        if status != 0:
            raise MemoryError("the C decoding step could not allocate its working memory")
        return logits, DecoderCache(cache.mem_k, cache.mem_v, cache.self_k, cache.self_v, cache.src_mask, t + 1,
                                    cache.beam, self.move_rows)

    def greedy(self, cache: DecoderCache, limits: list[int], min_len: int) -> list[tuple[list[int], float]] | None:
        """`few_greedy`'s search from a fresh `cache` (a row a sentence) in one call into C, which runs the step and
        picks each row's token: each row's tokens and summed log-probability; None where the C step does not take
        these rows (PyTorch's search runs then)."""
        rows, steps = cache.self_k[0].size(1), max(limits)
        buffers = self.searchable(cache, steps)
        if buffers is None or cache.beam != 1:
            return None
        src_mask, held = cache.src_mask.contiguous(), torch.tensor(limits, dtype=torch.long)
        found, lengths = torch.zeros(rows, steps, dtype=torch.long), torch.zeros(rows, dtype=torch.long)
        logprobs = torch.zeros(rows)
        w = self.weights
        status = self.greedy_in_c(w.dims, w.eps_scale, w.params, rows, src_mask.size(-1), steps, self.vocab, min_len,
                                  BOS, EOS, held.data_ptr(), addresses(buffers), src_mask.data_ptr(), found.data_ptr(),
                                  lengths.data_ptr(), logprobs.data_ptr())
        if status != 0:
            raise MemoryError("the C greedy search could not allocate its working memory")
        return [(row[:n], lp) for row, n, lp in zip(found.tolist(), lengths.tolist(), logprobs.tolist(), strict=True)]

    def beam_search(self, cache: DecoderCache, limit: int, len_penalty: float, nbest: int,
                    min_len: int) -> list[tuple[list[int], float, float]] | None:
        """`few_beam_search` of one sentence from a fresh `cache` (its `beam` rows) in one call into C: its `nbest`
        hypotheses, best first, as tokens, score and log-probability; None where the C step does not take it."""
        rows = cache.self_k[0].size(1)
        buffers = self.searchable(cache, limit)
        if buffers is None or cache.beam != rows or cache.mem_k[0].size(0) != 1 or rows > 16 or 2 * rows >= self.vocab:
            return None
        src_mask = cache.src_mask.contiguous()
        found, lengths = torch.zeros(nbest, limit, dtype=torch.long), torch.zeros(nbest, dtype=torch.long)
        scores, logprobs = torch.zeros(nbest, dtype=torch.float64), torch.zeros(nbest, dtype=torch.float64)
        own = cache.self_k + cache.self_v
        w = self.weights
        found_n = self.beam_in_c(w.dims, w.eps_scale, w.params, rows, src_mask.size(-1), limit, self.vocab, min_len,
                                 BOS, EOS, len_penalty, nbest, addresses(buffers), addresses(own), len(own),
                                 own[0][0, 0].numel(), src_mask.data_ptr(), found.data_ptr(), lengths.data_ptr(),
                                 scores.data_ptr(), logprobs.data_ptr())
        if found_n < 0:
            raise MemoryError("the C beam search could not allocate its working memory")
        kept = [t.tolist()[:found_n] for t in (found, lengths, scores, logprobs)]
        return [(row[:n], score, logprob) for row, n, score, logprob in zip(*kept, strict=True)]

    def searchable(self, cache: DecoderCache, steps: int) -> list[Tensor] | None:
        """The step's buffers where the C step takes a whole search of `steps` steps from this fresh cache; else
        None."""
        buffers = step_buffers(cache)
        first = torch.full((cache.self_k[0].size(1),), BOS, dtype=torch.long)
        if cache.length or steps > cache.self_k[0].size(0) or not self.fits(first, cache, buffers):
            return None
        return buffers

    def rows_limit(self) -> int:
        """Up to how many rows the C step takes a step: `max_rows` if set, else as measured on this machine for this
        model at the threads PyTorch runs (mt/fast/choose.py), once."""
        return measured_limit(self.max_rows, self.limits, lambda: "decoding step in C (a shard a thread) or PyTorch, "
                              f"{self.precision}, {shape_of(self.model, 'decoder')}, rows", STEP_ROWS,
                              lambda rows: self.timed(rows, self.plain), lambda rows: self.timed(rows, None))

    def timed(self, rows: int, plain: Callable | None) -> Callable[[], object]:
        """A step of `rows` rows to time, in PyTorch (`plain`) or in C (None): a sentence a row, 16 source positions
        (fewer for a shorter model), 8 target positions decoded before."""
        cfg, g = self.model.cfg, torch.Generator().manual_seed(0)
        positions = min(16, cfg.max_len)
        memory = torch.randn(rows, positions, cfg.d_model, generator=g)
        cache = self.model.start_cache(memory, torch.ones(rows, 1, 1, positions, dtype=torch.bool),
                                       max_steps=positions)
        for buffer in cache.self_k + cache.self_v:
            buffer.normal_(generator=g)
        cache = replace(cache, length=positions // 2)
        tokens = torch.full((rows,), min(4, self.vocab - 1))
        if plain is not None:
            return lambda: plain(tokens, cache)
        buffers = step_buffers(cache)
        return lambda: self.run(tokens, cache, buffers)

    def move_rows(self, cache: DecoderCache, to: list[int], sources: list[int]) -> None:
        """`DecoderCache.select`'s copies of the rows beam search moves, in place, in one call into C: a few rows of
        each self-attention buffer at every filled position, as the C step left them (fp32, contiguous)."""
        buffers = cache.self_k + cache.self_v
        rows, length = buffers[0].size(1), cache.length
        if len(to) != len(sources) or not all(0 <= r < rows for r in to + sources):
            raise IndexError(f"beam search moved rows {sources} to {to}: not one source per row, or outside the "
                             f"cache's {rows} rows")
        rows_of = ctypes.c_int64 * len(to)
        if self.mover(addresses(buffers), len(buffers), length, rows, buffers[0][0, 0].numel(), rows_of(*to),
                      rows_of(*sources), len(to)) != 0:
            raise MemoryError("the C decoding step could not allocate its working memory")

    def fits(self, tokens: Tensor, cache: DecoderCache, buffers: list[Tensor]) -> bool:
        """Whether the C step takes this step: few enough rows on CPU, outside autocast, within the cache and the
        positions, every buffer fp32 and contiguous in the shapes it reads, the weights still laid out."""
        rows, t, k = tokens.size(0), cache.length, cache.self_k[0]
        if (rows > self.rows_limit() or tokens.device.type != "cpu" or torch.is_autocast_enabled("cpu")
                or t >= min(k.size(0), self.max_len) or k.size(1) != rows
                or cache.mem_k[0].size(0) * cache.beam != rows or cache.src_mask.dtype != torch.bool):
            return False
        return all(b.dtype == torch.float32 and b.is_contiguous() for b in buffers) and self.weights.current()


class NativeEncode:
    """`Transformer.encode` through native_step.c for batches of as many source positions as it is measured the
    faster for on this machine (`positions_limit`; `max_rows` fixes it), the model's own for more."""

    def __init__(self, model: Transformer, precision: str, max_rows: int | None = None):
        self.model, self.plain, self.max_rows, self.precision = model, model.encode, max_rows, precision
        self.limits = Kept()  # threads → the most source positions it takes, measured
        lib = library()
        self.encode = lib.mt_encode
        self.weights = Layout(model, precision, "encoder", lib)

    def __call__(self, src: Tensor) -> tuple[Tensor, Tensor]:
        n, s = src.shape
        if (src.device.type != "cpu" or s > self.model.cfg.max_len or self.model.training
                or torch.is_autocast_enabled("cpu") or n * s > self.positions_limit() or not self.weights.current()):
            return self.plain(src)
        return self.run(src)

    def run(self, src: Tensor) -> tuple[Tensor, Tensor]:
        n, s = src.shape
        ids, src_mask = src.long().contiguous(), (src != PAD)[:, None, None, :]  # held while C reads them
        memory = torch.empty(n, s, self.model.cfg.d_model)
        w = self.weights
        status = self.encode(w.dims, w.eps_scale, w.params, n, s, ids.data_ptr(), src_mask.data_ptr(),
                             memory.data_ptr(), torch.get_num_threads())
        if status == -2:
            return self.plain(src)  # a token outside the vocabulary: PyTorch's embedding says so
        if status != 0:
            raise MemoryError("the C encoder could not allocate its working memory")
        return memory, src_mask

    def positions_limit(self) -> int:
        """Up to how many source positions (sentences x length) the C encoder takes a batch: `max_rows` if set, else
        as measured on this machine for this model at the threads PyTorch runs (C's shards run on as many), once."""
        return measured_limit(self.max_rows, self.limits, lambda: "encoder in C (a shard a thread) or PyTorch, "
                              f"{self.precision}, {shape_of(self.model, 'encoder')}, source positions",
                              ENCODE_POSITIONS,
                              lambda n: self.timed(n, self.plain), lambda n: self.timed(n, self.run))

    def timed(self, positions: int, encode: Callable[[Tensor], object]) -> Callable[[], object]:
        """An encoding of `positions` source positions to time: sentences of 16 (fewer for a shorter model)."""
        cfg = self.model.cfg
        length = min(16, cfg.max_len, positions)
        src = torch.randint(4, max(5, cfg.src_vocab_size), (max(1, positions // length), length),
                            generator=torch.Generator().manual_seed(0)) % cfg.src_vocab_size
        return lambda: encode(src)
