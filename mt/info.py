"""What a checkpoint holds: architecture, size, vocabulary, languages, training progress, metrics, config."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mt.config import flatten
from mt.decode.load import load_model

ARCHITECTURE = ("d_model", "n_heads", "n_enc_layers", "n_dec_layers", "d_ff", "activation", "norm", "max_len",
                "share_embeddings", "tie_output")


def describe(checkpoint_path: str | Path) -> dict[str, Any]:
    """A JSON-ready summary of the checkpoint. The model is rebuilt and its weights loaded, so the parameter
    count is that of the real model (shared tables counted once), and a checkpoint that cannot be used fails
    here rather than at translation time."""
    loaded = load_model(checkpoint_path, precision=None)
    state = loaded.state
    model_cfg = state["config"]["model"]
    langs = state.get("langs") or {}
    return {
        "checkpoint": str(checkpoint_path),
        "languages": {"src": langs.get("src"), "tgt": langs.get("tgt")},
        "two_way": loaded.config.train.two_way,  # also translates tgt → src (`mt translate --to SRC`)
        "step": state.get("step"),
        "parameters": loaded.parameters,
        "architecture": {key: model_cfg[key] for key in ARCHITECTURE if key in model_cfg},
        "vocabulary": {"src": loaded.src_tok.vocab_size, "tgt": loaded.tgt_tok.vocab_size,
                       "joint": state["spm"]["src"] == state["spm"]["tgt"]},
        "metrics": dict(state.get("metrics") or {}),
        "initialized_from": state.get("init"),  # a fine-tuned run's starting checkpoint; None: from scratch
        "imported_from": (state.get("imported") or {}).get("from"),  # `mt import`'s Marian directory
        "resumable": "train" in state,  # last.pt carries the optimizer state; best.pt does not
        "config": state["config"],
    }


def render(d: dict[str, Any], as_json: bool = False) -> str:
    """`describe`'s summary as JSON, or as an aligned two-column table: the headline rows, then the config key
    by key."""
    if as_json:
        return json.dumps(d, indent=2, ensure_ascii=False)
    arch = d["architecture"]
    vocab = d["vocabulary"]
    src, tgt = d["languages"]["src"], d["languages"]["tgt"]
    rows: list[tuple[str, str]] = [
        ("checkpoint", d["checkpoint"]),
        ("languages", f"{src or '?'} → {tgt or '?'}" + (f" (two-way: --to {src} translates {tgt} → {src})"
                                                       if d.get("two_way") else "")),
        ("step", "?" if d["step"] is None else f"{d['step']:,}"),
        ("parameters", f"{d['parameters']:,}"),
        ("vocabulary", f"{vocab['src']:,} source, {vocab['tgt']:,} target"
                       + (" (one joint SentencePiece model)" if vocab["joint"] else "")),
        ("architecture", describe_architecture(arch)),
        ("ensemble", ", ".join(f"{m['path']} (step {m['step']})" for m in d["metrics"]["ensemble"])
                     if "ensemble" in d["metrics"] else "no (one model)"),
        ("reranker", "{path} (step {step}; right to left)".format(**d["metrics"]["reranker"])
                     if "reranker" in d["metrics"] else "none"),
        ("channel", "{path} (step {step}; the reverse direction)".format(**d["metrics"]["channel"])
                    if "channel" in d["metrics"] else "none"),
        ("init", f"{d['initialized_from']['from']} (step {d['initialized_from']['step']:,}; fine-tuned from it)"
                 if d.get("initialized_from") else f"imported from {d['imported_from']} (a Marian model, `mt import`)"
                 if d.get("imported_from") else "none (trained from scratch)"),
        ("resumable", "yes (last.pt: training state included)" if d["resumable"] else "no (weights only)"),
    ]
    metrics = d["metrics"]
    if metrics:  # the validation this checkpoint was saved at, which may precede `step` in a last.pt
        rows += [("", ""), ("validation", f"at step {metrics['step']:,}" if "step" in metrics else "")]
        rows += [(f"  {key}", format_value(value)) for key, value in metrics.items()
                 if key not in ("step", "ensemble", "reranker", "channel")]
    rows += [("", ""), ("config", "")]
    rows += [(f"  {key}", format_value(value)) for key, value in flatten(d["config"]).items()]
    width = max(len(key) for key, _ in rows)
    return "\n".join(f"{key:<{width}}  {value}".rstrip() for key, value in rows)


def describe_architecture(arch: dict[str, Any]) -> str:
    parts = [f"{arch.get('n_enc_layers', '?')}+{arch.get('n_dec_layers', '?')} layers",
             f"d_model {arch.get('d_model', '?')}", f"{arch.get('n_heads', '?')} heads",
             f"d_ff {arch.get('d_ff', '?')}", str(arch.get("activation", "?")), f"{arch.get('norm', '?')}-norm",
             f"max_len {arch.get('max_len', '?')}"]
    return ", ".join(parts)


def format_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)

