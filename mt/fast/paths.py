"""The two entry points of the fast paths, `for_training` and `for_inference` (the package's docstring lists the
paths), each path put in only where its contract accepts the model; and `fast_paths`, what a model runs."""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
from torch import Tensor, nn

import mt.fast.loss
import mt.fast.native_step
import mt.fast.packed
from mt.errors import MtError
from mt.fast.attention import cpu_training_attention, matmul_attention
from mt.fast.compiled import FewRowsCompiled
from mt.fast.contract import (
    CONTRACTS,
    DROPOUT,
    FROZEN,
    FUSED_LOSS,
    LINEAR,
    PACKED,
    STEP_ATTENTION,
    TRAINING_ATTENTION,
    Contract,
)
from mt.fast.dropout import Dropout
from mt.fast.frozen import FrozenLinear, Int8Linear, quantize_int8, quantized
from mt.fast.linear import Linear, kernel_note, relinked
from mt.model.transformer import CrossAttention, SelfAttention, Transformer, attention

PRECISIONS = ("fp32", "bf16", "int8")


def enabled() -> bool:
    """Whether the fast paths are on: the MT_FAST environment variable, 1 (the default) or 0."""
    value = os.environ.get("MT_FAST", "1")
    if value not in ("0", "1"):
        raise MtError(f"MT_FAST={value!r}: set it to 1 (fast paths on, the default) or 0 (off)")
    return value == "1"


def transformers(model: nn.Module, contract: Contract) -> list[Transformer]:
    """The Transformers in `model` (one, or an ensemble's members) whose config `contract` accepts."""
    return [m for m in model.modules() if isinstance(m, Transformer) and contract.declines(m.cfg) is None]


def declined(model: nn.Module) -> list[str]:
    """Why each fast path that declines a Transformer in `model` does so, once each: the field and value that a path
    missing from `fast_paths` does not compute (for training and decoding paths alike, fp32 and int8)."""
    reasons = {c.declines(m.cfg) for m in model.modules() if isinstance(m, Transformer) for c in CONTRACTS}
    return sorted(r for r in reasons if r)


def for_training(model: nn.Module) -> nn.Module:
    """The model to train, with the training fast paths swapped in (see the module docstring), in place.

    Call it before wrapping the model (DDP, torch.compile). The parameters stay the same objects, so an optimizer
    built before or after sees the same ones, and tied weights stay tied."""
    if not enabled():
        return model
    for module in transformers(model, LINEAR):
        swap_children(module, lambda child: relinked(child, Linear) if type(child) is nn.Linear else None)
    for module in transformers(model, DROPOUT):
        swap_children(module, lambda child: Dropout(child.p).train(child.training) if type(child) is nn.Dropout
                      else None)
    for module in transformers(model, TRAINING_ATTENTION):
        set_attention(module, attend=cpu_training_attention)
    for module in transformers(model, STEP_ATTENTION):
        set_attention(module, attend_step=matmul_attention)  # validation decodes with the model it trains
    for module in transformers(model, FUSED_LOSS):
        module.output_loss = mt.fast.loss.output_loss
    for module in transformers(model, PACKED):
        module.teacher_forced_loss = mt.fast.packed.packed_loss
    return model


def for_inference(model: nn.Module, precision: str) -> nn.Module:
    """The model to decode with, in eval mode and changed in place (it can no longer be trained): its linear
    layers frozen (`FrozenLinear`, their weights in bf16 for bf16, which decodes under autocast), or int8 dynamically
    quantized, its dropouts dropped, and plain-matmul attention in decoding steps.

    int8 quantizes every linear layer's weights once, a scale per output channel, and each activation on the fly
    (CPU only), at a small cost in BLEU (measure it with `mt evaluate`). Each activation's scale spans the whole batch
    (a row, in the C step of a few rows), so an int8 translation may change slightly with the sentences batched
    beside it; fp32 translates a sentence the same alone or in any batch.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    if precision == "int8":
        model = quantize_int8(model, enabled())
    if enabled():
        dtype = torch.bfloat16 if precision == "bf16" else None
        for module in transformers(model, FROZEN):
            swap_children(module, lambda child: frozen(child, dtype))
        for module in transformers(model, STEP_ATTENTION):
            set_attention(module, attend=attention, attend_step=matmul_attention)
        mt.fast.native_step.install(model, precision)
    return model.eval()


def frozen(child: nn.Module, dtype: torch.dtype | None = None) -> nn.Module | None:
    """What `for_inference` swaps in for a layer: `FrozenLinear` for a linear one (its weight in `dtype`), nothing for
    a dropout (a call that does nothing in eval mode still costs a lone sentence's step time)."""
    if type(child) in (nn.Linear, Linear):
        return FrozenLinear(child, dtype)
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
        found.append(f"linear: fp32 matmuls on {kernel_note()}, a choice per weight")
    frozen_dtypes = {m.weight_t.dtype for m in model.modules() if isinstance(m, FrozenLinear)}
    if frozen_dtypes:
        dtypes = "bf16" if frozen_dtypes == {torch.bfloat16} else "fp32"
        found.append(f"linear: frozen, {dtypes} weights transposed; matmuls on {kernel_note()}, a choice per weight "
                     "and rows")
    if Int8Linear in kinds:
        found.append("linear: int8 per output channel, dynamically quantized; on the faster of fbgemm and oneDNN as "
                     "measured, a choice per weight and rows")
    if Dropout in kinds:
        found.append("dropout: 16-bit masks")
    if layers and layers[0].attend is cpu_training_attention:
        found.append("attention: matmuls where the fused CPU kernel is slower")
    if layers and layers[0].attend_step is matmul_attention:
        found.append("attention in decoding steps: matmuls")
    if any(getattr(m, "output_loss", None) is mt.fast.loss.output_loss for m in model.modules()):
        found.append("loss: fused with the output layer")
    if any(getattr(m, "teacher_forced_loss", None) is mt.fast.packed.packed_loss for m in model.modules()):
        found.append("padding: skipped outside attention")
    step = next((m.step_layers for m in model.modules()
                 if isinstance(getattr(m, "step_layers", None), FewRowsCompiled)), None)
    if step is not None:
        found.append("decoding step: compiled" + (f" below {step.rows} rows" if step.rows else ""))
    native = next((m.decode_step for m in model.modules()
                   if isinstance(getattr(m, "decode_step", None), mt.fast.native_step.NativeDecodeStep)), None)
    if native is not None:
        rows = native.rows_limit()
        found.append(f"decoding step: C ({native.instruction_set}), {native.precision}, up to {rows} row"
                     + ("s" if rows != 1 else "") + f" on {torch.get_num_threads()} threads")
    if native is None and (FrozenLinear in kinds or quantized(model)):
        why = mt.fast.native_step.unavailable()
        if why:
            found.append(f"decoding step: PyTorch's, not C ({why})")
    encoder = next((m.encode for m in model.modules()
                    if isinstance(getattr(m, "encode", None), mt.fast.native_step.NativeEncode)), None)
    if encoder is not None:
        found.append(f"encoder: C, up to {encoder.positions_limit()} source positions on {torch.get_num_threads()} "
                     "threads")
    return found


def swap_children(model: nn.Module, swap: Callable[[nn.Module], nn.Module | None]) -> None:
    """Replaces, in place, every submodule `child` of the model for which `swap(child)` returns a module."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            new = swap(child)
            if new is not None:
                setattr(module, name, new)


def set_attention(model: nn.Module, attend: Callable[..., Tensor] | None = None,
                  attend_step: Callable[..., Tensor] | None = None) -> None:
    """Sets the attention kernels of every attention layer, those given: of whole sequences, of one decoding step."""
    for module in model.modules():
        if isinstance(module, (SelfAttention, CrossAttention)):
            module.attend = attend or module.attend
            module.attend_step = attend_step or module.attend_step
