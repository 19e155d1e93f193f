"""`mt export`: a checkpoint as another engine's model directory, written whole or not at all.

Each target writes into a temporary directory beside `--out`, renamed into place at the end, so an interrupted
export leaves no half-written model where an engine would load it. The targets, mt/export/ctranslate2.py and
mt/export/huggingface.py, need the `export` extra (`pip install 'mt[export]'`).
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
from pathlib import Path

from mt import checkpoint
from mt.data.lines import check_not_input, check_output_dir
from mt.decode.ctranslate2 import MANIFEST
from mt.errors import MtError

TARGETS = ("ctranslate2", "huggingface")


def export(source: str | Path, to: str, out: str | Path, quantization: str = "float32", force: bool = False
           ) -> Path:
    """Write checkpoint `source` as a `to` model into directory `out`; returns `out`."""
    source, out = Path(source), Path(out)
    if to not in TARGETS:
        raise MtError(f"--to {to}: unknown target; choose one of {', '.join(TARGETS)}")
    check_not_input(out, "--out", [source])  # --force replaces --out: never with the checkpoint inside
    check_output_dir(out, "--out")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise MtError(f"--out {out}: exists and is not empty; choose another directory, or --force to replace it")
    state = checkpoint.load(source)
    checkpoint.weights(state, source, f"--to {to}")  # CTranslate2 and Marian models are one model each
    if (state["config"].get("train") or {}).get("two_way"):  # its engine would not know to lead with the tag
        raise MtError(f"{source}: a two-way model (train.two_way) reads a target tag before each source, which "
                      f"--to {to} does not write yet; export a model of one direction")
    if state["config"]["model"].get("right_to_left"):  # its engine would print the pieces last first
        raise MtError(f"{source}: a right-to-left model (model.right_to_left) is a reranker, which --to {to} "
                      f"would print backwards; export the left-to-right model")
    writer = target_module(to)
    if quantization not in writer.QUANTIZATIONS:
        raise MtError(f"--quantization {quantization}: not for --to {to}; choose one of "
                      f"{', '.join(writer.QUANTIZATIONS)}")
    tmp = out.absolute().with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        writer.write(state, tmp, quantization)
        for side, name in (("src", "source.spm"), ("tgt", "target.spm")):
            (tmp / name).write_bytes(state["spm"][side])
        manifest = {"format": to, "quantization": quantization, "source": str(source), "step": state.get("step"),
                    "langs": state.get("langs"), "config": state["config"]}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        (tmp / "README.md").write_text(writer.readme(manifest), encoding="utf-8")
        replace_dir(tmp, out)
    except OSError as e:
        raise MtError(f"--out {out}: cannot write ({e.strerror or e}); nothing was changed there") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def target_module(to: str):
    """The module that writes `to` (mt/export/{to}.py), or a clear error when its package is not installed."""
    try:
        return importlib.import_module(f"mt.export.{to}")
    except ImportError as e:
        raise MtError(f"--to {to} needs the {e.name} package: pip install 'mt[export]'") from None


def replace_dir(new: Path, out: Path) -> None:
    """Rename `new` to `out`, replacing a directory there: the old one moves aside first and goes last."""
    old = out.absolute().with_name(f".{out.name}.old-{os.getpid()}")
    if out.exists():
        os.replace(out, old)
    os.replace(new, out)
    shutil.rmtree(old, ignore_errors=True)
