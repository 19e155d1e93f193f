"""One source of config truth: dataclass defaults, overridden by a YAML file, overridden by `--set key=value`.

A config has three sections (`model`, `train`, `decode`) plus `data`, the prepared-data directory. Every key
is checked: an unknown key or a value of the wrong type is an `MtError` that names the key and says what is
allowed. The resolved config is stored in every checkpoint and rebuilds the model from it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import reprlib
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from mt.errors import MtError


@dataclass
class ModelConfig:
    d_model: int = 512
    n_heads: int = 8
    n_enc_layers: int = 6
    n_dec_layers: int = 6
    d_ff: int = 2048
    activation: Literal["relu", "gelu", "swish"] = "relu"  # swish (SiLU): Marian's, that of most OPUS-MT models
    norm: Literal["post", "pre"] = "post"  # post-norm is the paper's; pre-norm trains deep stacks more stably
    dropout: float = 0.1  # on embeddings and every residual branch
    attn_dropout: float = 0.0  # on attention probabilities
    act_dropout: float = 0.0  # inside the FFN, after the activation
    max_len: int = 256  # longest sequence (in pieces, with BOS/EOS) the model is built for; at most MAX_LEN
    src_vocab_size: int = 0  # 0: taken from the prepared data
    tgt_vocab_size: int = 0
    share_embeddings: bool = True  # one table for source, target and output; needs a joint vocabulary
    tie_output: bool = True  # output projection = target embedding table
    # A bias on the output layer, as Marian's models have (final_logits_bias); `mt import` sets it, mt's own have none
    output_bias: bool = False
    # Generate the target last piece first (outputs are turned back before detokenizing): a second view of the
    # pair, to rerank a left-to-right model's n-best (benchmarks/rerank_valid.py)
    right_to_left: bool = False


MAX_LEN = 1 << 16  # positions: a sequence longer than this is no sentence, and its position table alone is gigabytes
MAX_BEAM = 1024  # a wider beam searches no better, and its cache grows with it: a stored default may not ask for more


@dataclass
class TrainConfig:
    max_tokens: int = 4096  # padded tokens (source or target, whichever is longer) per batch
    accumulate: int = 1  # batches per optimizer step
    lr: float = 7e-4  # peak learning rate, reached at the end of warmup
    warmup: int = 4000  # steps of linear warmup, then decay with 1/sqrt(step)
    # The last fraction of the budget (train.max_minutes if set, else train.max_steps) over which the learning rate
    # falls linearly to 0, so a run that stops on its budget ends annealed; 0: no cooldown.
    cooldown: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.98
    eps: float = 1e-9
    weight_decay: float = 0.0  # decoupled (AdamW): each step shrinks the weights by lr * weight_decay
    label_smoothing: float = 0.1
    # Epochs trained without dropout before the model's dropout rates apply (late dropout): a short budget learns
    # faster without it, a long one still needs it; 0: dropout from the start
    late_dropout: int = 0
    # One model for both directions: every epoch reads each pair both ways, each source led by the tag of the
    # language it is to be translated into (>>de<<); needs data prepared with `mt prepare --two-way`
    two_way: bool = False
    clip_norm: float = 0.0  # 0: no clipping
    max_steps: int = 100_000
    max_epochs: int = 0  # 0: no limit
    max_minutes: float = 0.0  # wall-clock budget; 0: no limit
    # Models trained one after another in the run, as one ensemble (mt/train/members.py): seeds seed, seed + 1000, ...,
    # each for max_minutes / members; `mt average` averages each and joins them (`mt ensemble`). 1: one model
    members: int = 1
    # With members and a time budget: member 1 trains to where its cooldown would start; if it is on course for
    # fewer steps than this in its share of the time, the run trains one model for the whole budget instead
    # (member 1 goes on), as members that short lose more than their ensemble wins back. 0: always the members
    member_min_steps: int = 0
    # With members: the last member trains right to left (model.right_to_left) and, instead of joining the others'
    # ensemble, reranks their beam's K best (mt/decode/rerank.py)
    rerank: bool = False
    valid_every: int = 1000  # steps between validations (and checkpoints)
    keep_checkpoints: int = 3  # numbered checkpoint-{step}.pt kept besides last.pt, to fall back on; 0: last.pt only
    max_bad_steps: int = 10  # non-finite steps in a row (each skipped) before training stops as diverged
    valid_bleu: bool = True  # decode the validation set and compute BLEU at each validation
    valid_beam: int = 1  # beam size of that decoding (1: greedy, the fastest); length penalty from decode
    patience: int = 0  # stop after this many validations in a row without a new best score; 0: never
    log_every: int = 100
    seed: int = 1
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # auto: bf16 (or fp16 with a grad scaler) on GPU; on CPU bf16 if native, else fp32 (fp16 on CPU: slow, for tests)
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    threads: int = 0  # CPU threads; 0: PyTorch's default
    # torch.compile the model for training; off, as it did not speed up CPU training (try it on GPUs)
    compile: bool = False


@dataclass
class DecodeConfig:
    beam: int = 4
    len_penalty: float = 0.6  # GNMT length-penalty exponent alpha; 0 ranks by raw log-probability
    max_len_a: float = 1.5  # output length limit: a * source_length + b
    max_len_b: int = 10
    batch_tokens: int = 4096  # source tokens per translation batch
    # With a right-to-left reranker in the checkpoint: w in (log P_l2r + w · log P_r2l) / (1 + w) (mt/decode/rerank.py)
    rerank_weight: float = 1.0
    # With a channel model (the reverse direction) in the checkpoint: c, the weight of its log P(source | output)
    channel_weight: float = 0.25
    # Beam search stops a sentence once its best finished hypothesis can no longer be beaten; true: once `beam` of
    # them have finished (fairseq's and Marian's stop), then takes the best: slower, at times better
    # (mt tune tries both)
    finish_all: bool = False


@dataclass
class Config:
    data: str = ""  # directory written by `mt prepare`
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)


# Keys that earlier versions wrote, and why they went: a stored config (a checkpoint's, a run's config.yaml) holding
# one still loads without it, with a note on stderr where it was on (`note_retired`); a config file or --set that
# turns one on is an error that says so.
RETIRED = {
    "train.ema": "the moving average of the weights was removed; average checkpoints with `mt average`",
    "train.rdrop": "R-Drop was dropped: behind the recipe on Multi30k, at twice a step's cost; see "
                   "docs/experiments.md",
    "train.word_dropout": "word dropout was dropped: no gain on Multi30k; see docs/experiments.md",
    "train.both_ways_epochs": "bidirectional training (BiT) was dropped: no gain on Multi30k; see "
                              "docs/experiments.md",
    "train.shared": "members that share a trunk were dropped: behind independent members; see "
                    "docs/experiments.md",
}


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> Config:
    """Defaults, then the YAML file at `path`, then each `key=value` override (`train.lr=1e-3`)."""
    raw: dict[str, Any] = {}
    if path is not None:
        raw = read_config_file(Path(path))
        refuse_retired(flatten(raw), str(path))
    return apply_overrides(from_dict(raw), overrides)


def read_config_file(path: Path) -> dict[str, Any]:
    """The nested dict a YAML config file holds."""
    if not path.is_file():
        raise MtError(f"{path}: config file not found")
    raw = read_yaml(path.read_text(encoding="utf-8"), str(path)) or {}
    if not isinstance(raw, dict):
        raise MtError(f"{path}: expected a mapping of sections (data, model, train, decode)")
    return raw


def refuse_retired(flat: dict[str, Any], where: str) -> None:
    """A config that someone writes (a file, --set) may not turn a retired key on: the run would not do what it says.
    Off, the key is harmless and left out."""
    for key, value in flat.items():
        if key in RETIRED and value:
            raise MtError(f"{where}: {key}={shown(value)}: {RETIRED[key]}; delete the key")


_noted: set[str] = set()  # the settings `note_retired` has named: a run's files, read several times, say it once


def note_retired(raw: dict[str, Any], source: str | Path) -> None:
    """One line on stderr, once, for each retired key that `raw`, a stored config read from `source`, had turned
    on: a checkpoint or run from an earlier version still loads, and says what it no longer does."""
    for key, value in flatten(raw).items():
        setting = f"{key}={shown(value)}"
        if key in RETIRED and value and setting not in _noted:
            _noted.add(setting)
            print(f"note: {setting} in {source} is no longer a setting of mt ({RETIRED[key]}); ignored",
                  file=sys.stderr)


def apply_overrides(cfg: Config, overrides: list[str]) -> Config:
    """Apply each `--set key=value` to `cfg` (the value read as YAML: `1e-3`, `true`, `pre`) and validate it."""
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise MtError(f"--set {item!r}: expected key=value, e.g. train.lr=0.001")
        key, value = key.strip(), read_yaml(value, f"--set {item}") if value.strip() else ""
        refuse_retired({key: value}, "--set")
        if key not in RETIRED:
            set_value(cfg, key, value)
    validate(cfg)
    return cfg


class NoAliases(yaml.SafeLoader):
    """YAML without aliases (`*name`): a config is short enough to write out, and aliases of aliases ("billion
    laughs") would expand a few lines into gigabytes. Errors name `self.name`, the file or --set item read."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise MtError(f"{self.name}:{event.start_mark.line + 1}: YAML alias *{event.anchor} refused: a config "
                          "does not repeat values by reference; write the value out")
        return super().compose_node(parent, index)


def read_yaml(text: str, name: str) -> Any:
    """The value YAML `text` holds, read without aliases; a mistake is an `MtError` naming `name` and the line."""
    loader = NoAliases(text)
    loader.name = name  # PyYAML's own marks then name it too
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = f":{mark.line + 1}" if mark else ""
        raise MtError(f"{name}{line}: not valid YAML ({e.problem or e.context})") from None
    except yaml.YAMLError as e:
        raise MtError(f"{name}: not valid YAML ({e})") from None
    finally:
        loader.dispose()


def from_dict(raw: dict[str, Any]) -> Config:
    """The config a nested dict describes (a checkpoint's, or a YAML file's), retired keys left out."""
    cfg = Config()
    for key, value in flatten(raw).items():
        if key not in RETIRED:
            set_value(cfg, key, value)
    validate(cfg)
    return cfg


def same_model(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two stored configs describe one architecture; a key added since either was written counts at its
    default, so checkpoints from before and after it still average and ensemble."""
    return from_dict(a).model == from_dict(b).model


def to_dict(cfg: Config) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def set_value(cfg: Config, key: str, value: Any) -> None:
    """Set a dotted key (`model.d_model`) with type checking."""
    section_name, _, name = key.rpartition(".")
    target: Any = cfg
    if section_name:
        sections = [f.name for f in dataclasses.fields(Config) if dataclasses.is_dataclass(f.default_factory)]
        if section_name not in sections or not name:
            raise MtError(f"unknown config section in {key!r}; sections are: {', '.join(sections)}")
        target = getattr(cfg, section_name)
    hints = type_hints(type(target))
    if not section_name and dataclasses.is_dataclass(getattr(target, name, None)):
        raise MtError(f"{key}={shown(value)}: a section, expected a mapping of its keys")
    scalar_keys = [f.name for f in dataclasses.fields(target) if not dataclasses.is_dataclass(getattr(target, f.name))]
    if name not in scalar_keys:
        where = f"section {section_name!r}" if section_name else "the top level"
        raise MtError(f"unknown config key {key!r}; valid keys in {where}: {', '.join(scalar_keys)}")
    setattr(target, name, _coerce(key, value, hints[name]))


@functools.cache
def type_hints(section: type) -> dict[str, Any]:
    """A section's field types, worked out once: `typing.get_type_hints` takes milliseconds, and every key of every
    config read (each checkpoint's, on every load) asks for them."""
    return typing.get_type_hints(section)


def validate(cfg: Config) -> None:
    flat = flatten(to_dict(cfg))
    positive = ("model.d_model", "model.n_heads", "model.d_ff", "model.max_len", "model.n_dec_layers",
                "train.max_tokens", "train.accumulate", "train.valid_every", "train.log_every", "train.valid_beam",
                "train.lr", "train.warmup", "train.max_steps", "train.eps", "decode.beam", "decode.batch_tokens")
    for key in positive:
        if flat[key] <= 0:
            raise MtError(f"{key}={flat[key]}: must be positive")
    for key in ("decode.beam", "train.valid_beam"):
        if flat[key] > MAX_BEAM:
            raise MtError(f"{key}={flat[key]}: at most {MAX_BEAM:,}")
    if cfg.model.max_len > MAX_LEN:
        raise MtError(f"model.max_len={cfg.model.max_len}: at most {MAX_LEN:,} positions")
    if cfg.model.d_model % cfg.model.n_heads:
        raise MtError(f"model.d_model={cfg.model.d_model} is not divisible by model.n_heads={cfg.model.n_heads}")
    fractions = ("model.dropout", "model.attn_dropout", "model.act_dropout", "train.label_smoothing",
                 "train.cooldown", "train.beta1", "train.beta2")
    for key in fractions:
        if not 0.0 <= flat[key] < 1.0:
            raise MtError(f"{key}={flat[key]}: must be in [0, 1)")
    at_least = {"train.keep_checkpoints": 0, "train.max_bad_steps": 1, "train.max_epochs": 0, "train.members": 1,
                "train.member_min_steps": 0, "train.max_minutes": 0, "train.weight_decay": 0,
                "train.clip_norm": 0, "train.threads": 0,
                "train.seed": 0, "model.n_enc_layers": 0, "model.src_vocab_size": 0, "model.tgt_vocab_size": 0,
                "decode.max_len_a": 0, "decode.max_len_b": 0, "decode.rerank_weight": 0,
                "decode.channel_weight": 0}
    for key, least in at_least.items():
        if flat[key] < least:
            raise MtError(f"{key}={flat[key]}: must be at least {least}")
    if not 0 <= cfg.decode.len_penalty <= 10:  # GNMT's alpha: 0 to 2 in practice; far beyond it overflows
        raise MtError(f"decode.len_penalty={cfg.decode.len_penalty}: must be in [0, 10]")
    if cfg.train.rerank and (cfg.train.members < 2 or cfg.model.right_to_left):
        raise MtError("train.rerank trains the last member right to left, to rerank the others' beam: it needs "
                      "train.members of 2 or more and a left-to-right model (model.right_to_left: false)")
    if cfg.train.patience < 0:
        raise MtError(f"train.patience={cfg.train.patience}: must be 0 (never stop early) or more")
    if cfg.train.late_dropout < 0:
        raise MtError(f"train.late_dropout={cfg.train.late_dropout}: must be 0 (dropout from the start) or more")


def flatten(raw: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested dict as one level of dotted keys: {"train": {"lr": 1}} → {"train.lr": 1}."""
    flat: dict[str, Any] = {}
    for key, value in raw.items():
        full = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{full}."))
        else:
            flat[full] = value
    return flat


def _coerce(key: str, value: Any, kind: Any) -> Any:
    choices = typing.get_args(kind) if typing.get_origin(kind) is Literal else None
    if choices is not None:
        if isinstance(value, str) and value in choices:
            return value
        raise MtError(f"{key}={shown(value)}: must be one of {', '.join(map(str, choices))}")
    if kind is bool:
        if isinstance(value, bool):
            return value
    elif kind is int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 1 << 63:  # any size a machine has
            return value
        raise MtError(f"{key}={shown(value)}: expected int (of at most 64 bits)")
    elif kind is float:
        if isinstance(value, str):  # YAML reads 1e-3 (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) < 1 << 63:
            value = float(value)
        if isinstance(value, float):
            if not math.isfinite(value):  # no setting means anything at infinity, and NaN compares to nothing
                raise MtError(f"{key}={value!r}: expected a finite number")
            return value
    elif kind is str:
        if isinstance(value, str) or isinstance(value, (int, float)) and not isinstance(value, bool) \
                and abs(value) < 1 << 63:
            return str(value)
    raise MtError(f"{key}={shown(value)}: expected {kind.__name__}")


def shown(value: Any) -> str:
    """A value as an error message shows it: its repr, cut short (with "...") where it runs long."""
    try:
        return reprlib.repr(value)
    except ValueError:  # an integer of more digits than Python prints
        return "an integer too long to print"
