"""The model's weights as native_step.c reads them (mt/model/native_step.py calls it): which models it computes
(`supported`), the parameter slots of the decoder or the encoder and the sizes beside them (`Layout`), and the
packed copies of the weights its products stream (`f32_packed`, `int8_packed`).
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor, nn

from mt.model.transformer import Transformer

ACTIVATIONS = {"relu": 0, "gelu": 1, "swish": 2}
PER_LAYER = 30  # parameter slots per decoder layer, in native_step.c's order
ENC_PER_LAYER = 20  # and per encoder layer


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

    def __init__(self, model: Transformer, precision: str, part: str, panel: int):
        self.model, self.precision, self.part = model, precision, part
        self.panel = panel  # outputs per panel of the packed int8 weights: 8, or 16 with AVX-512
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
