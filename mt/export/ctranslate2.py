"""`mt export --to ctranslate2`: CTranslate2's `TransformerSpec` filled in from an mt checkpoint's weights.

Built directly, as CTranslate2's own OpenNMT-py and fairseq converters do, not through its Hugging Face converter
(which assumes OPUS-MT's conventions: decoding started from </s>, a trailing pad token). What must match mt:
- the positional table is given explicitly: CTranslate2 otherwise makes its own, laid out [sin | cos] rather than
  the paper's interleaved sin/cos that mt uses;
- decoding starts from <s> (mt's BOS), and the source gets </s> appended (`add_source_eos`), as mt's encoder reads;
- LayerNorm's epsilon is PyTorch's (1e-5), not CTranslate2's default;
- fused projections keep mt's order: queries, keys, values (self-attention), keys, values (cross-attention).
"""

from __future__ import annotations

from pathlib import Path

import ctranslate2
import numpy as np
from ctranslate2.converters import Converter
from ctranslate2.specs import attention_spec, common_spec, transformer_spec

from mt.config import ModelConfig, from_dict
from mt.data.tokenizer import Tokenizer
from mt.model.transformer import sinusoids

QUANTIZATIONS = ("float32", "int8", "int8_float32", "int8_bfloat16", "float16", "bfloat16")
ACTIVATIONS = {"relu": common_spec.Activation.RELU, "gelu": common_spec.Activation.GELU,  # GELU: erf, as nn.GELU
               "swish": common_spec.Activation.SWISH}


class MtConverter(Converter):
    """A CTranslate2 converter whose source is a loaded mt checkpoint (`mt.checkpoint.load`)."""

    def __init__(self, state: dict):
        self.state = state

    def _load(self) -> transformer_spec.TransformerSpec:
        return model_spec(self.state)


def write(state: dict, directory: Path, quantization: str = "float32") -> None:
    """The CTranslate2 model of `state` in `directory` (created; must not exist)."""
    MtConverter(state).convert(str(directory), quantization=None if quantization == "float32" else quantization)


def model_spec(state: dict) -> transformer_spec.TransformerSpec:
    cfg = from_dict(state["config"]).model
    weights = {name: tensor.float().numpy() for name, tensor in state["model"].items()}
    spec = transformer_spec.TransformerSpec.from_config((cfg.n_enc_layers, cfg.n_dec_layers), cfg.n_heads,
                                                        pre_norm=cfg.norm == "pre",
                                                        activation=ACTIVATIONS[cfg.activation])
    spec.config.layer_norm_epsilon = 1e-5
    spec.config.add_source_eos = True
    spec.config.decoder_start_token = "<s>"
    positions = sinusoids(cfg.max_len, cfg.d_model).numpy()
    set_encoder(spec.encoder, weights, positions, cfg)
    set_decoder(spec.decoder, weights, positions, cfg)
    spec.register_source_vocabulary(Tokenizer(state["spm"]["src"]).pieces())
    spec.register_target_vocabulary(Tokenizer(state["spm"]["tgt"]).pieces())
    return spec


def set_encoder(spec: transformer_spec.TransformerEncoderSpec, w: dict[str, np.ndarray], positions: np.ndarray,
                cfg: ModelConfig) -> None:
    spec.embeddings[0].weight = w["src_embed.weight"]
    spec.position_encodings.encodings = positions
    if cfg.norm == "pre":
        set_norm(spec.layer_norm, w, "enc_norm")
    for i, layer in enumerate(spec.layer):
        set_self_attention(layer.self_attention, w, f"encoder.{i}", "res_attn")
        set_ffn(layer.ffn, w, f"encoder.{i}")


def set_decoder(spec: transformer_spec.TransformerDecoderSpec, w: dict[str, np.ndarray], positions: np.ndarray,
                cfg: ModelConfig) -> None:
    spec.embeddings.weight = w["tgt_embed.weight"]
    spec.position_encodings.encodings = positions
    if cfg.norm == "pre":
        set_norm(spec.layer_norm, w, "dec_norm")
    set_linear(spec.projection, w, "output")
    for i, layer in enumerate(spec.layer):
        scope = f"decoder.{i}"
        set_self_attention(layer.self_attention, w, scope, "res_self")
        set_linear(layer.attention.linear[0], w, f"{scope}.cross_attn.q")
        set_linear(layer.attention.linear[1], w, f"{scope}.cross_attn.kv")
        set_linear(layer.attention.linear[2], w, f"{scope}.cross_attn.out")
        set_norm(layer.attention.layer_norm, w, f"{scope}.res_cross.norm")
        set_ffn(layer.ffn, w, scope)


def set_self_attention(spec: attention_spec.MultiHeadAttentionSpec, w: dict[str, np.ndarray], scope: str,
                       residual: str) -> None:
    set_linear(spec.linear[0], w, f"{scope}.self_attn.qkv")
    set_linear(spec.linear[1], w, f"{scope}.self_attn.out")
    set_norm(spec.layer_norm, w, f"{scope}.{residual}.norm")


def set_ffn(spec: transformer_spec.FeedForwardSpec, w: dict[str, np.ndarray], scope: str) -> None:
    set_linear(spec.linear_0, w, f"{scope}.ffn.up")
    set_linear(spec.linear_1, w, f"{scope}.ffn.down")
    set_norm(spec.layer_norm, w, f"{scope}.res_ffn.norm")


def set_linear(spec: common_spec.LinearSpec, w: dict[str, np.ndarray], scope: str) -> None:
    spec.weight = w[f"{scope}.weight"]
    if f"{scope}.bias" in w:  # mt's output layer has none but with model.output_bias
        spec.bias = w[f"{scope}.bias"]


def set_norm(spec: common_spec.LayerNormSpec, w: dict[str, np.ndarray], scope: str) -> None:
    spec.gamma = w[f"{scope}.weight"]
    spec.beta = w[f"{scope}.bias"]


def translator(directory: str | Path, device: str = "cpu", threads: int = 0) -> ctranslate2.Translator:
    return ctranslate2.Translator(str(directory), device=device, intra_threads=threads)


def readme(manifest: dict) -> str:
    """The README.md written beside the model: what it is and how to load it."""
    langs = manifest.get("langs") or {}
    beam = manifest["config"]["decode"]["beam"]
    return f"""# {langs.get('src', '?')}→{langs.get('tgt', '?')} translation model for CTranslate2

Exported by `mt export` from `{manifest['source']}` (step {manifest['step']}), weights in {manifest['quantization']}.
`source.spm` and `target.spm` are the SentencePiece models; the source needs no `</s>`: the model appends it.

```python
import ctranslate2, sentencepiece as spm
src, tgt = spm.SentencePieceProcessor(model_file="source.spm"), spm.SentencePieceProcessor(model_file="target.spm")
translator = ctranslate2.Translator(".")  # this directory
out = translator.translate_batch([src.encode("Your sentence.", out_type=str)], beam_size={beam})
print(tgt.decode(out[0].hypotheses[0]))
```

Or, from mt: `mt translate --checkpoint . < input.txt` (beam {beam}, CTranslate2's length penalty 1.0).

The length penalty is not mt's: CTranslate2 divides a hypothesis's log-probability by length^α, mt by
((5 + length) / 6)^α, so mt's tuned α does not carry over. Choose CTranslate2's on a validation set (`mt evaluate
--checkpoint . --src valid.src --ref valid.tgt --len-penalty A`, for a few A).
"""
