"""What each fast path computes: the `ModelConfig` features (field and value) it was written and tested for.

A fast path runs on a model only where its contract accepts every field of the model's config; a field it does not
name, or a value it does not list, and that path declines and the plain model runs (fail closed, as CTranslate2's
converters refuse what their lists do not hold). tests/fast/test_contract.py walks every field of `ModelConfig` and
every value it allows, and checks that each path either computes what the plain model computes or declines: a new
field fails it until every contract here names it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from mt.config import ModelConfig

ANY = "any value"
Values = str | tuple | Callable[[Any], bool]  # ANY, the values listed, or a test of the value


@dataclass(frozen=True)
class Contract:
    name: str
    computes: Mapping[str, Values]  # per ModelConfig field, the values this path computes

    def declines(self, cfg: ModelConfig) -> str | None:
        """None where this path computes the model `cfg` describes; else the field and value it does not."""
        for f in dataclasses.fields(cfg):
            value, values = getattr(cfg, f.name), self.computes.get(f.name)
            if values is None:
                return f"{self.name}: computes no model.{f.name}"
            if not (values == ANY or (value in values if isinstance(values, tuple) else values(value))):
                return f"{self.name}: computes no model.{f.name}={value!r}"
        return None


def whole_groups_of_four(width: int) -> bool:
    return width % 4 == 0


# A kernel swapped in for one kind of layer (a linear layer, a dropout, the attention function, the loss) computes
# that layer whatever model holds it; it names every field all the same, so that a new one is a decision.
ANY_MODEL = {name: ANY for name in (
    "d_model", "n_heads", "n_enc_layers", "n_dec_layers", "d_ff", "activation", "norm", "dropout", "attn_dropout",
    "act_dropout", "max_len", "src_vocab_size", "tgt_vocab_size", "share_embeddings", "tie_output", "output_bias",
    "right_to_left")}
# The paths that compute the layers' order themselves (packed training, the C step and encoder) list the activations
# and norms they were checked with.
LAYERS_AS_WRITTEN = {**ANY_MODEL, "activation": ("relu", "gelu", "swish"), "norm": ("post", "pre")}
INT8_PANELS = {**LAYERS_AS_WRITTEN, "d_model": whole_groups_of_four, "d_ff": whole_groups_of_four}

# Training (`for_training`)
LINEAR = Contract("linear layers on the faster fp32 matmul", ANY_MODEL)
DROPOUT = Contract("dropout from 16-bit masks", ANY_MODEL)
TRAINING_ATTENTION = Contract("attention in matmuls where the fused CPU kernel is slower", ANY_MODEL)
FUSED_LOSS = Contract("the output layer and the loss fused", ANY_MODEL)
PACKED = Contract("the layers on real tokens only", LAYERS_AS_WRITTEN)
# Decoding (`for_inference`)
FROZEN = Contract("frozen linear layers", ANY_MODEL)
STEP_ATTENTION = Contract("attention in decoding steps in matmuls", ANY_MODEL)
COMPILED = Contract("the decoding step compiled", ANY_MODEL)  # traces the plain model's own step
NATIVE_STEP = {"fp32": Contract("the decoding step in C", LAYERS_AS_WRITTEN),
               "int8": Contract("the int8 decoding step in C", INT8_PANELS)}
NATIVE_ENCODE = {"fp32": Contract("the encoder in C", LAYERS_AS_WRITTEN),
                 "int8": Contract("the int8 encoder in C", INT8_PANELS)}

CONTRACTS = [LINEAR, DROPOUT, TRAINING_ATTENTION, FUSED_LOSS, PACKED, FROZEN, STEP_ATTENTION, COMPILED,
             *NATIVE_STEP.values(), *NATIVE_ENCODE.values()]
