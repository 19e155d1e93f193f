"""The weights a model config implies, each by name and shape, and a state dict checked against them before any
model is built: a missing or extra weight, one of the wrong shape, or a config that claims sizes its weights lack
is one line naming the weight, the config's fields and what they make it, and nothing was allocated for it.

The names and shapes are those of mt/model/transformer.py's state dict, written out here (as a CTranslate2 model
spec names every weight) so that the check costs microseconds and allocates nothing; a test holds them equal to
the model's own. With every shape matched, building the model allocates what the file holds, plus its position
table (`max_len` × `d_model`), which is bounded here against the weights too.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from mt.config import ModelConfig
from mt.errors import MtError

# The position table may be as large as the weights, or this many values (4 MiB) for a model smaller than that.
POSITIONS_FLOOR = 1 << 20

ATTENTION = {"self_attn.qkv": ("3·d_model", "d_model"), "self_attn.out": ("d_model", "d_model")}
FEED_FORWARD = {"ffn.up": ("d_ff", "d_model"), "ffn.down": ("d_model", "d_ff")}
ENCODER_LAYER = {**ATTENTION, **FEED_FORWARD, "res_attn.norm": ("d_model",), "res_ffn.norm": ("d_model",)}
DECODER_LAYER = {**ATTENTION, "cross_attn.q": ("d_model", "d_model"), "cross_attn.kv": ("2·d_model", "d_model"),
                 "cross_attn.out": ("d_model", "d_model"), **FEED_FORWARD, "res_self.norm": ("d_model",),
                 "res_cross.norm": ("d_model",), "res_ffn.norm": ("d_model",)}
LAYER = re.compile(r"(encoder|decoder)\.(\d{1,9})\.")  # a longer number is no layer of any config's


def dims(m: ModelConfig) -> dict[str, tuple[str, ...]]:
    """Every weight of the model `m` describes, by name, its shape in the config's fields ("3·d_model")."""
    out = {"tgt_embed.weight": ("tgt_vocab_size", "d_model"), "src_embed.weight": ("src_vocab_size", "d_model")}
    for part, n, layer in (("encoder", m.n_enc_layers, ENCODER_LAYER), ("decoder", m.n_dec_layers, DECODER_LAYER)):
        for i in range(n):
            for module, (rows, *columns) in layer.items():
                if columns:  # a linear layer: weight (out, in), bias (out,)
                    out[f"{part}.{i}.{module}.weight"], out[f"{part}.{i}.{module}.bias"] = (rows, *columns), (rows,)
                else:  # a LayerNorm: weight and bias (d_model,)
                    out[f"{part}.{i}.{module}.weight"] = out[f"{part}.{i}.{module}.bias"] = (rows,)
    if m.norm == "pre":  # pre-norm stacks end in a LayerNorm of their own
        for name in ("enc_norm.weight", "enc_norm.bias", "dec_norm.weight", "dec_norm.bias"):
            out[name] = ("d_model",)
    out["output.weight"] = ("tgt_vocab_size", "d_model")
    if m.output_bias:
        out["output.bias"] = ("tgt_vocab_size",)
    return out


def size(dim: str, m: ModelConfig) -> int:
    """A dimension's size: "3·d_model" is 3 × model.d_model."""
    times, _, key = dim.rpartition("·")
    return int(times or 1) * getattr(m, key)


def shapes(m: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every weight of the model `m` describes, by name, its shape."""
    return {name: tuple(size(d, m) for d in shape) for name, shape in dims(m).items()}


def check_weights(weights: Any, m: ModelConfig, where: str) -> None:
    """`weights` must be the state dict of the model `m` describes: its names, each a floating-point tensor of its
    shape, tied tables equal, and a position table no larger than the weights allow. `where` names the file and
    part ("best.pt: model") in the one-line error."""
    if not isinstance(weights, dict) or not all(isinstance(name, str) for name in weights):
        raise MtError(f"{where}: not a state dict (a mapping of weight names to tensors)")
    counts = {"encoder": (f"model.n_enc_layers={m.n_enc_layers}", m.n_enc_layers),
              "decoder": (f"model.n_dec_layers={m.n_dec_layers}", m.n_dec_layers)}
    check_layer_counts(weights, counts, where)  # before `dims`, which takes as long as the config's layer counts
    expected = dims(m)
    missing = [name for name in expected if name not in weights]
    if missing:
        raise MtError(f"{where}: no {missing[0]}{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}, "
                      f"which the config's model has; the file is damaged, or its config is not its weights'")
    extra = [name for name in weights if name not in expected]
    if extra:
        raise MtError(f"{where}: {extra[0]}{f' (and {len(extra) - 1} more)' if len(extra) > 1 else ''} is no "
                      f"weight of the config's model; the file is damaged, or its config is not its weights'")
    for name, shape in expected.items():
        tensor = weights[name]
        if not isinstance(tensor, torch.Tensor) or tensor.layout != torch.strided or tensor.is_meta:
            raise MtError(f"{where}: {name} is {type(tensor).__name__}, not a dense tensor of weights")
        if not tensor.dtype.is_floating_point:
            raise MtError(f"{where}: {name} holds {tensor.dtype} values; weights are floating point")
        if tuple(tensor.shape) != (sizes := tuple(size(d, m) for d in shape)):
            fields = " and ".join(dict.fromkeys(f"model.{d.rpartition('·')[2]}={size(d.rpartition('·')[2], m)}"
                                                for d in shape))
            raise MtError(f"{where}: {name} is {format_shape(tensor.shape)}; {fields} "
                          f"make{'' if ' and ' in fields else 's'} it {format_shape(sizes)}")
    check_tied(weights, m, where)
    check_positions(weights, m, where)


def check_layer_counts(names: Any, counts: dict[str, tuple[str, int]], where: str, pattern: re.Pattern = LAYER,
                       layer: str = "{part}.{i}") -> None:
    """The config's layer counts must be the weights': a config that claims a million layers is refused here, not
    after a million layers' worth of names. `counts` gives each part's (setting, count); `pattern` finds a weight's
    part and layer in its name, and `layer` names a layer (mt's, or Marian's: mt/export/marian_files.py)."""
    found: dict[str, set[int]] = {part: set() for part in counts}
    for name in names:
        if (match := pattern.match(name)) and match[1] in found:
            found[match[1]].add(int(match[2]))
    for part, (setting, n) in counts.items():
        if len(found[part]) != n or (n and max(found[part]) != n - 1):  # 0 to n - 1, each once
            held = f"{part} layers {format_numbers(sorted(found[part]))}" if found[part] else f"no {part} layers"
            gap = next((i for i in range(min(n, len(found[part]) + 1)) if i not in found[part]), None)
            lacking = f"lack {layer.format(part=part, i=gap)} and " if gap is not None else ""
            raise MtError(f"{where}: {setting}, but the weights {lacking}hold {held}; the file is damaged, or its "
                          f"config is not its weights'")


def check_tied(weights: dict[str, Any], m: ModelConfig, where: str) -> None:
    """Tables the config ties are one table in the model: loading two different ones would keep one of them and
    silently drop the other."""
    ties = ([("src_embed.weight", "model.share_embeddings")] if m.share_embeddings else []) \
        + ([("output.weight", "model.tie_output")] if m.tie_output else [])
    table = weights["tgt_embed.weight"]
    for name, key in ties:
        other = weights[name]
        same = other.data_ptr() == table.data_ptr() and other.stride() == table.stride()
        if not (same or torch.equal(other, table)):
            raise MtError(f"{where}: {key} is true, but {name} and tgt_embed.weight differ; the file is damaged, "
                          f"or its config is not its weights'")


def check_positions(weights: dict[str, Any], m: ModelConfig, where: str) -> None:
    """The position table is built, not stored: it may be no larger than the weights themselves (or than
    POSITIONS_FLOOR values), so that a config cannot make a small file allocate gigabytes."""
    present = sum(tensor.numel() for tensor in weights.values())
    bound = max(present, POSITIONS_FLOOR)
    if m.max_len * m.d_model > bound:
        raise MtError(f"{where}: model.max_len={m.max_len} makes a position table of {m.max_len * m.d_model:,} "
                      f"values (max_len × d_model), more than the {present:,} weights it would serve; the file "
                      f"is damaged, or its config is not its weights'")


def format_shape(shape: tuple[int, ...] | torch.Size) -> str:
    return f"({', '.join(map(str, shape))}{',' if len(shape) == 1 else ''})"


def format_numbers(numbers: list[int]) -> str:
    """0-5, 7: a few numbers, in runs."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    text = ", ".join(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]) for run in runs[:5])
    return text + (", ..." if len(runs) > 5 else "")
