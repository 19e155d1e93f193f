"""`mt import`: a Hugging Face MarianMTModel directory (an OPUS-MT model, say) as an mt checkpoint, the same model.
The reverse of mt/export/huggingface.py; the model's differences of layout are mapped exactly:
- the model dimension: Marian lays its sinusoids out [sin | cos] where mt interleaves them, so every weight that
  reads or writes the residual stream is permuted back (the inverse of the export's `permutation`);
- queries, keys and values: three projections in Marian, fused in mt;
- the ids: Marian's come from vocab.json (OPUS-MT: </s> 0, <unk> 1, ..., <pad> last), and its SentencePiece models
  number the pieces otherwise; mt needs PAD, UNK, BOS, EOS = 0, 1, 2, 3 in the tables and the SentencePiece models
  alike. Each SentencePiece model is rewritten (mt/data/spm_proto.py) to hold a piece per mt id, the special ones
  first, then vocab.json's in its order; every piece keeps its text, score and type, so text is cut into the same
  pieces, and the tables' rows follow. Marian decodes from <pad>: its row becomes mt's BOS;
- what Marian has no id for: mt's PAD (Marian pads with its start token), and any piece of a SentencePiece model
  that vocab.json lacks (Marian reads it as <unk>). Such an id reads as <unk> and is never written: its output
  bias is ABSENT;
- the output layer's bias (final_logits_bias): model.output_bias, set when it is not all zeros or an id is absent.
What mt's model cannot compute is refused in one line that names the setting, and nothing is written. So is a
directory whose files disagree, before anything is read whole, allocated or built (mt/export/marian_files.py); what
a setting of generation_config.json does that mt's decoding does not is named in the summary.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import sentencepiece as spm
import torch
from torch import Tensor

from mt import checkpoint
from mt.config import Config, ModelConfig, shown, to_dict, validate
from mt.data.lines import check_not_input, check_output
from mt.data.spm_proto import BYTE, CONTROL, NORMAL, UNUSED, USER_DEFINED, Piece, read_pieces, with_pieces
from mt.data.tokenizer import Tokenizer
from mt.errors import MtError
from mt.export.huggingface import layer_names, permutation
from mt.export.marian_files import (
    beam_of,
    check_shapes,
    check_values,
    input_files,
    not_carried,
    read_json,
    read_spm,
    read_vocab,
    read_weights,
    text_value,
    weight_headers,
)
from mt.model.transformer import Transformer, sinusoids
from mt.shapes import check_weights

# The output bias of an id Marian's model lacks: e^-1000 is 0 in float32, so it takes none of the probability.
ABSENT = -1000.0
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish"}  # transformers' name: mt's
# MarianConfig's defaults, for a config.json that leaves a key out (transformers 4 and 5 alike).
DEFAULTS = dict(vocab_size=58101, decoder_vocab_size=None, max_position_embeddings=1024, encoder_layers=12,
                decoder_layers=12, encoder_ffn_dim=4096, decoder_ffn_dim=4096, encoder_attention_heads=16,
                decoder_attention_heads=16, activation_function="gelu", d_model=1024, dropout=0.1,
                attention_dropout=0.0, activation_dropout=0.0, scale_embedding=False, pad_token_id=58100,
                decoder_start_token_id=58100, eos_token_id=0, share_encoder_decoder_embeddings=True,
                tie_word_embeddings=True)
# Settings of older Marian and BART configs that transformers' MarianMTModel ignores and mt's model lacks: a
# config.json that turns one of them away from this value describes a model neither computes.
IGNORED = {"normalize_before": False, "add_final_layer_norm": False, "normalize_embedding": False,
           "layernorm_embedding": False, "static_position_embeddings": True}


def import_marian(directory: str | Path, out: str | Path, src: str | None = None, tgt: str | None = None) -> dict:
    """Write the MarianMTModel in `directory` as the mt checkpoint `out`; returns the checkpoint's state. `src` and
    `tgt` name its languages where tokenizer_config.json does not."""
    directory, out = Path(directory), Path(out)
    files = input_files(directory)
    check_not_input(out, "--out", [directory, *files.values()])
    if directory.resolve() in out.resolve().parents:
        raise MtError(f"--out {out} is inside {directory}: leave the model directory as it is, and write the "
                      f"checkpoint elsewhere")
    check_output(out, "--out", create_parent=True)
    config = DEFAULTS | read_json(files["config"])
    check_values(config, files["config"])
    tokenizer = read_json(files["tokenizer"]) if "tokenizer" in files else {}
    langs = {"src": src or text_value(tokenizer, "source_lang", files), "tgt": tgt or text_value(
        tokenizer, "target_lang", files)}
    model = model_config(config)
    check_shapes(weight_headers(files["weights"]), config, model, files["weights"])  # before anything is read
    sides = vocabularies(files, config, tokenizer)
    model.src_vocab_size, model.tgt_vocab_size = len(sides["src"].rows), len(sides["tgt"].rows)
    model.share_embeddings = config["share_encoder_decoder_embeddings"] and sides["src"].rows == sides["tgt"].rows
    model.tie_output = config["tie_word_embeddings"]
    weights = mt_weights(read_weights(files["weights"]), config, model, sides)
    model.output_bias = "output.bias" in weights
    cfg = Config(model=model)
    generation = read_json(files["generation"]) if "generation" in files else config  # older: in config.json
    cfg.decode.beam = beam_of(generation, files.get("generation", files["config"]))
    validate(cfg)
    check_weights(weights, model, f"{directory}: the weights as mt's")  # the mapping's own result, checked as loaded
    transformer = Transformer(model)
    transformer.load_state_dict(weights)  # every weight of mt's model, each in its shape
    state = {"model": transformer.state_dict(), "config": to_dict(cfg),
             "spm": {side: sides[side].spm for side in ("src", "tgt")}, "langs": langs if all(langs.values()) else None,
             "step": 0, "metrics": {}, "imported": {"from": str(directory), "marian_ids": {
                 side: sides[side].marian_ids() for side in ("src", "tgt")},
                 "not_carried": not_carried(generation, config)}}
    checkpoint.save(state, out)  # to a temporary name, renamed into place
    return state


def as_json(value: object) -> str:
    """A config.json value as JSON writes it (true, null), or cut short (with "...") where it runs long."""
    return json.dumps(value) if isinstance(value, (bool, type(None))) else shown(value)


def model_config(config: dict) -> ModelConfig:
    """mt's model config for a Marian config.json (without the vocabulary), or the setting mt cannot compute."""
    if config.get("model_type") != "marian":
        raise MtError(f"config.json: model_type {config.get('model_type')!r}: not a Marian model")
    for key, value in IGNORED.items():
        if config.get(key, value) != value:
            raise MtError(f"config.json: {key} {as_json(config[key])}: transformers' MarianMTModel ignores it and "
                          f"mt's model has no such part; mt computes the model only as {key} {as_json(value)}")
    activation = config["activation_function"]  # a string (check_values)
    if activation not in ACTIVATIONS:
        raise MtError(f"config.json: activation_function {activation!r}: mt's model has relu, gelu and swish")
    for part in ("attention_heads", "ffn_dim"):
        if config[f"encoder_{part}"] != config[f"decoder_{part}"]:
            raise MtError(f"config.json: encoder_{part} {config[f'encoder_{part}']} and decoder_{part} "
                          f"{config[f'decoder_{part}']}: mt's model has one for both")
    if not config["scale_embedding"] and config["tie_word_embeddings"]:
        raise MtError("config.json: scale_embedding false with tie_word_embeddings: mt scales the embeddings by "
                      "sqrt(d_model), which a table that is also the output layer cannot undo")
    if config["d_model"] % 2 or config["d_model"] % config["encoder_attention_heads"]:
        raise MtError(f"config.json: d_model {config['d_model']}: mt needs it even and divisible by the heads")
    return ModelConfig(d_model=config["d_model"], n_heads=config["encoder_attention_heads"],
                       n_enc_layers=config["encoder_layers"], n_dec_layers=config["decoder_layers"],
                       d_ff=config["encoder_ffn_dim"], activation=ACTIVATIONS[activation], norm="post",
                       dropout=config["dropout"], attn_dropout=config["attention_dropout"],
                       act_dropout=config["activation_dropout"], max_len=config["max_position_embeddings"])


@dataclass
class Side:
    """One side's vocabulary in mt's ids: the SentencePiece model that numbers its pieces so, the row of Marian's
    tables each id takes, and the ids Marian has none for (they read as <unk> and are never written)."""

    spm: bytes
    rows: list[int]
    absent: list[int]

    def marian_ids(self) -> list[int]:
        """Marian's id of each mt id, -1 for none: what the checkpoint records of where its ids came from."""
        absent = set(self.absent)
        return [-1 if i in absent else row for i, row in enumerate(self.rows)]


def vocabularies(files: dict[str, Path], config: dict, tokenizer: dict) -> dict[str, Side]:
    """Each side's vocabulary: vocab.json for both, or, with separate_vocabs, vocab.json and target_vocab.json."""
    protos = {side: read_spm(files[f"{name}_spm"]) for side, name in (("src", "source"), ("tgt", "target"))}
    tokens = {role: special_token(tokenizer, role, default) for role, default in
              (("unk", "<unk>"), ("eos", "</s>"), ("pad", "<pad>"))}
    vocab = read_vocab(files["vocab"], config["vocab_size"], tokens)
    tags = [piece for piece in vocab if piece.startswith(">>") and piece.endswith("<<")]  # MarianTokenizer's test
    if tags:
        raise MtError(f"vocab.json: {', '.join(tags[:3])}{' ...' if len(tags) > 3 else ''}: a multi-target model, "
                      f"which reads the tag of the language wanted before each sentence; mt cannot put it there yet")
    if not tokenizer.get("separate_vocabs"):
        if config["decoder_vocab_size"] not in (None, config["vocab_size"]):
            raise MtError(f"config.json: decoder_vocab_size {config['decoder_vocab_size']} is not vocab_size "
                          f"{config['vocab_size']}, but the directory has one vocabulary (vocab.json) for both")
        ids = target_ids(vocab, config, tokens, "vocab.json")
        order = id_order(vocab, ids, [protos["src"], protos["tgt"]])
        return {side: side_of(protos[side], order, f"{name}.spm")
                for side, name in (("src", "source"), ("tgt", "target"))}
    if "target_vocab" not in files:
        raise MtError("tokenizer_config.json: separate_vocabs, but the directory has no target_vocab.json")
    target = read_vocab(files["target_vocab"], config["decoder_vocab_size"] or config["vocab_size"], tokens)
    source_order = id_order(vocab, source_ids(vocab, tokens), [protos["src"]])
    target_order = id_order(target, target_ids(target, config, tokens, "target_vocab.json"), [protos["tgt"]])
    return {"src": side_of(protos["src"], source_order, "source.spm"),
            "tgt": side_of(protos["tgt"], target_order, "target.spm")}


def special_token(tokenizer: dict, role: str, default: str) -> str:
    """tokenizer_config.json's text of a special token (a string, or an AddedToken's {"content": ...})."""
    value = tokenizer.get(f"{role}_token", default)
    text = value.get("content", default) if isinstance(value, dict) else value
    if not isinstance(text, str):
        raise MtError(f"tokenizer_config.json: {role}_token {shown(value)}: expected the token's text, or "
                      f'{{"content": TEXT}}')
    return text


@dataclass
class MarianIds:
    """A vocabulary's special ids in Marian's model; `start`, the token Marian decodes from, is what mt's BOS
    takes the place of."""

    pad: int
    unk: int
    start: int
    eos: int


def target_ids(vocab: dict[str, int], config: dict, tokens: dict[str, str], name: str) -> MarianIds:
    """The decoder's special ids, as config.json names them (OPUS-MT: pad and start one token)."""
    ids = MarianIds(config["pad_token_id"], vocab[tokens["unk"]], config["decoder_start_token_id"],
                    config["eos_token_id"])
    for key in ("pad_token_id", "decoder_start_token_id"):
        if config[key] >= len(vocab):
            raise MtError(f"config.json: {key} {config[key]}: not an id of {name} (0 to {len(vocab) - 1:,})")
    if ids.eos != vocab[tokens["eos"]]:
        raise MtError(f"config.json: eos_token_id {ids.eos} is not {name}'s {tokens['eos']} "
                      f"({vocab[tokens['eos']]}); mt ends source and output on one token")
    if len({ids.pad, ids.unk, ids.start, ids.eos}) < (3 if ids.pad == ids.start else 4):
        raise MtError(f"config.json: the special ids {ids} share a value; mt needs pad (or start), unk and eos apart")
    return ids


def source_ids(vocab: dict[str, int], tokens: dict[str, str]) -> MarianIds:
    """A separate source vocabulary's special ids. The source never holds a start token: BOS takes <s> where the
    vocabulary has one (an mt export's), else the pad token (OPUS-MT's)."""
    pad = vocab[tokens["pad"]]
    return MarianIds(pad, vocab[tokens["unk"]], vocab.get("<s>", pad), vocab[tokens["eos"]])


@dataclass
class Entry:
    """An mt id: its piece's text (None for the four special ones: each SentencePiece model has its own), the row
    of Marian's tables it takes, and whether Marian has an id for it."""

    text: str | None
    row: int
    absent: bool = False


def id_order(vocab: dict[str, int], ids: MarianIds, protos: list[bytes]) -> list[Entry]:
    """mt's ids in order: PAD, UNK, BOS and EOS, Marian's other ids in its order, then the pieces of the
    SentencePiece models that vocab.json lacks. The absent ones (PAD where Marian pads with its start token, and
    the lacking pieces) take <unk>'s row."""
    text = {i: piece for piece, i in vocab.items()}
    special = [ids.pad, ids.unk, ids.start, ids.eos]
    order = [Entry(None, ids.unk, absent=True) if ids.pad == ids.start else Entry(None, ids.pad)]
    order += [Entry(None, i) for i in special[1:]] + [Entry(text[i], i) for i in range(len(text)) if i not in special]
    lacking = {}  # in order, once each
    for proto in protos:
        special = special_pieces(proto)
        lacking |= {piece.text: None for i, piece in enumerate(read_pieces(proto))
                    if piece.text not in vocab and i not in special}
    return order + [Entry(piece, ids.unk, absent=True) for piece in lacking]


def special_pieces(proto: bytes) -> list[int]:
    """The ids of a SentencePiece model's pad, unk, bos and eos pieces; -1 for one it does not have."""
    sp = spm.SentencePieceProcessor(model_proto=proto)
    return [sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()]


def side_of(proto: bytes, order: list[Entry], name: str) -> Side:
    """A side's vocabulary: its SentencePiece model rewritten to number its pieces in `order` (kept byte for byte
    where it already does), with the rows and the absent ids of that order."""
    pieces, special = read_pieces(proto), special_pieces(proto)
    defaults = [Piece("<pad>", 0.0, CONTROL), None, Piece("<s>", 0.0, CONTROL), Piece("</s>", 0.0, CONTROL)]
    head = [pieces[i] if i >= 0 else default for i, default in zip(special, defaults, strict=True)]
    own = {piece.text: piece for i, piece in enumerate(pieces) if i not in special}
    reserved = {piece.text for piece in head}
    for entry in order[4:]:
        if entry.text in reserved:
            raise MtError(f"{name}: {entry.text!r} (Marian id {entry.row}) is an ordinary token of the model but a "
                          f"special piece of {name}; mt cannot give it an id of its own")
    known = {char for piece in pieces if piece.type in (NORMAL, USER_DEFINED) for char in piece.text}
    unknown_pieces = not any(piece.type == BYTE for piece in pieces)  # byte fallback spells unknown text in bytes
    lowest = min(piece.score for piece in pieces) - 1  # below every piece: BPE merges an unused one last, if ever
    new = head + [own.get(entry.text) or other_piece(entry.text, known, unknown_pieces, lowest)
                  for entry in order[4:]]
    rewritten = proto if new == pieces else with_pieces(proto, new)
    try:
        Tokenizer(rewritten)  # mt's special ids, checked
    except RuntimeError as e:  # SentencePiece's refusal, should a piece come twice
        raise MtError(f"{name}: its pieces in vocab.json's order do not make a SentencePiece model ({e})") from None
    return Side(rewritten, [entry.row for entry in order], [i for i, entry in enumerate(order) if entry.absent])


def other_piece(text: str, known: set[str], unknown_pieces: bool, lowest: float) -> Piece:
    """A piece of Marian's vocabulary that is not one of this SentencePiece model's (one vocab.json for two models:
    the other side's): unused, never cut from text. Unless the model knows none of its characters (`known`) and
    makes unknown pieces: then SentencePiece hands a run of them to Marian as one unknown piece, which Marian looks
    up in vocab.json, so here it is a user-defined piece, cut out whole."""
    if unknown_pieces and not set(text) & known:
        return Piece(text, 0.0, USER_DEFINED)
    return Piece(text, lowest, UNUSED)


def mt_weights(w: dict[str, Tensor], config: dict, m: ModelConfig, sides: dict[str, Side]) -> dict[str, Tensor]:
    """Marian's state dict as mt's: the model dimension permuted back, the tables' rows in mt's ids. Every weight
    is used once; one mt's model has no place for is refused."""
    q = torch.argsort(permutation(m.d_model))  # mt's column i is Marian's column q[i]
    shared = w.pop("model.shared.weight", None)
    encoder_table = w.pop("model.encoder.embed_tokens.weight", shared)
    decoder_table = w.pop("model.decoder.embed_tokens.weight", shared)
    lm_head = w.pop("lm_head.weight", None)
    output = decoder_table if config["tie_word_embeddings"] else lm_head
    if encoder_table is None or decoder_table is None or output is None:
        raise MtError("the weights hold no embedding table or output layer (model.shared.weight, "
                      "model.*.embed_tokens.weight, lm_head.weight): not a MarianMTModel's")
    if output is not lm_head and lm_head is not None and not torch.equal(lm_head, decoder_table):
        raise MtError("lm_head.weight is not the decoder's table, but config.json's tie_word_embeddings makes it "
                      "that table: one of the two would be dropped; set tie_word_embeddings false, or store one")
    # The embeddings are scaled by sqrt(d_model) in mt; an unscaled Marian model's untied tables are scaled down.
    scale = 1.0 if config["scale_embedding"] else m.d_model ** -0.5
    src, tgt = sides["src"], sides["tgt"]
    out = {"src_embed.weight": encoder_table[src.rows][:, q] * scale,
           "tgt_embed.weight": decoder_table[tgt.rows][:, q] * scale, "output.weight": output[tgt.rows][:, q]}
    bias = w.pop("final_logits_bias", torch.zeros(1, len(output)))[0][tgt.rows]  # (1, rows): check_shapes
    bias[tgt.absent] = ABSENT
    if bias.any():  # else mt's model without one (`model.output_bias`), as an exported mt model comes back
        out["output.bias"] = bias
    for part in ("encoder", "decoder"):
        check_positions(w.pop(f"model.{part}.embed_positions.weight", None), m, part)
    try:
        for mt, hf, reads in layer_names(m):  # Marian's separate projections fused into mt's one
            weight = torch.cat([w.pop(f"{name}.weight") for name in hf])
            bias = torch.cat([w.pop(f"{name}.bias") for name in hf])
            out[f"{mt}.weight"], out[f"{mt}.bias"] = (weight[:, q], bias) if reads else (weight[q], bias[q])
    except KeyError as e:
        raise MtError(f"the weights have no {e.args[0]}, which config.json's layers need") from None
    if w:
        raise MtError(f"the weights hold {', '.join(sorted(w)[:3])}{' ...' if len(w) > 3 else ''}: parts of a "
                      f"Marian variant that mt's model has no place for")
    if m.share_embeddings:
        out["src_embed.weight"] = out["tgt_embed.weight"]  # one table (the rows are the same ids)
    if m.tie_output:
        out["output.weight"] = out["tgt_embed.weight"]
    return {name: tensor.contiguous() for name, tensor in out.items()}


def check_positions(table: Tensor | None, m: ModelConfig, part: str) -> None:
    """A stored position table (older files keep one) must be Marian's sinusoids: mt makes them itself."""
    if table is None:
        return
    expected = sinusoids(len(table), m.d_model)[:, permutation(m.d_model)]
    if table.shape != expected.shape or (table - expected).abs().max() > 1e-2:  # float16 files: 1e-3 apart
        raise MtError(f"model.{part}.embed_positions.weight: a learned position table, not Marian's sinusoids; "
                      f"mt's positions are the sinusoids")


def summary(state: dict, out: Path) -> str:
    """One line: what was written, the pieces Marian had no id for, and what of generation_config.json mt does
    not do."""
    m = state["config"]["model"]
    langs = state["langs"] or {"src": "?", "tgt": "?"}
    ids = state["imported"]["marian_ids"]
    sides = [ids["src"]] if ids["src"] == ids["tgt"] else [ids["src"], ids["tgt"]]  # one vocabulary, or two
    absent = sum(side[4:].count(-1) for side in sides)
    lacking = f"; {absent} pieces the vocabulary lacks read as <unk> and are never written" if absent else ""
    dropped = state["imported"].get("not_carried")
    unlike = (f"; generation_config.json's {', '.join(dropped)}: not carried over (mt's decode settings apply; "
              f"`mt tune` chooses them)") if dropped else ""
    return (f"wrote {out}: {langs['src']}→{langs['tgt']}, {m['n_enc_layers']}+{m['n_dec_layers']} layers, d_model "
            f"{m['d_model']}, {m['activation']}, {m['src_vocab_size']:,} source and {m['tgt_vocab_size']:,} target "
            f"ids{lacking}{unlike}")
