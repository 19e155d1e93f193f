"""The Transformer of "Attention Is All You Need" (Vaswani et al. 2017), encoder-decoder.

Conventions, stated once:
- Tensors are batch-first. Letters: B batch, S source length, T target length, D d_model, H heads,
  Dh = D / H, V vocabulary.
- `src_mask` is a bool tensor of shape (B, 1, 1, S), True where a source position may be attended to
  (it is not padding). That is the convention of `F.scaled_dot_product_attention`.
- Target sequences are right-padded, so the causal mask alone keeps real positions from seeing padding.
- Incremental decoding passes a `DecoderCache` (mt/model/cache.py) in and gets it back; modules hold no decoding state.

Plain PyTorch throughout: `nn.Linear`, `nn.Dropout`, `F.scaled_dot_product_attention`, `F.cross_entropy`. Faster
CPU kernels with the same parameters are swapped in from outside by `mt.fast.paths.for_training` and `for_inference`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mt.config import ModelConfig
from mt.data.tokenizer import PAD
from mt.model.cache import DecoderCache


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, p_drop: float, causal: bool) -> Tensor:
    """Scaled dot-product attention over (B, H, T, Dh) tensors, dropout p_drop on its weights; `mask` (B, 1, 1, S)
    is True where a key may be attended to, `causal` hides later positions."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p_drop, is_causal=causal)


def output_loss(hidden: Tensor, weight: Tensor, target: Tensor, smoothing: float, bias: Tensor | None = None
                ) -> Tensor:
    """The label-smoothed cross-entropy of the output layer's logits, summed over the non-padding targets:
    hidden (N, D), weight (V, D), target (N,), bias (V,) or None."""
    logits = F.linear(hidden, weight, bias).float()  # (N, V)
    return F.cross_entropy(logits, target, ignore_index=PAD, label_smoothing=smoothing, reduction="sum")


def teacher_forced_loss(model: Transformer, src: Tensor, tgt: Tensor, target: Tensor, smoothing: float) -> Tensor:
    """`output_loss` of the decoder's last hidden states for the target prefix `tgt` (B, T) and the next tokens
    `target` (B, T), the source `src` (B, S) encoded: what a training step minimises."""
    memory, src_mask = model.encode(src)
    h = model.decoder_states(tgt, memory, src_mask).flatten(0, 1)  # (B * T, D)
    return model.output_loss(h, model.output.weight, target.reshape(-1), smoothing, bias=model.output.bias)


def sinusoids(length: int, d_model: int) -> Tensor:
    """The paper's fixed positional encodings, (length, D)."""
    position = torch.arange(length, dtype=torch.float32)[:, None]
    inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    table = torch.zeros(length, d_model)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq)
    return table


class SelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.dropout = cfg.attn_dropout
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)  # fused: one matmul for queries, keys and values
        self.out = nn.Linear(cfg.d_model, cfg.d_model)
        # The attention kernels of whole sequences and of one decoding step, attributes so that mt.fast can
        # swap in faster ones; both compute `attention`.
        self.attend = self.attend_step = attention

    def forward(self, x: Tensor, mask: Tensor | None, causal: bool) -> Tensor:
        q, k, v = self.qkv(x).split(x.size(-1), dim=-1)
        y = self.attend(split_heads(q, self.n_heads), split_heads(k, self.n_heads), split_heads(v, self.n_heads),
                        mask, self.dropout if self.training else 0.0, causal)
        return self.out(merge_heads(y))

    def step(self, x: Tensor, k_cache: Tensor, v_cache: Tensor, t: int) -> Tensor:
        """One decoding step at position t: x (B, 1, D) attends to positions 0..t of the cache.

        The caches are time-major (L, B, H, Dh) buffers preallocated to the longest output; this step's key and
        value are written in place at row t, so nothing is concatenated or reallocated per step.
        """
        b = x.size(0)
        q, k, v = self.qkv(x).view(b, 3, self.n_heads, -1).unbind(1)  # (B, H, Dh) each
        k_cache[t] = k
        v_cache[t] = v
        keys = k_cache[:t + 1].permute(1, 2, 0, 3)  # (B, H, t+1, Dh), a strided view
        values = v_cache[:t + 1].permute(1, 2, 0, 3)
        y = self.attend_step(q[:, :, None], keys, values, None, 0.0, causal=False)  # (B, H, 1, Dh)
        return self.out(merge_heads(y))


class CrossAttention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.dropout = cfg.attn_dropout
        self.q = nn.Linear(cfg.d_model, cfg.d_model)
        self.kv = nn.Linear(cfg.d_model, 2 * cfg.d_model)
        self.out = nn.Linear(cfg.d_model, cfg.d_model)
        self.attend = self.attend_step = attention  # as in SelfAttention

    def memory_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of the encoder output, (B, H, S, Dh) each (strided views of one projection)."""
        k, v = self.kv(memory).split(memory.size(-1), dim=-1)
        return split_heads(k, self.n_heads), split_heads(v, self.n_heads)

    def forward(self, x: Tensor, k: Tensor, v: Tensor, src_mask: Tensor) -> Tensor:
        q = split_heads(self.q(x), self.n_heads)
        y = self.attend(q, k, v, src_mask, self.dropout if self.training else 0.0, causal=False)
        return self.out(merge_heads(y))

    def weights(self, x: Tensor, k: Tensor, src_mask: Tensor) -> Tensor:
        """The attention weights `forward` applies to the values, (B, H, T, S) in float32, for the alignments and
        heatmaps of mt/decode/alignments.py: the fused kernel never returns them."""
        q = split_heads(self.q(x), self.n_heads)  # (B, H, T, Dh)
        scores = (q.float() @ k.float().transpose(-2, -1)) / math.sqrt(q.size(-1))
        return torch.softmax(scores.masked_fill(~src_mask, -torch.inf), dim=-1)

    def step(self, x: Tensor, k: Tensor, v: Tensor, src_mask: Tensor) -> Tensor:
        """Decoding: x (n, k, D) holds the current position of a sentence's k beams, as k queries."""
        y = self.attend_step(split_heads(self.q(x), self.n_heads), k, v, src_mask, 0.0, causal=False)
        return self.out(merge_heads(y))


ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "swish": nn.SiLU}  # GELU: the exact (erf) one


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.up = nn.Linear(cfg.d_model, cfg.d_ff)
        self.down = nn.Linear(cfg.d_ff, cfg.d_model)
        self.act = ACTIVATIONS[cfg.activation]()
        self.dropout = nn.Dropout(cfg.act_dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(self.dropout(self.act(self.up(x))))


class Residual(nn.Module):
    """x + dropout(f(x)) with LayerNorm after (post-norm, the paper) or before f (pre-norm)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.pre = cfg.norm == "pre"
        self.norm = nn.LayerNorm(cfg.d_model)
        self.dropout = nn.Dropout(cfg.dropout)

    def normed_input(self, x: Tensor) -> Tensor:
        return self.norm(x) if self.pre else x

    def add(self, x: Tensor, y: Tensor) -> Tensor:
        x = x + self.dropout(y)
        return x if self.pre else self.norm(x)


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = SelfAttention(cfg)
        self.ffn = FeedForward(cfg)
        self.res_attn = Residual(cfg)
        self.res_ffn = Residual(cfg)

    def forward(self, x: Tensor, src_mask: Tensor) -> Tensor:
        x = self.res_attn.add(x, self.self_attn(self.res_attn.normed_input(x), src_mask, causal=False))
        return self.res_ffn.add(x, self.ffn(self.res_ffn.normed_input(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.self_attn = SelfAttention(cfg)
        self.cross_attn = CrossAttention(cfg)
        self.ffn = FeedForward(cfg)
        self.res_self = Residual(cfg)
        self.res_cross = Residual(cfg)
        self.res_ffn = Residual(cfg)

    def forward(self, x: Tensor, mem_k: Tensor, mem_v: Tensor, src_mask: Tensor) -> Tensor:
        x = self.res_self.add(x, self.self_attn(self.res_self.normed_input(x), None, causal=True))
        x = self.res_cross.add(x, self.cross_attn(self.res_cross.normed_input(x), mem_k, mem_v, src_mask))
        return self.res_ffn.add(x, self.ffn(self.res_ffn.normed_input(x)))

    def step(self, x: Tensor, k_cache: Tensor, v_cache: Tensor, t: int, mem_k: Tensor, mem_v: Tensor,
             src_mask: Tensor) -> Tensor:
        x = self.res_self.add(x, self.self_attn.step(self.res_self.normed_input(x), k_cache, v_cache, t))
        # A sentence's beams share its encoder memory: they attend to it as one sentence with k queries, so the
        # memory is stored once per sentence, never repeated per beam nor reordered with the beams.
        h = self.res_cross.normed_input(x).view(mem_k.size(0), -1, x.size(-1))  # (n, k, D)
        x = self.res_cross.add(x, self.cross_attn.step(h, mem_k, mem_v, src_mask).view_as(x))
        return self.res_ffn.add(x, self.ffn(self.res_ffn.normed_input(x)))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.src_vocab_size <= 0 or cfg.tgt_vocab_size <= 0:
            raise ValueError("ModelConfig.src_vocab_size and tgt_vocab_size must be set before building the model")
        if cfg.share_embeddings and cfg.src_vocab_size != cfg.tgt_vocab_size:
            raise ValueError("share_embeddings needs one joint vocabulary (prepare without --separate-vocab)")
        self.cfg = cfg
        self.scale = math.sqrt(cfg.d_model)
        self.tgt_embed = nn.Embedding(cfg.tgt_vocab_size, cfg.d_model, padding_idx=PAD)
        self.src_embed = self.tgt_embed if cfg.share_embeddings else nn.Embedding(
            cfg.src_vocab_size, cfg.d_model, padding_idx=PAD)
        self.register_buffer("positions", sinusoids(cfg.max_len, cfg.d_model), persistent=False)
        self.dropout = nn.Dropout(cfg.dropout)
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_enc_layers))
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_dec_layers))
        # Pre-norm stacks end un-normalised; post-norm ones already end in a LayerNorm.
        self.enc_norm = nn.LayerNorm(cfg.d_model) if cfg.norm == "pre" else nn.Identity()
        self.dec_norm = nn.LayerNorm(cfg.d_model) if cfg.norm == "pre" else nn.Identity()
        self.output = nn.Linear(cfg.d_model, cfg.tgt_vocab_size, bias=cfg.output_bias)
        if cfg.tie_output:
            self.output.weight = self.tgt_embed.weight
        # attributes, so that mt.fast can swap in faster kernels
        self.output_loss, self.teacher_forced_loss = output_loss, teacher_forced_loss
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for name, p in self.named_parameters():
            if p.dim() > 1 and "embed" not in name:
                nn.init.xavier_uniform_(p)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
        # N(0, D^-1/2): after the sqrt(D) scaling, embeddings have unit variance, like the positions.
        tables = [self.tgt_embed, self.src_embed, self.output]
        for i, table in enumerate(tables):
            if any(table.weight is other.weight for other in tables[:i]):
                continue  # shared with a table already initialised
            nn.init.normal_(table.weight, std=self.cfg.d_model ** -0.5)
            if isinstance(table, nn.Embedding):
                nn.init.zeros_(table.weight[PAD])

    def embed(self, table: nn.Embedding, ids: Tensor, start: int = 0) -> Tensor:
        if start + ids.size(1) > self.cfg.max_len:
            raise ValueError(f"sequence of {start + ids.size(1)} positions exceeds model.max_len={self.cfg.max_len}")
        x = table(ids) * self.scale + self.positions[start:start + ids.size(1)].to(table.weight.dtype)
        return self.dropout(x)

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src (B, S) ids → memory (B, S, D) and src_mask (B, 1, 1, S)."""
        src_mask = (src != PAD)[:, None, None, :]
        x = self.embed(self.src_embed, src)
        for layer in self.encoder:
            x = layer(x, src_mask)
        return self.enc_norm(x), src_mask

    def decode(self, tgt: Tensor, memory: Tensor, src_mask: Tensor) -> Tensor:
        """Teacher-forced decoding of a whole target prefix: tgt (B, T) → logits (B, T, V)."""
        return self.output(self.decoder_states(tgt, memory, src_mask))

    def decoder_states(self, tgt: Tensor, memory: Tensor, src_mask: Tensor) -> Tensor:
        """`decode` up to the output layer: tgt (B, T) → the decoder's last hidden states (B, T, D)."""
        x = self.embed(self.tgt_embed, tgt)
        for layer in self.decoder:
            x = layer(x, *layer.cross_attn.memory_kv(memory), src_mask)
        return self.dec_norm(x)

    def forward(self, src: Tensor, tgt: Tensor, target: Tensor | None = None, smoothing: float = 0.0) -> Tensor:
        """The logits (B, T, V) of teacher-forced decoding; given `target` (B, T), the label-smoothed
        cross-entropy summed over its non-padding tokens instead (`output_loss`). Training calls this, so that DDP
        and torch.compile wrappers see the whole step."""
        if target is None:
            return self.decode(tgt, *self.encode(src))
        return self.teacher_forced_loss(self, src, tgt, target, smoothing)

    def start_cache(self, memory: Tensor, src_mask: Tensor, max_steps: int | None = None,
                    beam: int = 1) -> DecoderCache:
        """A cache for decoding `beam` hypotheses per sentence, up to `max_steps` positions (default:
        model.max_len), after `encode`."""
        steps = max_steps or self.cfg.max_len
        # Contiguous once here, or every step's attention would copy the strided views again.
        mem_kv = [[t.contiguous() for t in layer.cross_attn.memory_kv(memory)] for layer in self.decoder]
        rows, h, dh = memory.size(0) * beam, self.cfg.n_heads, self.cfg.d_model // self.cfg.n_heads
        # In the dtype the step's products give (bf16 under autocast), or each step would cast the whole cache.
        dtype = mem_kv[0][0].dtype if mem_kv else memory.dtype
        empty = [memory.new_empty((steps, rows, h, dh), dtype=dtype) for _ in range(2 * len(self.decoder))]
        return DecoderCache([k for k, _ in mem_kv], [v for _, v in mem_kv], empty[0::2], empty[1::2], src_mask,
                            beam=beam)

    def decode_step(self, tokens: Tensor, cache: DecoderCache) -> tuple[Tensor, DecoderCache]:
        """Next-token logits (B, V) for the last tokens (B,), given everything before them in `cache`."""
        t = cache.length
        if t >= cache.self_k[0].size(0):
            raise ValueError(f"decoding step {t + 1} exceeds the cache's {cache.self_k[0].size(0)} positions")
        x = self.embed(self.tgt_embed, tokens[:, None], start=t)  # (B, 1, D)
        h = self.step_layers(x, cache.self_k, cache.self_v, t, cache.mem_k, cache.mem_v, cache.src_mask)
        logits = self.output(h)
        return logits, DecoderCache(cache.mem_k, cache.mem_v, cache.self_k, cache.self_v, cache.src_mask, t + 1,
                                    cache.beam)

    def step_layers(self, x: Tensor, self_k: list[Tensor], self_v: list[Tensor], t: int, mem_k: list[Tensor],
                    mem_v: list[Tensor], src_mask: Tensor) -> Tensor:
        """The decoder layers for one step at position t: the last hidden states (B, D) of x (B, 1, D), before the
        output layer. Tensors and an int in, a tensor out, so that `mt.fast.compiled.compile_decoding` can compile it
        whole."""
        for i, layer in enumerate(self.decoder):
            x = layer.step(x, self_k[i], self_v[i], t, mem_k[i], mem_v[i], src_mask)
        return self.dec_norm(x[:, 0])


def split_heads(x: Tensor, n_heads: int) -> Tensor:
    b, t, d = x.shape
    return x.view(b, t, n_heads, d // n_heads).transpose(1, 2)  # (B, H, T, Dh)


def merge_heads(x: Tensor) -> Tensor:
    b, h, t, dh = x.shape
    return x.transpose(1, 2).reshape(b, t, h * dh)  # (B, T, D)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
