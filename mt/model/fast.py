"""The fast paths: faster kernels swapped into the plain model of mt/model/transformer.py,
for training and for decoding.

`for_training(model)` and `for_inference(model, precision)` each swap layers or kernels of a built model in place
and return it; parameters and state dict stay those of the plain model, so checkpoints are the same either way.
Every fast path keeps to where it is the faster kernel (mostly fp32 on CPU, outside autocast and
torch.compile) and runs the plain kernel everywhere else; tests/model/test_fast.py checks that each one computes what
the plain path computes. docs/performance.md tells what each one gains.

Training (`for_training`):
- `mt.model.fast_linear.Linear`: fp32 CPU matmuls through oneDNN, which uses AVX-512 where MKL does not
  (non-Intel CPUs).
- `mt.model.fast_dropout.Dropout`: CPU dropout masks from 16-bit random integers, where `F.dropout` draws them slowly.
- `cpu_training_attention`: attention in plain matmuls where PyTorch's fused CPU kernel is the slower one.
- `mt.model.fast_loss.output_loss`: the output layer and the loss fused, a block of rows at a time, never all the
  logits.
- `mt.model.fast_packed.packed_loss`: the layers on a batch's real tokens only, padded out around attention.
Decoding (`for_inference`):
- `FrozenLinear`: weights stored transposed, the layout MKL runs fastest for decoding's small batches, and packed
  once in oneDNN's layout where oneDNN takes the product; dropout modules, which do nothing in eval mode, dropped.
- `matmul_attention` in decoding steps: for a step's few queries, plain matmuls beat the fused kernel.
- int8 (a precision, not only a fast path): dynamically quantized linears (`Int8Linear`), the output layer too, a
  scale per output channel.
- `compile_decoding` (opt-in, `--compile`): the decoding step compiled by torch.compile, its small ops fused, for
  a few rows.
- `mt.model.native_step.NativeDecodeStep`: on x86 CPUs with AVX2, the whole decoding step in C for up to a few
  rows (a lone sentence, a small beam), fp32 or int8; `NativeEncode` beside it, the encoder for a few sentences.

Switches (environment variables):
- `MT_FAST=0` turns every fast path off: `for_training` returns the plain model, and `for_inference` only
  applies int8 quantization when that precision is asked for. `MT_FAST=1` (the default) turns them on.
- `MT_NATIVE=0` keeps decoding in PyTorch, without the C step.
- `MT_CPU_MATMUL=mkl|onednn|auto` chooses the fp32 CPU matmul kernel of the fast linears (see mt/model/fast_linear.py).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable

import torch
from torch import Tensor, nn

import mt.model.fast_loss
import mt.model.fast_packed
import mt.model.native_step
from mt.errors import MtError
from mt.model.fast_dropout import Dropout, dropout
from mt.model.fast_linear import (
    MKL_NARROWING_FROM_ROWS,
    Linear,
    onednn_min_rows,
    onednn_mm,
    onednn_pays,
    onednn_trains,
    pack_for_onednn,
    prefers_onednn,
    use_onednn,
)
from mt.model.transformer import CrossAttention, SelfAttention, Transformer, attention

PRECISIONS = ("fp32", "bf16", "int8")


def enabled() -> bool:
    """Whether the fast paths are on: the MT_FAST environment variable, 1 (the default) or 0."""
    value = os.environ.get("MT_FAST", "1")
    if value not in ("0", "1"):
        raise MtError(f"MT_FAST={value!r}: set it to 1 (fast paths on, the default) or 0 (off)")
    return value == "1"


def for_training(model: nn.Module) -> nn.Module:
    """The model to train, with the training fast paths swapped in (see the module docstring), in place.

    Call it before wrapping the model (DDP, torch.compile). The parameters stay the same objects, so an optimizer
    built before or after sees the same ones, and tied weights stay tied."""
    if not enabled():
        return model

    def fast(child: nn.Module) -> nn.Module | None:
        if type(child) is nn.Linear:
            return relinked(child, Linear)
        if type(child) is nn.Dropout:
            return Dropout(child.p).train(child.training)
        return None

    swap_children(model, fast)
    set_attention(model, cpu_training_attention, matmul_attention)
    for module in model.modules():
        if isinstance(module, Transformer):
            module.output_loss = mt.model.fast_loss.output_loss
            module.teacher_forced_loss = mt.model.fast_packed.packed_loss
    return model


def for_inference(model: nn.Module, precision: str) -> nn.Module:
    """The model to decode with, in eval mode and changed in place (it can no longer be trained): its linear
    layers frozen (`FrozenLinear`), or int8 dynamically quantized, its dropouts dropped, and plain-matmul attention
    in decoding steps.

    int8 quantizes every linear layer's weights once, a scale per output channel, and each activation on the fly
    (CPU only), at a small cost in BLEU (measure it with `mt evaluate`). Each activation's scale spans the whole batch
    (a row, in the C step of a few rows), so an int8 translation may change slightly with the sentences batched
    beside it; fp32 translates a sentence the same alone or in any batch.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    fast = enabled()
    if precision == "int8":
        model = quantize_int8(model)
    if fast:
        swap_children(model, frozen)
        set_attention(model, attention, matmul_attention)
        mt.model.native_step.install(model, precision)
    return model.eval()


def frozen(child: nn.Module) -> nn.Module | None:
    """What `for_inference` swaps in for a layer: `FrozenLinear` for a linear one, nothing for a dropout (a call
    that does nothing in eval mode still costs a lone sentence's step time)."""
    if type(child) in (nn.Linear, Linear):
        return FrozenLinear(child)
    if isinstance(child, nn.Dropout):
        return nn.Identity()
    return None


def fast_paths(model: nn.Module) -> list[str]:
    """The fast paths in `model` as `for_training` or `for_inference` left it, by name, with the kernel each chose on
    this machine: what `mt bench` reports it ran. [] for a plain model."""
    kinds = {type(module) for module in model.modules()}
    layers = [m for m in model.modules() if isinstance(m, (SelfAttention, CrossAttention))]
    found = []
    if Linear in kinds:
        found.append(f"linear: {'oneDNN' if onednn_trains() else 'MKL'} fp32 matmuls")
    if FrozenLinear in kinds:
        found.append("linear: frozen, weights transposed" + (", packed for oneDNN" if use_onednn() else ""))
        narrowing = MKL_NARROWING_FROM_ROWS.get(torch.backends.cpu.get_cpu_capability())
        if use_onednn() and narrowing:
            found.append(f"linear: large down-projections through MKL from {narrowing} rows")
    if quantized(model):
        found.append("linear: int8 per output channel, dynamically quantized")
    if Dropout in kinds:
        found.append("dropout: 16-bit masks")
    if layers and layers[0].attend is cpu_training_attention:
        found.append("attention: matmuls where the fused CPU kernel is slower")
    if layers and layers[0].attend_step is matmul_attention:
        found.append("attention in decoding steps: matmuls")
    if any(getattr(m, "output_loss", None) is mt.model.fast_loss.output_loss for m in model.modules()):
        found.append("loss: fused with the output layer")
    if any(getattr(m, "teacher_forced_loss", None) is mt.model.fast_packed.packed_loss for m in model.modules()):
        found.append("padding: skipped outside attention")
    step = next((m.step_layers for m in model.modules()
                 if isinstance(getattr(m, "step_layers", None), FewRowsCompiled)), None)
    if step is not None:
        found.append("decoding step: compiled" + (f" below {step.rows} rows" if step.rows else ""))
    native = next((m.decode_step for m in model.modules()
                   if isinstance(getattr(m, "decode_step", None), mt.model.native_step.NativeDecodeStep)), None)
    if native is not None:
        found.append(f"decoding step: C ({native.instruction_set}), {native.precision}, up to {native.max_rows} row"
                     + ("s" if native.max_rows > 1 else ""))
    encoder = next((m.encode for m in model.modules()
                    if isinstance(getattr(m, "encode", None), mt.model.native_step.NativeEncode)), None)
    if encoder is not None:
        found.append(f"encoder: C, up to {encoder.max_rows} source positions "
                     f"({mt.model.native_step.ENCODE_MAX_ROWS_THREADED} on more than one thread)")
    return found


def compile_decoding(model: nn.Module) -> nn.Module:
    """The model with each Transformer's decoding step (`step_layers`: the decoder layers, not the output layer)
    compiled by torch.compile, in place, for the few rows where it pays. A step runs dozens of small ops whose
    fixed costs outweigh their work on a few rows, and compiled they are fused: a lone sentence, a small beam. On
    CPU the compiled step multiplies through PyTorch's own kernel, so from the rows where eager decoding takes
    oneDNN's faster one for the layers' largest weight (`onednn_min_rows`) the step stays eager
    (`FewRowsCompiled`), and the output layer, the largest product, always does (docs/performance.md). The first
    steps of each new kind of shape compile (`mt.decode.translate.compiled` runs them at load). An int8 model stays
    eager: PyTorch's quantized layers break the compiled graph at each one, and compiled its step ran slower."""
    if quantized(model):
        return model
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    # Inductor picks its CPU vector width by ATEN_CPU_CAPABILITY but caches the code it writes without it: code
    # written under another setting then runs at the wrong width, out of bounds. Named, the width keys the cache.
    options = {"cpp.simdlen": pick_vec_isa().bit_width()}
    on_cpu = all(t.device.type == "cpu" for t in [*model.parameters(), *model.buffers()])
    for module in model.modules():
        if isinstance(module, Transformer):
            largest = max((m.weight_t.numel() for m in module.decoder.modules() if isinstance(m, FrozenLinear)),
                          default=0)
            rows = onednn_min_rows(largest) if on_cpu and largest else None
            step = torch.compile(module.step_layers, dynamic=True, fullgraph=True, options=options)
            module.step_layers = FewRowsCompiled(module.step_layers, step, rows)
    return model


class FewRowsCompiled:
    """A decoding step (`Transformer.step_layers`) compiled for fewer than `rows` rows (any number, when None) and
    eager for more."""

    def __init__(self, eager: Callable[..., Tensor], compiled: Callable[..., Tensor], rows: int | None):
        self.eager, self.compiled, self.rows = eager, compiled, rows

    def __call__(self, x: Tensor, *rest) -> Tensor:
        if self.rows is None or x.size(0) < self.rows:
            return self.compiled(x, *rest)
        return self.eager(x, *rest)


def quantized(model: nn.Module) -> bool:
    """Whether the model has int8 layers (`quantize_int8`)."""
    return any(isinstance(m, torch.ao.nn.quantized.dynamic.Linear) for m in model.modules())


def quantize_int8(model: nn.Module) -> nn.Module:
    """The model with every linear layer dynamically quantized to int8, in place.

    Each output channel (a row of the weight) gets its own scale: the output layer's rows are the target pieces'
    embeddings, whose norms differ by piece, and one scale for all of them cost BLEU (docs/performance.md)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization announces its successor; it still works
        linears = {name for name, m in model.named_modules() if isinstance(m, nn.Linear)}
        for name in linears:  # the quantizer takes nn.Linear itself, not subclasses like mt.model.fast_linear's Linear
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, relinked(model.get_submodule(name), nn.Linear))
        per_channel = torch.ao.quantization.per_channel_dynamic_qconfig
        return torch.ao.quantization.quantize_dynamic(model, dict.fromkeys(linears, per_channel),
                                                      mapping={nn.Linear: Int8Linear}, inplace=True)


class Int8Linear(torch.ao.nn.quantized.dynamic.Linear):
    """PyTorch's dynamically quantized linear layer, calling its kernel directly: the layer's own forward checks its
    dtype and version and copies the output on every call, a fixed cost that a lone sentence pays on every product
    (docs/performance.md)."""

    def forward(self, x: Tensor) -> Tensor:
        return torch.ops.quantized.linear_dynamic(x, self._packed_params._packed_params, reduce_range=True)


def swap_children(model: nn.Module, swap: Callable[[nn.Module], nn.Module | None]) -> None:
    """Replaces, in place, every submodule `child` of the model for which `swap(child)` returns a module."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            new = swap(child)
            if new is not None:
                setattr(module, name, new)


def relinked(layer: nn.Linear, cls: type[nn.Linear]) -> nn.Linear:
    """A `cls` (nn.Linear or a subclass) holding `layer`'s own parameters, not copies."""
    new = cls(layer.in_features, layer.out_features, bias=layer.bias is not None, device="meta")
    new.weight, new.bias = layer.weight, layer.bias
    return new.train(layer.training)


def set_attention(model: nn.Module, attend: Callable[..., Tensor], attend_step: Callable[..., Tensor]) -> None:
    """Sets the attention kernels of every attention layer: of whole sequences, and of one decoding step."""
    for module in model.modules():
        if isinstance(module, (SelfAttention, CrossAttention)):
            module.attend, module.attend_step = attend, attend_step


def matmul_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, p_drop: float = 0.0,
                     causal: bool = False) -> Tensor:
    """`mt.model.transformer.attention` in plain matmuls, its dropout mask drawn by mt.model.fast_dropout: for the few
    queries of a decoding step, and for CPU training where `cpu_training_attention` says so."""
    if causal:
        n = q.size(-2)
        before = torch.ones(n, n, dtype=torch.bool, device=q.device).tril_()
        mask = before if mask is None else mask & before
    scores = (q @ k.transpose(-1, -2)) * q.size(-1) ** -0.5  # (B, H, Tq, Tk)
    if mask is not None:
        scores = scores.masked_fill(~mask, -torch.inf)
    return dropout(scores.softmax(dim=-1), p_drop, p_drop > 0) @ v


def cpu_training_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, p_drop: float,
                           causal: bool) -> Tensor:
    """`mt.model.transformer.attention`, step by step in matmuls where PyTorch's fused kernel is the slower one in CPU
    training (forward and backward): with attention dropout (no fused CPU kernel has it), in bf16 (its fused
    backward is slow), and in fp32 over few keys on more than one thread (on one, as each process of a per-core run
    has, the fused kernel is the faster). Everywhere else, the fused kernel."""
    if q.device.type == "cpu" and q.requires_grad and not torch.compiler.is_compiling() and (
            p_drop > 0.0 or q.dtype != torch.float32 or (k.size(-2) <= 64 and torch.get_num_threads() > 1)):
        return matmul_attention(q, k, v, mask, p_drop, causal)
    return attention(q, k, v, mask, p_drop, causal)


class FrozenLinear(nn.Module):
    """nn.Linear for inference, its weight stored transposed and contiguous, (in_features, out_features).

    F.linear multiplies by the transpose of an (out, in) weight; on CPU, MKL runs the small matrices of
    step-by-step decoding faster against a weight already laid out as (in, out). Where oneDNN is the faster
    kernel (see mt/model/fast_linear.py) and the product is large enough for it to pay, fp32 goes through it
    instead, against a copy of the weight packed once in oneDNN's own layout.
    """

    def __init__(self, layer: nn.Linear):
        super().__init__()
        self.register_buffer("weight_t", layer.weight.detach().t().contiguous())
        self.register_buffer("bias", None if layer.bias is None else layer.bias.detach().clone())
        self._packed: tuple[tuple[int, int], Tensor] | None = None  # (weight_t's address and version, packed)

    def forward(self, x: Tensor) -> Tensor:
        weight_t, bias = self.weight_t, self.bias  # once: a buffer is looked up through nn.Module.__getattr__
        flat = x.reshape(-1, x.size(-1))
        # prefers_onednn first: it is False while torch.compile traces, which cannot trace onednn_pays
        if prefers_onednn(x, weight_t) and onednn_pays(flat.size(0), weight_t):
            return onednn_mm(flat, self.packed(weight_t), bias).view(*x.shape[:-1], weight_t.size(1))
        y = flat @ weight_t if bias is None else torch.addmm(bias, flat, weight_t)
        return y.view(*x.shape[:-1], y.size(-1))

    def packed(self, weight_t: Tensor) -> Tensor:
        """The weight in oneDNN's layout, packed at first use and again if `weight_t` is replaced or written to."""
        key = (weight_t.data_ptr(), weight_t._version)
        if self._packed is None or self._packed[0] != key:
            self._packed = (key, pack_for_onednn(weight_t.t()))
        return self._packed[1]

    def __getstate__(self) -> dict:
        """Copies and pickles leave the packed weight out (oneDNN's layout has no storage to copy): packed again."""
        return {**self.__dict__, "_packed": None}
