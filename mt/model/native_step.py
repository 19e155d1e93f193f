"""The decoding step in C, and the encoder, for a few rows on x86 CPUs with AVX2: `Transformer.decode_step` (the
target embedding, the decoder layers, the output layer) in one call to native_step.c, fp32 or int8.

Why: a lone sentence's step is some twenty products of one vector with a weight matrix and a hundred small
operations around them. Through PyTorch each costs microseconds of dispatch whatever its size, and its one-row
products read the weights at half the speed the memory allows (docs/performance.md). In C the step costs what
reading its weights costs. It reads its own copy of the decoder's weights, packed in panels of outputs so that a
few rows' sums stay in registers while the weights stream in memory order: one more byte per weight in int8, four in
fp32. Beside the step the library holds beam search's two helpers for a few rows (native_search.c: each row's best
tokens and log-probabilities, the cache rows a step moves; mt/decode/few_rows.py), and the encoder (`mt_encode`):
for a lone sentence PyTorch's encoder likewise spends more time dispatching than multiplying.

`install(model, precision)` (called by `mt.model.fast.for_inference`) swaps `NativeDecodeStep` in for the
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
from mt.model.cache import DecoderCache
from mt.model.transformer import Transformer

SOURCES = [Path(__file__).with_name(name) for name in ("native_step.c", "native_search.c")]
FLAGS = ["-O3", "-mavx2", "-mfma", "-fPIC", "-shared", "-fno-math-errno"]
# int8: sums of four products in one instruction, where PyTorch runs AVX-512 (not under ATEN_CPU_CAPABILITY=avx2)
VNNI_FLAGS = ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni"]
ACTIVATIONS = {"relu": 0, "gelu": 1, "swish": 2}
PER_LAYER = 30  # parameter slots per decoder layer, in native_step.c's order
ENC_PER_LAYER = 20  # and per encoder layer
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
        if (isinstance(module, Transformer) and not isinstance(module.decode_step, NativeDecodeStep)
                and supported(module, precision) and library() is not None):
            module.decode_step = NativeDecodeStep(module, precision,
                                                  max_rows(module, precision, library().instruction_set))
            module.encode = NativeEncode(module, precision, ENCODE_MAX_ROWS)


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


def supported(model: Transformer, precision: str) -> bool:
    """Whether the C step computes this model: on CPU in fp32, its layer norms with one epsilon, and in int8 its
    widths in whole groups of four (the packed weights' groups)."""
    cfg, embed = model.cfg, model.tgt_embed.weight
    return (embed.device.type == "cpu" and embed.dtype == torch.float32 and len(norm_eps(model)) <= 1
            and (precision != "int8" or (cfg.d_model % 4 == 0 and cfg.d_ff % 4 == 0)))


def norm_eps(model: Transformer) -> set[float]:
    return {m.eps for m in model.modules() if isinstance(m, nn.LayerNorm)}


class Layout:
    """The decoder's weights (`part` "decoder") or the encoder's ("encoder") as native_step.c reads them: the
    parameter slots, the sizes, the epsilon and the embedding scale, each tensor pointed into kept alive with this;
    laid out again when the model's weights change (`current`)."""

    def __init__(self, model: Transformer, precision: str, part: str):
        self.model, self.precision, self.part = model, precision, part
        self.panel = library().mt_int8_panel()  # outputs per panel of the packed int8 weights: 8, or 16 with AVX-512
        first = model.decoder[0] if part == "decoder" else model.encoder[0]
        last = model.output if part == "decoder" else model.encoder[-1].ffn.down
        self.watched = (first.self_attn.qkv, last)  # looked up once: a step is microseconds
        self.lay_out()

    def lay_out(self) -> None:
        """Points the C code at the model's weights as they are now (`sources` notes them, to see a change)."""
        model, cfg = self.model, self.model.cfg
        self.keep: list[Tensor] = []  # every tensor the C code points into stays alive with it
        slots = []
        if self.part == "decoder":
            for layer in model.decoder:
                for linear in (layer.self_attn.qkv, layer.self_attn.out, layer.cross_attn.q, layer.cross_attn.out,
                               layer.ffn.up, layer.ffn.down):
                    slots += self.linear(linear)
                for residual in (layer.res_self, layer.res_cross, layer.res_ffn):
                    slots += self.norm(residual.norm)
            slots += [self.kept(model.tgt_embed.weight), self.kept(model.positions)]
            slots += self.norm(model.dec_norm) + self.linear(model.output)
            layers, vocab, expected = cfg.n_dec_layers, cfg.tgt_vocab_size, cfg.n_dec_layers * PER_LAYER + 8
        else:
            for layer in model.encoder:
                for linear in (layer.self_attn.qkv, layer.self_attn.out, layer.ffn.up, layer.ffn.down):
                    slots += self.linear(linear)
                slots += self.norm(layer.res_attn.norm) + self.norm(layer.res_ffn.norm)
            slots += [self.kept(model.src_embed.weight), self.kept(model.positions)] + self.norm(model.enc_norm)
            layers, vocab, expected = cfg.n_enc_layers, cfg.src_vocab_size, cfg.n_enc_layers * ENC_PER_LAYER + 4
        if len(slots) != expected:
            raise RuntimeError(f"the C {self.part}'s parameter slots do not match native_step.c's layout")
        self.params = (ctypes.c_void_p * len(slots))(*slots)
        self.dims = self.kept(torch.tensor([cfg.d_model, cfg.n_heads, cfg.d_ff, layers, vocab, cfg.norm == "pre",
                                            ACTIVATIONS[cfg.activation], self.precision == "int8"], dtype=torch.int64))
        self.eps_scale = self.kept(torch.tensor([next(iter(norm_eps(model)), 1e-5), model.scale], dtype=torch.float32))
        self.sources = self.weights_now()

    def weights_now(self) -> list[tuple[object, int]]:
        """The objects holding the first and the last layers' weights, and where their data lie: what changes when
        the model is converted, moved, shared or loaded again after `for_inference`."""
        found = []
        for layer in self.watched:
            held = layer._packed_params._packed_params if self.precision == "int8" else layer.weight_t
            found.append((held, 0 if self.precision == "int8" else held.data_ptr()))
        return found

    def current(self) -> bool:
        """Whether the laid-out weights are still the model's, laid out again if they can be; False when the model is
        no longer one the C code computes (converted to another dtype, say)."""
        now = self.weights_now()
        if all(a is b and p == q for (a, p), (b, q) in zip(now, self.sources, strict=True)):
            return True
        if not supported(self.model, self.precision):
            return False
        self.lay_out()
        return True

    def kept(self, t: Tensor | None) -> int | None:
        """The address of t's data (None for None), t kept alive as long as this layout."""
        if t is None:
            return None
        t = t.detach().contiguous()
        self.keep.append(t)
        return t.data_ptr()

    def norm(self, norm: nn.Module) -> list[int | None]:
        if isinstance(norm, nn.LayerNorm):
            return [self.kept(norm.weight), self.kept(norm.bias)]
        return [None, None]  # post-norm's final norm is nn.Identity: never read

    def linear(self, layer: nn.Module) -> list[int | None]:
        """A linear layer's four slots (weight, int8 scales, int8 column sums, bias), in native_step.c's layout."""
        if self.precision == "int8":
            weight, scale, sums, bias = int8_packed(layer, self.panel)
            return [self.kept(weight), self.kept(scale), self.kept(sums), self.kept(bias)]
        return [self.kept(f32_packed(layer.weight_t)), None, None, self.kept(layer.bias)]


class NativeDecodeStep:
    """`Transformer.decode_step` through native_step.c for up to `max_rows` rows, the model's own for more."""

    def __init__(self, model: Transformer, precision: str, max_rows: int):
        self.model, self.plain = model, model.decode_step
        self.max_rows, self.precision = max_rows, precision
        self.vocab, self.max_len = model.cfg.tgt_vocab_size, model.cfg.max_len
        lib = library()
        self.step, self.mover, self.top, self.instruction_set = (lib.mt_step, lib.mt_move_rows, lib.mt_top_logprobs,
                                                                 lib.instruction_set)
        self.weights = Layout(model, precision, "decoder")

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
        self.encode = library().mt_encode
        self.weights = Layout(model, precision, "encoder")

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


def f32_packed(weight_t: Tensor) -> Tensor:
    """An fp32 weight, (in, out) as FrozenLinear holds it, as native_step.c multiplies it: panels of 16 outputs, (out
    rounded up to 16 / 16, in, 16), each panel's weights in one run. A copy: the step's products then hold a few rows'
    sums in registers and read the weights in memory order."""
    n_in, out = weight_t.shape
    padded = torch.zeros(n_in, (out + 15) // 16 * 16)
    padded[:, :out] = weight_t
    return padded.view(n_in, -1, 16).transpose(0, 1).contiguous()


def int8_packed(layer: nn.Module, panel: int) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """An int8 layer's weight as native_step.c multiplies it: panels of `panel` outputs, (out rounded up / panel,
    in / 4, panel, 4), four inputs of each output side by side; its scale per output; the sum of each output's
    weights (what an activation's zero point adds to its products), rounded up with zeros; its bias. -128 becomes
    -127, the symmetric range, so that a pair of products stays within int16 in AVX2's vpmaddubsw."""
    weight = layer.weight()  # quantized per output channel, zero point 0
    q = weight.int_repr().clamp_(min=-127)  # (out, in)
    out, n_in = q.shape
    padded = torch.zeros(-(-out // panel) * panel, n_in, dtype=torch.int8)
    padded[:out] = q
    packed = padded.view(-1, panel, n_in // 4, 4).transpose(1, 2).contiguous()  # (out / panel, in / 4, panel, 4)
    sums = padded.sum(dim=1, dtype=torch.int32)
    return packed, weight.q_per_channel_scales().float(), sums, layer.bias()
