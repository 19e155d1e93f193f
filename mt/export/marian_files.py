"""A Hugging Face MarianMTModel directory's files as `mt import` (mt/export/from_marian.py) reads them: within
bounds, and checked before anything is read whole, allocated or built. config.json's values must be of a
MarianConfig's types and ranges, then the weights' shapes (from the file's header, not its data) what config.json
makes them, and vocab.json must number the rows the tables have: a config.json that claims a vocabulary, width or
depth the weights lack costs nothing, and is one line naming the file, the key and what was expected.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import sentencepiece as spm
import torch
from torch import Tensor

from mt import checkpoint
from mt.config import MAX_BEAM, MAX_LEN, DecodeConfig, ModelConfig, shown
from mt.data.spm_proto import read_pieces
from mt.errors import MtError
from mt.export.huggingface import layer_names
from mt.shapes import check_layer_counts, format_shape, shapes


def input_files(directory: Path) -> dict[str, Path]:
    """The files of a MarianMTModel directory that the import reads, by role; an error names the first missing."""
    if not directory.is_dir():
        raise MtError(f"{directory}: not a directory; give a Hugging Face MarianMTModel directory (config.json, "
                      f"model.safetensors, source.spm, target.spm, vocab.json)")
    files = {"config": "config.json", "source_spm": "source.spm", "target_spm": "target.spm", "vocab": "vocab.json"}
    found = {role: directory / name for role, name in files.items()}
    missing = [name for role, name in files.items() if not found[role].is_file()]
    weights = [directory / name for name in ("model.safetensors", "pytorch_model.bin") if (directory / name).is_file()]
    if not weights:
        missing.append("model.safetensors (or pytorch_model.bin)")
    if missing:
        raise MtError(f"{directory}: no {', '.join(missing)}; a MarianMTModel directory has them (download the "
                      f"whole model)")
    found["weights"] = weights[0]
    for role, name in (("target_vocab", "target_vocab.json"), ("tokenizer", "tokenizer_config.json"),
                       ("generation", "generation_config.json")):
        if (directory / name).is_file():
            found[role] = directory / name
    return found


# The largest config, vocabulary or SentencePiece file read: OPUS-MT's are a few megabytes at most.
MAX_FILE = 64 << 20


def read_bounded(path: Path) -> bytes:
    if path.stat().st_size > MAX_FILE:
        raise MtError(f"{path}: {path.stat().st_size:,} bytes; a Marian model's {path.name} is a few megabytes, "
                      f"and more than {MAX_FILE:,} bytes is refused unread")
    return path.read_bytes()


def read_json(path: Path) -> dict:
    try:
        value = json.loads(read_bounded(path).decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:  # RecursionError: [[[[...
        raise MtError(f"{path}: not readable JSON ({type(e).__name__ if isinstance(e, RecursionError) else e})"
                      ) from None
    if not isinstance(value, dict):
        raise MtError(f"{path}: expected a JSON object")
    return value


# config.json's integers and the least each may be; each is an integer of at most 64 bits (not a boolean)
COUNTS = dict(vocab_size=1, max_position_embeddings=1, encoder_layers=0, decoder_layers=1, encoder_ffn_dim=1,
              decoder_ffn_dim=1, encoder_attention_heads=1, decoder_attention_heads=1, d_model=2, pad_token_id=0,
              decoder_start_token_id=0, eos_token_id=0)
FLAGS = ("scale_embedding", "share_encoder_decoder_embeddings", "tie_word_embeddings")
RATES = ("dropout", "attention_dropout", "activation_dropout")


def check_values(config: dict, path: Path) -> None:
    """config.json's values of the types and ranges a MarianConfig has, each refused by its key: before any of
    them sizes anything."""
    def refuse(key: str, expected: str) -> None:
        raise MtError(f"{path}: {key} {shown(config[key])}: expected {expected}")

    for key, least in COUNTS.items():
        value = config[key]
        if not isinstance(value, int) or isinstance(value, bool) or not least <= value < 1 << 63:
            refuse(key, f"an integer of at least {least} (of at most 64 bits)")
    if config["decoder_vocab_size"] is not None and (
            not isinstance(config["decoder_vocab_size"], int) or isinstance(config["decoder_vocab_size"], bool)
            or not 1 <= config["decoder_vocab_size"] < 1 << 63):
        refuse("decoder_vocab_size", "an integer of at least 1, or null")
    for key in FLAGS:
        if not isinstance(config[key], bool):
            refuse(key, "true or false")
    for key in RATES:
        if not isinstance(config[key], (int, float)) or isinstance(config[key], bool) or not 0 <= config[key] < 1:
            refuse(key, "a rate in [0, 1)")
    if not isinstance(config["activation_function"], str):
        refuse("activation_function", "the name of an activation")
    if config["max_position_embeddings"] > MAX_LEN:
        refuse("max_position_embeddings", f"at most {MAX_LEN:,} (mt's model.max_len)")


def text_value(settings: dict, key: str, files: dict[str, Path]) -> str | None:
    """A text setting of tokenizer_config.json (a language), or None where it has none."""
    value = settings.get(key)
    if value is not None and not isinstance(value, str):
        raise MtError(f"{files['tokenizer']}: {key} {shown(value)}: expected a language's code, or null")
    return value


def beam_of(generation: dict, path: Path) -> int:
    """generation_config.json's beam size (num_beams), or mt's default where it has none."""
    beam = generation.get("num_beams")
    if beam is None:
        return DecodeConfig.beam
    if not isinstance(beam, int) or isinstance(beam, bool) or not 1 <= beam <= MAX_BEAM:
        raise MtError(f"{path}: num_beams {shown(beam)}: expected a beam size from 1 to {MAX_BEAM:,}")
    return beam


# generation_config.json's settings that mt's decoding does as they say: the beam size, the special ids (mt's
# own), and what changes no output. Barring pad (OPUS-MT's bad_words_ids) mt does anyway: it is ABSENT.
CARRIED = {"num_beams", "bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id",
           "forced_eos_token_id", "renormalize_logits", "transformers_version", "_from_model_config"}


def not_carried(generation: dict, config: dict) -> list[str]:
    """The settings of generation_config.json that mt's decoding does not do (a length limit or penalty of
    transformers', sampling, ...), as `key value`, for the summary to name. (Older directories keep them in
    config.json, among the model's: not told apart.)"""
    if generation is config:
        return []
    barred = generation.get("bad_words_ids") in (None, [[config["pad_token_id"]]])
    return [f"{key} {shown(value)}" for key, value in generation.items()
            if key not in CARRIED and not (key == "bad_words_ids" and barred)]


def read_spm(path: Path) -> bytes:
    """A SentencePiece model's bytes, refused unless both SentencePiece and mt/data/spm_proto.py read them."""
    proto = read_bounded(path)
    try:
        if not proto:
            raise ValueError("the file is empty")
        spm.SentencePieceProcessor(model_proto=proto)
        read_pieces(proto)
    except (RuntimeError, ValueError) as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise MtError(f"{path}: not a SentencePiece model ({reason})") from None
    return proto


def read_vocab(path: Path, size: int, tokens: dict[str, str]) -> dict[str, int]:
    """vocab.json (piece → Marian id): it must number the model's rows 0 to size - 1, one piece each, and hold the
    special tokens."""
    vocab = read_json(path)
    if len(vocab) != size:
        raise MtError(f"{path}: {len(vocab):,} pieces for a table of {size:,} rows (config.json); a Marian "
                      f"vocabulary numbers every row once, from 0")
    wrong = next(((piece, i) for piece, i in vocab.items() if not isinstance(i, int) or isinstance(i, bool)), None)
    if wrong:
        raise MtError(f"{path}: {shown(wrong[0])} has the id {shown(wrong[1])}; an id is an integer")
    if sorted(vocab.values()) != list(range(size)):
        raise MtError(f"{path}: its ids are not 0 to {size - 1:,}, each once; a Marian vocabulary numbers every row "
                      f"once, from 0")
    for role, token in tokens.items():
        if token not in vocab:
            raise MtError(f"{path}: no {token} ({role}_token)")
    return vocab


def weight_headers(path: Path) -> dict[str, tuple[tuple[int, ...], bool]]:
    """Each weight of model.safetensors or pytorch_model.bin by name: its shape and whether it is floating point,
    read from the file's header (safetensors) or its tensors mapped, not read (torch: checkpoint.read_tensors)."""
    def floating(dtype: str) -> bool:  # safetensors' names: F16, BF16, F32, F8_E4M3, ..., I64, BOOL
        return dtype.startswith(("F", "BF"))

    try:
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), "pt") as f:
                return {name: (tuple(f.get_slice(name).get_shape()), floating(f.get_slice(name).get_dtype()))
                        for name in f.keys()}
        weights = checkpoint.read_tensors(path)
    except ImportError:
        raise MtError(f"{path}: reading it needs the safetensors package: pip install 'mt[export]'") from None
    except MtError:
        raise
    except Exception as e:  # truncated, corrupt, or not a state dict
        raise MtError(f"{path}: not readable weights ({str(e).strip().splitlines()[0] if str(e).strip() else e!r})"
                      ) from None
    if not isinstance(weights, dict) or not all(isinstance(t, Tensor) and t.layout == torch.strided
                                                for t in weights.values()):
        raise MtError(f"{path}: not a state dict (a mapping of weight names to tensors)")
    return {name: (tuple(t.shape), t.dtype.is_floating_point) for name, t in weights.items()}


def read_weights(path: Path) -> dict[str, Tensor]:
    """The state dict of model.safetensors or pytorch_model.bin (its headers checked: `check_shapes`), in float32
    (OPUS-MT's are stored in float16)."""
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            weights = load_file(str(path))
        else:
            weights = checkpoint.read_tensors(path)
    except Exception as e:  # changed since its headers were read
        raise MtError(f"{path}: not readable weights ({e})") from None
    return {name: tensor.float() for name, tensor in weights.items()}


MARIAN_LAYER = re.compile(r"model\.(encoder|decoder)\.layers\.(\d{1,9})\.")


def check_shapes(headers: dict[str, tuple[tuple[int, ...], bool]], config: dict, m: ModelConfig, path: Path
                 ) -> None:
    """Every weight of the file that config.json sizes, of the shape it makes: before anything is read, so a
    config.json that claims a vocabulary, width or depth its weights lack costs nothing."""
    counts = {part: (f"config.json's {part}_layers {config[f'{part}_layers']}", config[f"{part}_layers"])
              for part in ("encoder", "decoder")}
    check_layer_counts(headers, counts, str(path), MARIAN_LAYER, "model.{part}.layers.{i}")
    d, source_rows = m.d_model, config["vocab_size"]
    target_rows, target_key = (config["decoder_vocab_size"], "decoder_vocab_size") if config["decoder_vocab_size"] \
        else (source_rows, "vocab_size")
    source, target = f"vocab_size {source_rows} and d_model {d}", f"{target_key} {target_rows} and d_model {d}"
    expected = {"model.shared.weight": ((source_rows, d), source),
                "model.encoder.embed_tokens.weight": ((source_rows, d), source),
                "model.decoder.embed_tokens.weight": ((target_rows, d), target),
                "lm_head.weight": ((target_rows, d), target), "final_logits_bias": ((1, target_rows), target)}
    layers = shapes(replace(m, src_vocab_size=1, tgt_vocab_size=1))
    for mt, hf, _ in layer_names(m):  # mt's fused projection: Marian's pieces stacked
        rows, *columns = layers[f"{mt}.weight"]
        for name in hf:
            sizes = f"d_model {d} and encoder_ffn_dim {m.d_ff}" if "fc" in name else f"d_model {d}"
            expected[f"{name}.weight"] = ((rows // len(hf), *columns), sizes)
            expected[f"{name}.bias"] = ((rows // len(hf),), sizes)
    for part in ("encoder", "decoder"):  # a stored position table: any length, d_model wide
        name = f"model.{part}.embed_positions.weight"
        if name in headers:
            expected[name] = ((headers[name][0][0] if headers[name][0] else 0, d), f"d_model {d}")
    for name, (shape, sizes) in expected.items():  # the tables first: they say most of what config.json got wrong
        if name not in headers:
            continue  # a table held under another name, or a weight missing: `mt_weights` names it
        if not headers[name][1]:
            raise MtError(f"{path}: {name} holds no floating-point values; weights are floating point")
        if headers[name][0] != shape:
            raise MtError(f"{path}: {name} is {format_shape(headers[name][0])}; config.json's {sizes} "
                          f"make{'' if ' and ' in sizes else 's'} it {format_shape(shape)}")
