"""Training on real tokens only (a fast path of mt/fast/): everything but attention skips a batch's padding.

A batch is padded to its longest sentence on each side, and all but attention works a position at a time: the
projections, the feed-forward layers, the norms, the dropouts and the output layer would compute the padding's rows
for nothing (Multi30k's batches of 4,096 tokens are ~5% source and ~8% target padding). `packed_loss` runs the
layers on the real tokens packed together, (N, D), pads them out only around attention, whose masks already keep
padding away from real tokens, and packs its output again. The loss and every parameter's gradient are the plain
path's: there, padding rows reach real tokens only through attention weights of 0 and are left out of the loss.
Dropout draws its masks for fewer elements, so the random stream differs from the plain model's, as every fast
dropout's does. CPU training in fp32 outside torch.compile only; a batch without padding takes the plain path.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from mt.data.tokenizer import PAD
from mt.fast.linear import plain_cpu_fp32
from mt.model.transformer import (
    CrossAttention,
    DecoderLayer,
    EncoderLayer,
    SelfAttention,
    Transformer,
    merge_heads,
    split_heads,
    teacher_forced_loss,
)


@dataclass
class Padding:
    """Where one side's real tokens are in its padded (B, T) batch."""

    rows: Tensor  # their rows in the batch flattened to (B * T)
    shape: tuple[int, int]  # (B, T)

    def pad(self, x: Tensor) -> Tensor:
        """(N, C) rows of real tokens → (B, T, C), zeros in the padding."""
        whole = x.new_zeros(self.shape[0] * self.shape[1], x.size(-1))
        return whole.index_copy(0, self.rows, x).view(*self.shape, x.size(-1))

    def pack(self, x: Tensor) -> Tensor:
        """(B, T, C) → the (N, C) rows of real tokens."""
        return x.flatten(0, 1).index_select(0, self.rows)


def packed_loss(model: Transformer, src: Tensor, tgt: Tensor, target: Tensor, smoothing: float) -> Tensor:
    """`mt.model.transformer.teacher_forced_loss` with the layers on real tokens only (see the module docstring)."""
    src_real, tgt_real = src != PAD, tgt != PAD
    weight = model.output.weight
    if not plain_cpu_fp32(weight, weight) or (src_real.all() and tgt_real.all()):
        return teacher_forced_loss(model, src, tgt, target, smoothing)
    src_pad = Padding(src_real.flatten().nonzero().squeeze(1), tuple(src.shape))
    tgt_pad = Padding(tgt_real.flatten().nonzero().squeeze(1), tuple(tgt.shape))
    src_mask = src_real[:, None, None, :]
    x = src_pad.pack(model.embed(model.src_embed, src))
    for layer in model.encoder:
        x = encoder_layer(layer, x, src_pad, src_mask)
    memory = model.enc_norm(x)
    y = tgt_pad.pack(model.embed(model.tgt_embed, tgt))
    for layer in model.decoder:
        y = decoder_layer(layer, y, tgt_pad, *memory_kv(layer.cross_attn, memory, src_pad), src_mask)
    # A target position is padding exactly where its prefix's is: tgt is BOS + tokens, target tokens + EOS.
    return model.output_loss(model.dec_norm(y), weight, target.flatten().index_select(0, tgt_pad.rows), smoothing,
                             bias=model.output.bias)


def encoder_layer(layer: EncoderLayer, x: Tensor, padding: Padding, src_mask: Tensor) -> Tensor:
    """`EncoderLayer.forward` on packed tokens."""
    res = layer.res_attn
    x = res.add(x, self_attention(layer.self_attn, res.normed_input(x), padding, src_mask, causal=False))
    return layer.res_ffn.add(x, layer.ffn(layer.res_ffn.normed_input(x)))


def decoder_layer(layer: DecoderLayer, x: Tensor, padding: Padding, mem_k: Tensor, mem_v: Tensor,
                  src_mask: Tensor) -> Tensor:
    """`DecoderLayer.forward` on packed tokens."""
    res = layer.res_self
    x = res.add(x, self_attention(layer.self_attn, res.normed_input(x), padding, None, causal=True))
    res = layer.res_cross
    x = res.add(x, cross_attention(layer.cross_attn, res.normed_input(x), padding, mem_k, mem_v, src_mask))
    return layer.res_ffn.add(x, layer.ffn(layer.res_ffn.normed_input(x)))


def self_attention(attn: SelfAttention, x: Tensor, padding: Padding, mask: Tensor | None, causal: bool) -> Tensor:
    """`SelfAttention.forward` on packed tokens: padded only from the projections to the output's."""
    q, k, v = (split_heads(t, attn.n_heads) for t in padding.pad(attn.qkv(x)).split(x.size(-1), dim=-1))
    y = attn.attend(q, k, v, mask, attn.dropout if attn.training else 0.0, causal)
    return attn.out(padding.pack(merge_heads(y)))


def memory_kv(attn: CrossAttention, memory: Tensor, src_padding: Padding) -> tuple[Tensor, Tensor]:
    """`CrossAttention.memory_kv` of the packed encoder output: (B, H, S, Dh) each, zeros in the padding."""
    k, v = src_padding.pad(attn.kv(memory)).split(memory.size(-1), dim=-1)
    return split_heads(k, attn.n_heads), split_heads(v, attn.n_heads)


def cross_attention(attn: CrossAttention, x: Tensor, padding: Padding, k: Tensor, v: Tensor,
                    src_mask: Tensor) -> Tensor:
    """`CrossAttention.forward` on packed target tokens."""
    q = split_heads(padding.pad(attn.q(x)), attn.n_heads)
    y = attn.attend(q, k, v, src_mask, attn.dropout if attn.training else 0.0, causal=False)
    return attn.out(padding.pack(merge_heads(y)))
