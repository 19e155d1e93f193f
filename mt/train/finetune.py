"""Fine-tuning: a new run whose weights start from a trained model (`mt train CONFIG --init CHECKPOINT`).

Only the weights carry over (those translation uses: `model` of best.pt, last.pt or `mt average`'s output);
the optimizer, the schedule, the data position, the step count and the best score start fresh, as fairseq's
`--reset-*` flags or OpenNMT-py's `-reset_optim all` do. The checkpoint's architecture, vocabulary and languages
must be the run's: anything else is an error before anything is written. Dropout may change.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mt import checkpoint
from mt.config import Config, from_dict, to_dict
from mt.data.tokenizer import Tokenizer
from mt.errors import MtError

NOT_WITH_RESUME = ("--init starts a new run from a checkpoint's weights; --resume continues a run with the weights "
                   "it has: give one of them")
# Model keys that may differ from the checkpoint's: they shape no weight.
FREE = frozenset({"dropout", "attn_dropout", "act_dropout"})


@dataclass
class Init:
    """The checkpoint a run starts from."""

    path: Path
    step: int  # the step it was saved at, in its own run
    weights: dict[str, Any]

    def record(self) -> dict[str, Any]:
        """What every checkpoint of the new run says of where it started (shown by `mt info`)."""
        return {"from": str(self.path), "step": self.step}


def load_init(path: Path, cfg: Config, src_tok: Tokenizer, tgt_tok: Tokenizer, meta: dict) -> Init:
    """The checkpoint at `path`, checked against the run's data (`meta`, its tokenizers) and its config, whose
    vocabulary sizes are already taken from the data."""
    saved = checkpoint.load(path)
    state_dict = checkpoint.weights(saved, path, "fine-tuning")
    data_dir = Path(cfg.data)
    check_languages(saved, path, meta, data_dir)
    check_vocabulary(saved, path, {"src": src_tok, "tgt": tgt_tok}, meta, data_dir)
    check_architecture(saved, path, cfg)
    return Init(path, int(saved.get("step") or 0), state_dict)


def check_languages(saved: dict, path: Path, meta: dict, data_dir: Path) -> None:
    langs = saved.get("langs") or {}
    have = (meta.get("src"), meta.get("tgt"))
    want = (langs.get("src"), langs.get("tgt"))
    if None not in want and None not in have and have != want:
        raise MtError(f"{data_dir}: its languages are {have[0]}→{have[1]}, but {path} translates "
                      f"{want[0]}→{want[1]}; fine-tune on {want[0]}→{want[1]} data (mt prepare --src {want[0]} "
                      f"--tgt {want[1]} ... --tokenizer {path})")


def check_vocabulary(saved: dict, path: Path, tokenizers: dict[str, Tokenizer], meta: dict, data_dir: Path
                     ) -> None:
    """The data's SentencePiece model of each side must be the checkpoint's, byte for byte (by sha256), so that
    every id means the piece the model learned it as."""
    recorded = (meta.get("tokenizer") or {}).get("sha256") or {}
    for side, tok in tokenizers.items():
        want = hashlib.sha256(saved["spm"][side]).hexdigest()
        have = recorded.get(side) or hashlib.sha256(tok.model_proto).hexdigest()
        if have != want:
            raise MtError(f"{data_dir}: prepared with another {side} vocabulary than {path} "
                          f"({difference(Tokenizer(saved['spm'][side]), tok)}); prepare it with the checkpoint's: "
                          f"{prepare_command(meta, path, data_dir)}")


def difference(model: Tokenizer, data: Tokenizer) -> str:
    """How two vocabularies differ, in a few words."""
    if model.vocab_size != data.vocab_size:
        return f"{data.vocab_size:,} pieces, the model's {model.vocab_size:,}"
    for i, (in_model, in_data) in enumerate(zip(model.pieces(), data.pieces(), strict=True)):
        if in_model != in_data:
            return f"id {i} is {in_data!r} in the data, {in_model!r} in the model's; {model.vocab_size:,} pieces each"
    return "the same pieces with other scores, which segment text differently"


def prepare_command(meta: dict, path: Path, data_dir: Path) -> str:
    """The `mt prepare` command that writes this data again with the checkpoint's vocabulary."""
    corpus = (meta.get("inputs") or {}).get("corpus")
    inputs = corpus or "(the same --train/--valid/--test)"
    return (f"mt prepare {inputs} --src {meta.get('src')} --tgt {meta.get('tgt')} --tokenizer {path} "
            f"--out {data_dir}")


def check_architecture(saved: dict, path: Path, cfg: Config) -> None:
    """The run's model config must build the checkpoint's model; dropout rates may differ."""
    have, want = to_dict(cfg)["model"], to_dict(from_dict(saved["config"]))["model"]  # older: defaults filled
    differ = [f"model.{key}={have[key]} (the checkpoint's: {want[key]})" for key in have
              if key not in FREE and have[key] != want[key]]
    if differ:
        raise MtError(f"{path}: its architecture differs from the config's: {', '.join(differ)}; a fine-tuned "
                      f"model keeps its checkpoint's architecture: set these as the checkpoint has them "
                      f"(`mt info {path}` shows its config)")
