"""The model's weights as native_step.c reads them (mt/fast/native_step.py calls it): whether it computes the model
as it now is (`supported`; mt/fast/contract.py names the config features it computes), the weights of the decoder or
the encoder laid out by the names native_step.c asks for, with the sizes beside them (`Layout`), and the packed
copies of the weights its products stream (`f32_packed`, `int8_packed`).
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor, nn

from mt.model.transformer import Transformer

ACTIVATIONS = {"relu": 0, "gelu": 1, "swish": 2}
PARTS = {"decoder": (0, 1), "encoder": (2, 3)}  # mt_weight_names' parts: a layer's weights, the others


class Unreadable(ValueError):
    """A weight native_step.c names is not in the model, or not of a kind it reads."""


def supported(model: Transformer) -> bool:
    """Whether the C code computes this model as it is now, beyond the features of its config (mt/fast/contract.py
    names those): on CPU in fp32, its layer norms with one epsilon."""
    embed = model.tgt_embed.weight
    return embed.device.type == "cpu" and embed.dtype == torch.float32 and len(norm_eps(model)) <= 1


def norm_eps(model: Transformer) -> set[float]:
    return {m.eps for m in model.modules() if isinstance(m, nn.LayerNorm)}


class Layout:
    """The decoder's weights (`part` "decoder") or the encoder's ("encoder") as native_step.c reads them, by the names
    it gives (`mt_weight_names`), with the sizes, the epsilon and the embedding scale, each tensor pointed into kept
    alive with this; laid out again when the model's weights change (`current`). A name the model lacks, or a
    module of a kind the C code does not read, raises `Unreadable`."""

    def __init__(self, model: Transformer, precision: str, part: str, lib: ctypes.CDLL):
        self.model, self.precision, self.part = model, precision, part
        self.panel = lib.mt_int8_panel()  # outputs per panel of the packed int8 weights: 8, or 16 with AVX-512
        self.slots_per_weight = lib.mt_weight_slots()
        self.names = [lib.mt_weight_names(i).decode().split() for i in PARTS[part]]  # (per layer, the others)
        first = model.decoder[0] if part == "decoder" else model.encoder[0] if len(model.encoder) else None
        last = model.output if part == "decoder" else model.encoder[-1].ffn.down if len(model.encoder) else None
        self.watched = [m for m in (first and first.self_attn.qkv, last) if m is not None]  # a step is microseconds
        self.lay_out()

    def lay_out(self) -> None:
        """Points the C code at the model's weights as they are now (`sources` notes them, to see a change)."""
        model, cfg = self.model, self.model.cfg
        self.keep: list[Tensor] = []  # every tensor the C code points into stays alive with it
        stack = model.decoder if self.part == "decoder" else model.encoder
        per_layer, others = self.names
        slots = [p for layer in stack for name in per_layer for p in self.weight(layer, name)]
        slots += [p for name in others for p in self.weight(model, name)]
        self.params = (ctypes.c_void_p * len(slots))(*slots)
        layers, vocab = (cfg.n_dec_layers, cfg.tgt_vocab_size) if self.part == "decoder" else (
            cfg.n_enc_layers, cfg.src_vocab_size)
        self.dims = self.kept(torch.tensor([cfg.d_model, cfg.n_heads, cfg.d_ff, layers, vocab, cfg.norm == "pre",
                                            ACTIVATIONS[cfg.activation], self.precision == "int8"], dtype=torch.int64))
        self.eps_scale = self.kept(torch.tensor([next(iter(norm_eps(model)), 1e-5), model.scale], dtype=torch.float32))
        self.sources = self.weights_now()

    def weight(self, owner: nn.Module, name: str) -> list[int | None]:
        """The pointers of the weight `name` of `owner` (a layer, or the model), as native_step.c reads them."""
        try:
            held = owner.get_submodule(name) if name != "positions" else owner.get_buffer(name)
        except AttributeError:
            raise Unreadable(f"native_step.c reads {name!r}, which the model does not have") from None
        if isinstance(held, Tensor):
            slots = [self.kept(held)]
        elif isinstance(held, nn.Embedding):
            slots = [self.kept(held.weight)]
        elif isinstance(held, nn.LayerNorm):
            slots = [self.kept(held.weight)] + [None] * (self.slots_per_weight - 2) + [self.kept(held.bias)]
        elif isinstance(held, nn.Identity):
            slots = []  # post-norm's final norm: never read
        elif self.precision == "int8" and isinstance(held, torch.ao.nn.quantized.dynamic.Linear):
            slots = [self.kept(t) for t in int8_packed(held, self.panel)]
        elif self.precision == "fp32" and hasattr(held, "weight_t"):  # FrozenLinear
            slots = [self.kept(f32_packed(held.weight_t)), None, None, self.kept(held.bias)]
        else:
            raise Unreadable(f"native_step.c reads {name!r} as a weight it knows, not a {type(held).__name__}")
        return slots + [None] * (self.slots_per_weight - len(slots))

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
        if not supported(self.model):
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
