"""The decoding step in C, for a few rows on x86 CPUs with AVX2: `Transformer.decode_step` (the target embedding,
the decoder layers, the output layer) in one call to native_step.c, fp32 or int8.

Why: a lone sentence's step is some twenty products of one vector with a weight matrix and a hundred small
operations around them. Through PyTorch each costs microseconds of dispatch whatever its size, and its one-row
products read the weights at half the speed the memory allows (docs/performance.md). In C the step costs what
reading its weights costs.

`install(model, precision)` (called by `mt.model.fast.for_inference`) swaps `NativeDecodeStep` in for the
`decode_step` of each Transformer in the model: up to `max_rows` rows it runs the C step, above them, or under
autocast, PyTorch's. The C source is compiled once per machine by the system's C compiler into
`$MT_CACHE/native` (default ~/.cache/mt/native); without a compiler, on a CPU without AVX2 and FMA, or with
`MT_NATIVE=0`, decoding stays in PyTorch. int8 here quantizes each row of activations on its own, symmetric, where
PyTorch's int8 layers scale a whole batch at once: the same weights, slightly different rounding.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import warnings
from pathlib import Path

import torch
from torch import Tensor, nn

from mt.errors import MtError
from mt.model.cache import DecoderCache
from mt.model.transformer import Transformer

SOURCE = Path(__file__).with_name("native_step.c")
FLAGS = ["-O3", "-mavx2", "-mfma", "-fPIC", "-shared", "-fno-math-errno"]
ACTIVATIONS = {"relu": 0, "gelu": 1, "swish": 2}
PER_LAYER = 24  # parameter slots per decoder layer, in native_step.c's order
PRECISIONS = ("fp32", "int8")


def enabled() -> bool:
    """The MT_NATIVE environment variable: 1 (the default) or 0 (decoding stays in PyTorch)."""
    value = os.environ.get("MT_NATIVE", "1")
    if value not in ("0", "1"):
        raise MtError(f"MT_NATIVE={value!r}: set it to 1 (the C decoding step where it runs, the default) or 0")
    return value == "1"


def cpu_has_avx2() -> bool:
    """Whether this CPU runs native_step.c: x86 with AVX2 and FMA (every AVX2 CPU since 2013 has FMA)."""
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return False
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return True  # PyTorch found AVX2 and there is no cpuinfo to ask (macOS): every such CPU has FMA
    return " fma" in flags and " avx2" in flags


@functools.cache
def library() -> ctypes.CDLL | None:
    """native_step.c compiled and loaded, or None where it cannot run (see the module docstring)."""
    if not cpu_has_avx2():
        return None
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    try:
        lib = ctypes.CDLL(str(compiled(compiler)))
    except (OSError, subprocess.CalledProcessError) as e:  # no cache to write, a noexec one, the compiler failed
        detail = e.stderr[-2000:] if isinstance(e, subprocess.CalledProcessError) else e
        warnings.warn(f"mt: no C decoding step ({SOURCE.name}: {detail}); decoding stays in PyTorch", stacklevel=2)
        return None
    pointer, i32 = ctypes.c_void_p, ctypes.c_int
    lib.mt_step.argtypes = [pointer, pointer, pointer, i32, i32, i32, i32, pointer, pointer, pointer, pointer]
    lib.mt_step.restype = i32
    return lib


def compiled(compiler: str) -> Path:
    """The shared library of native_step.c in mt's cache, compiled first if it is not there."""
    key = hashlib.sha256(SOURCE.read_bytes() + " ".join([compiler, *FLAGS]).encode()).hexdigest()[:16]
    folder = Path(os.environ.get("MT_CACHE") or Path.home() / ".cache" / "mt").expanduser() / "native"
    path = folder / f"native_step-{key}.so"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")  # renamed into place: no half-written library
        try:
            subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", str(partial), "-lm"], capture_output=True, text=True,
                           check=True)
            os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)
    return path


def install(model: nn.Module, precision: str) -> None:
    """Swaps `NativeDecodeStep` in for the decoding step of each CPU Transformer in `model` (from
    `for_inference`, fp32 or int8), where the C step runs on this machine."""
    if precision not in PRECISIONS or not enabled():
        return
    for module in model.modules():
        if (isinstance(module, Transformer) and not isinstance(module.decode_step, NativeDecodeStep)
                and supported(module, precision) and library() is not None):
            module.decode_step = NativeDecodeStep(module, precision, max_rows(module, precision))


def max_rows(model: Transformer, precision: str) -> int:
    """Up to how many rows the C step is the faster one (docs/performance.md): 8 in fp32. Its int8 products are bound
    by arithmetic from a few rows on, where PyTorch's int8 matmuls are not: a decoder of a few million weights
    still gains at 4 rows (its PyTorch step is mostly fixed costs), one of tens of millions only at one."""
    if precision == "fp32":
        return 8
    cfg = model.cfg
    weights = cfg.n_dec_layers * (8 * cfg.d_model ** 2 + 2 * cfg.d_model * cfg.d_ff) + cfg.d_model * cfg.tgt_vocab_size
    return 4 if weights <= 12_000_000 else 1  # small preset 4.8M: 1.7-1.9x at 4 rows; base 26M: 0.91-0.94x


def supported(model: Transformer, precision: str) -> bool:
    """Whether the C step computes this model: on CPU in fp32, its layer norms with one epsilon, and in int8 its
    widths in whole groups of four (the packed weights' groups)."""
    cfg, embed = model.cfg, model.tgt_embed.weight
    eps = {m.eps for m in [*model.decoder.modules(), model.dec_norm] if isinstance(m, nn.LayerNorm)}
    return (embed.device.type == "cpu" and embed.dtype == torch.float32 and len(eps) <= 1
            and (precision != "int8" or (cfg.d_model % 4 == 0 and cfg.d_ff % 4 == 0)))


class NativeDecodeStep:
    """`Transformer.decode_step` through native_step.c for up to `max_rows` rows, the model's own for more."""

    def __init__(self, model: Transformer, precision: str, max_rows: int):
        cfg = model.cfg
        self.plain = model.decode_step
        self.max_rows, self.precision = max_rows, precision
        self.vocab, self.max_len = cfg.tgt_vocab_size, cfg.max_len
        self.keep: list[Tensor] = []  # every tensor the C step points into stays alive with it
        slots = []
        for layer in model.decoder:
            for linear in (layer.self_attn.qkv, layer.self_attn.out, layer.cross_attn.q, layer.cross_attn.out,
                           layer.ffn.up, layer.ffn.down):
                slots += self.linear_slots(linear)
            for residual in (layer.res_self, layer.res_cross, layer.res_ffn):
                slots += self.norm_slots(residual.norm)
        slots += [self.kept(model.tgt_embed.weight), self.kept(model.positions)]
        slots += self.norm_slots(model.dec_norm) + self.linear_slots(model.output)
        assert len(slots) == cfg.n_dec_layers * PER_LAYER + 7, "the slots must match native_step.c's layout"
        self.params = (ctypes.c_void_p * len(slots))(*slots)
        eps = next((m.eps for m in [*model.decoder.modules(), model.dec_norm] if isinstance(m, nn.LayerNorm)), 1e-5)
        self.dims = self.kept(torch.tensor([cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.n_dec_layers, cfg.tgt_vocab_size,
                                            cfg.norm == "pre", ACTIVATIONS[cfg.activation], precision == "int8"]))
        self.eps_scale = self.kept(torch.tensor([eps, model.scale], dtype=torch.float32))
        self.step = library().mt_step

    def kept(self, t: Tensor | None) -> int | None:
        """The address of t's data (None for None), t kept alive as long as this step."""
        if t is None:
            return None
        t = t.detach().contiguous()
        self.keep.append(t)
        return t.data_ptr()

    def norm_slots(self, norm: nn.Module) -> list[int | None]:
        if isinstance(norm, nn.LayerNorm):
            return [self.kept(norm.weight), self.kept(norm.bias)]
        return [None, None]  # post-norm's final norm is nn.Identity: never read

    def linear_slots(self, layer: nn.Module) -> list[int | None]:
        """A linear layer's three slots (weight, int8 scales, bias), in native_step.c's layout."""
        if self.precision == "int8":
            weight, scale, bias = int8_packed(layer)
            return [self.kept(weight), self.kept(scale), self.kept(bias)]
        weight_t = layer.weight_t if hasattr(layer, "weight_t") else layer.weight.t()  # (in, out)
        return [self.kept(weight_t), None, self.kept(layer.bias)]

    def __call__(self, tokens: Tensor, cache: DecoderCache) -> tuple[Tensor, DecoderCache]:
        t, rows = cache.length, tokens.size(0)
        buffers = [b for layer in zip(cache.self_k, cache.self_v, cache.mem_k, cache.mem_v, strict=True)
                   for b in layer]
        if (rows > self.max_rows or t >= min(cache.self_k[0].size(0), self.max_len) or tokens.device.type != "cpu"
                or torch.is_autocast_enabled("cpu") or not all(b.is_contiguous() for b in buffers)):
            return self.plain(tokens, cache)  # it also raises the errors of a step past the cache or the positions
        tokens = tokens.long().contiguous()
        src_mask = cache.src_mask.contiguous()
        logits = torch.empty(rows, self.vocab)
        status = self.step(self.dims, self.eps_scale, self.params, rows, t, cache.beam,
                           src_mask.size(-1), tokens.data_ptr(), (ctypes.c_void_p * len(buffers))(
                               *[b.data_ptr() for b in buffers]), src_mask.data_ptr(), logits.data_ptr())
        if status != 0:
            raise MemoryError("the native decoding step could not allocate its working memory")
        return logits, DecoderCache(cache.mem_k, cache.mem_v, cache.self_k, cache.self_v, cache.src_mask, t + 1,
                                    cache.beam)


def int8_packed(layer: nn.Module) -> tuple[Tensor, Tensor, Tensor | None]:
    """An int8 layer's weight as native_step.c multiplies it: (in / 4, out rounded up to 8, 4), four inputs of each
    output side by side; its scale per output; its bias. -128 becomes -127, the symmetric range."""
    weight = layer.weight()  # quantized per output channel, zero point 0
    q = weight.int_repr().clamp_(min=-127)  # (out, in)
    out, n_in = q.shape
    padded = torch.zeros((out + 7) // 8 * 8, n_in, dtype=torch.int8)
    padded[:out] = q
    packed = padded.view(-1, n_in // 4, 4).transpose(0, 1).contiguous()  # (in / 4, out padded, 4)
    return packed, weight.q_per_channel_scales().float(), layer.bias()
