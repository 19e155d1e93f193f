"""`mt export --to huggingface`: a directory that `MarianMTModel.from_pretrained` and `MarianTokenizer` load.

Marian in transformers is the paper's post-norm Transformer with two differences of layout, both mapped exactly:
- its sinusoids are laid out [sin | cos] where mt's interleave them; transformers rebuilds the table on load (and
  drops a custom one on save), so instead the model dimension is permuted: every weight that reads or writes the
  residual stream is reordered by `PERMUTATION`, which turns mt's table into Marian's and changes nothing else
  (LayerNorm does not care about order);
- queries, keys and values are three projections, where mt fuses them.
A pre-norm model has no Marian equivalent: it is refused, pointing to the CTranslate2 export.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import Tensor

from mt.config import ModelConfig, from_dict
from mt.data.tokenizer import BOS, EOS, PAD, Tokenizer
from mt.errors import MtError

QUANTIZATIONS = ("float32",)


def permutation(d_model: int) -> Tensor:
    """Marian's column j of the positional table is mt's column `permutation[j]`: the sines, then the cosines."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def write(state: dict, directory: Path, quantization: str = "float32") -> None:
    from transformers import MarianConfig, MarianMTModel

    cfg = from_dict(state["config"])
    if cfg.model.norm == "pre":
        raise MtError("a pre-norm model cannot be a Hugging Face MarianMTModel (Marian is post-norm only); "
                      "export it with --to ctranslate2")
    config = MarianConfig(**marian_config(cfg.model))
    model = MarianMTModel(config)
    missing, unexpected = model.load_state_dict(marian_weights(state["model"], cfg.model), strict=False)
    left = [key for key in missing if "embed_positions" not in key and not tied(key, config)]
    if left or unexpected:  # a mapping gone wrong must never save a half-initialised model
        raise AssertionError(f"weights not mapped: missing {left}, unexpected {unexpected}")
    model.generation_config.update(**generation_defaults(cfg.model, cfg.decode.beam))
    model.save_pretrained(directory)
    write_vocabularies(state, directory)


def marian_config(m: ModelConfig) -> dict:
    return dict(
        vocab_size=m.src_vocab_size, decoder_vocab_size=m.tgt_vocab_size, d_model=m.d_model,
        encoder_layers=m.n_enc_layers, decoder_layers=m.n_dec_layers, encoder_attention_heads=m.n_heads,
        decoder_attention_heads=m.n_heads, encoder_ffn_dim=m.d_ff, decoder_ffn_dim=m.d_ff,
        activation_function=m.activation,  # "gelu" is the exact (erf) GELU in transformers, as nn.GELU
        max_position_embeddings=m.max_len, scale_embedding=True, dropout=m.dropout,
        attention_dropout=m.attn_dropout, activation_dropout=m.act_dropout,
        share_encoder_decoder_embeddings=m.share_embeddings, tie_word_embeddings=m.tie_output,
        pad_token_id=PAD, eos_token_id=EOS, bos_token_id=BOS, decoder_start_token_id=BOS, forced_eos_token_id=EOS)


def generation_defaults(m: ModelConfig, beam: int) -> dict:
    """What `generate` does unless told otherwise: mt's beam, transformers' own length penalty (its alpha divides
    by length^alpha, not mt's GNMT penalty), room for the longest output the positions allow (not 20), EOS forced
    at that limit as mt does, and nothing barred (OPUS-MT bars pad; mt's search does not)."""
    return dict(num_beams=beam, max_length=m.max_len, length_penalty=1.0, forced_eos_token_id=EOS,
                decoder_start_token_id=BOS, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD,
                bad_words_ids=None)


def tied(key: str, config) -> bool:
    """Whether transformers fills `key` from another weight (tied embeddings) rather than from the file."""
    shared = config.share_encoder_decoder_embeddings and key.endswith("embed_tokens.weight")
    return shared or (config.tie_word_embeddings and key == "lm_head.weight")


def marian_weights(weights: dict[str, Tensor], m: ModelConfig) -> dict[str, Tensor]:
    """mt's state dict under Marian's names, the model dimension permuted (see the module's docstring)."""
    p = permutation(m.d_model)
    w = {name: tensor.float() for name, tensor in weights.items()}
    bias = w.get("output.bias", torch.zeros(m.tgt_vocab_size))  # model.output_bias: an imported Marian model's
    out = {"final_logits_bias": bias[None].contiguous()}
    if m.share_embeddings:
        out["model.shared.weight"] = w["src_embed.weight"][:, p]
    else:
        out["model.encoder.embed_tokens.weight"] = w["src_embed.weight"][:, p]
        out["model.decoder.embed_tokens.weight"] = w["tgt_embed.weight"][:, p]
    if not m.tie_output:
        out["lm_head.weight"] = w["output.weight"][:, p]
    for mt, hf, reads in layer_names(m):  # mt's fused projections are Marian's separate ones, one after another
        weights, biases = w[f"{mt}.weight"].chunk(len(hf)), w[f"{mt}.bias"].chunk(len(hf))
        for name, weight, bias in zip(hf, weights, biases, strict=True):
            out[f"{name}.weight"] = (weight[:, p] if reads else weight[p]).contiguous()
            out[f"{name}.bias"] = (bias if reads else bias[p]).contiguous()
    return out


# Each layer's weights under both names: mt's module, Marian's modules (mt fuses projections that Marian keeps
# apart), and whether it reads the residual stream (its input columns permuted) or writes it (its outputs permuted).
SELF_ATTENTION = (("self_attn.qkv", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), "reads"),
                  ("self_attn.out", ("self_attn.out_proj",), "writes"))
FEED_FORWARD = (("ffn.up", ("fc1",), "reads"), ("ffn.down", ("fc2",), "writes"),
                ("res_ffn.norm", ("final_layer_norm",), "writes"))
ENCODER_LAYER = (*SELF_ATTENTION, ("res_attn.norm", ("self_attn_layer_norm",), "writes"), *FEED_FORWARD)
DECODER_LAYER = (*SELF_ATTENTION, ("res_self.norm", ("self_attn_layer_norm",), "writes"),
                 ("cross_attn.q", ("encoder_attn.q_proj",), "reads"),
                 ("cross_attn.kv", ("encoder_attn.k_proj", "encoder_attn.v_proj"), "reads"),
                 ("cross_attn.out", ("encoder_attn.out_proj",), "writes"),
                 ("res_cross.norm", ("encoder_attn_layer_norm",), "writes"), *FEED_FORWARD)


def layer_names(m: ModelConfig) -> Iterator[tuple[str, tuple[str, ...], bool]]:
    """Every layer's weights of a model shaped `m`: mt's module, Marian's modules, whether it reads the residual
    stream. The export (`marian_weights`) and the import (mt/export/from_marian.py) both map by it."""
    for part, n, layer in (("encoder", m.n_enc_layers, ENCODER_LAYER), ("decoder", m.n_dec_layers, DECODER_LAYER)):
        for i in range(n):
            for mt, hf, role in layer:
                yield f"{part}.{i}.{mt}", tuple(f"model.{part}.layers.{i}.{name}" for name in hf), role == "reads"


def write_vocabularies(state: dict, directory: Path) -> None:
    """vocab.json (piece → id, as the SentencePiece model numbers them) per side, and the tokenizer's config."""
    separate = state["spm"]["src"] != state["spm"]["tgt"]
    sides = {"vocab.json": "src"} | ({"target_vocab.json": "tgt"} if separate else {})
    for name, side in sides.items():
        vocab = {piece: i for i, piece in enumerate(Tokenizer(state["spm"][side]).pieces())}
        (directory / name).write_text(json.dumps(vocab, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
    langs = state.get("langs") or {}
    tokenizer_config = {"tokenizer_class": "MarianTokenizer", "separate_vocabs": separate, "unk_token": "<unk>",
                        "eos_token": "</s>", "pad_token": "<pad>", "source_lang": langs.get("src"),
                        "target_lang": langs.get("tgt"), "model_max_length": from_dict(state["config"]).model.max_len}
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2) + "\n", encoding="utf-8")


def readme(manifest: dict) -> str:
    """The model card: what the model is, how to load it, and what not to do with it."""
    langs = manifest.get("langs") or {}
    src, tgt = langs.get("src", "?"), langs.get("tgt", "?")
    model = manifest["config"]["model"]
    return f"""---
library_name: transformers
pipeline_tag: translation
language: [{src}, {tgt}]
tags: [translation, marian, mt]
---

# {src}→{tgt} Transformer, trained with mt

A Transformer of "Attention Is All You Need" ({model['n_enc_layers']}+{model['n_dec_layers']} layers, d_model
{model['d_model']}, {model['n_heads']} heads), exported by `mt export` from `{manifest['source']}` (step
{manifest['step']}) as a `MarianMTModel`: the same model, the same translations token for token.

```python
from transformers import MarianMTModel, MarianTokenizer
tokenizer, model = MarianTokenizer.from_pretrained("."), MarianMTModel.from_pretrained(".")
print(tokenizer.batch_decode(model.generate(**tokenizer(["Your sentence."], return_tensors="pt")), skip_special_tokens=True))
```

`generation_config.json` holds mt's beam size ({manifest['config']['decode']['beam']}), a length limit of
{model['max_len']} tokens, and transformers' own length penalty (1.0): transformers divides a hypothesis's
log-probability by length^alpha, mt by ((5 + length) / 6)^alpha, so mt's tuned alpha does not carry over; choose
one on a validation set.

Do not convert this directory with CTranslate2's Hugging Face converter (`ct2-transformers-converter`): it assumes
OPUS-MT's conventions, decodes from `</s>` and drops the last vocabulary row, and the model would translate
garbage. Export the mt checkpoint with `mt export CHECKPOINT --to ctranslate2 --out DIR` instead.
"""  # noqa: E501 (the model card's example line is written as is)
