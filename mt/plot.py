"""Training curves: read the `log.jsonl` of one or more runs and draw loss, BLEU, learning rate and speed.

`mt train` appends two kinds of records to a run's `log.jsonl`: one per log interval
({"step", "epoch", "loss", "lr", "tgt_tok_per_s"}) and one per validation ({"step", "valid_loss",
"valid_bleu", "elapsed", ...}). Each panel plots one field against the step (or the minutes of training), one
line per run, so runs can be compared.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from mt.data.lines import check_output
from mt.decode.alignments import save_figure
from mt.errors import MtError
from mt.train.log import read_log

FIGSIZE = (12, 8)  # inches; at DPI this is a 1200×800 PNG
DPI = 100
# (title, [(field, line style, legend suffix)]): train loss is label-smoothed, valid loss is not, so they
# share a panel but not a line style.
PANELS = [
    ("loss (per target token)", [("loss", "-", "train"), ("valid_loss", "--", "valid")]),
    ("validation BLEU", [("valid_bleu", "-o", "")]),
    ("learning rate", [("lr", "-", "")]),
    ("target tokens / s", [("tgt_tok_per_s", "-", "")]),
]



def minutes(records: list[dict]) -> list[float]:
    """Each record's minutes of training: validations log their `elapsed` seconds; a record between two of
    them is placed by its step, linearly."""
    timed = [(0, 0.0)] + [(r["step"], r["elapsed"]) for r in records if isinstance(r.get("elapsed"), (int, float))]
    steps, seconds = zip(*sorted(set(timed)), strict=True)
    return [float(np.interp(r["step"], steps, seconds)) / 60 for r in records]


def plot_runs(run_dirs: list[Path], out: Path, warn: TextIO = sys.stderr, x: str = "step") -> Path:
    """Draw the 2×2 panel of training curves for `run_dirs` into the PNG `out`, against the step or, with
    x="minutes", the minutes of training (to compare runs at equal time); returns `out`."""
    if not run_dirs:
        raise MtError("no run directories to plot")
    check_output(out, "--out", create_parent=True)
    logs = [read_log(log_path(Path(d)), warn) for d in run_dirs]
    labels = run_labels([Path(d) for d in run_dirs])
    fig = Figure(figsize=FIGSIZE, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)  # render with Agg whatever backend the user's matplotlib defaults to
    axes = fig.subplots(2, 2).ravel()
    colors = [f"C{i % 10}" for i in range(len(logs))]
    xs = [minutes(records) if x == "minutes" else [r["step"] for r in records] for records in logs]
    for ax, (title, fields) in zip(axes, PANELS, strict=True):
        drawn = False
        for records, where, label, color in zip(logs, xs, labels, colors, strict=True):
            for field, style, suffix in fields:
                points = [(at, r[field]) for at, r in zip(where, records, strict=True)
                          if isinstance(r.get(field), (int, float))]
                if points:
                    steps, values = zip(*points, strict=True)
                    ax.plot(steps, values, style, color=color, markersize=3,
                            label=f"{label} {suffix}".strip())
                    drawn = True
        ax.set_title(title)
        ax.set_xlabel("minutes of training" if x == "minutes" else "step")
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize="small")
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="gray")
    return save_figure(fig, Path(out))


def log_path(run: Path) -> Path:
    """A run directory's `log.jsonl`, or the path itself where it names a log file (one kept in docs/logs/)."""
    return run if run.is_file() else run / "log.jsonl"


def run_labels(run_dirs: list[Path]) -> list[str]:
    """Each run's directory name (a log file's stem); the whole path where two runs share a name."""
    names = [d.resolve().stem if d.is_file() else d.resolve().name for d in run_dirs]
    return [name if names.count(name) == 1 else str(d) for name, d in zip(names, run_dirs, strict=True)]
