"""Choose the decoder's beam size and length penalty on held-out data, and make them the checkpoint's defaults.

The length penalty that suits a model depends on how it was trained (an undertrained model stops early and
likes a high penalty), so it is chosen per model on the validation set, never on the test set. The winner is
written into the checkpoint's `decode` config: `mt translate` and `mt evaluate` then use it without flags.
"""

from __future__ import annotations

from pathlib import Path

import sacrebleu
import torch
from tqdm import tqdm

from mt import checkpoint
from mt.checkpoint import Loaded, load_model
from mt.errors import MtError
from mt.lines import read_text
from mt.translate import Options, translate_lines

DEFAULT_BEAMS = (1, 5)
DEFAULT_PENALTIES = (0.6, 0.8, 1.0, 1.2, 1.5)


def grid(beams: tuple[int, ...], penalties: tuple[float, ...]) -> list[tuple[int, float]]:
    """(beam, len_penalty) settings to try; greedy search ignores the penalty, so it is tried once."""
    settings = []
    for beam in beams:
        for alpha in penalties[:1] if beam == 1 else penalties:
            settings.append((beam, alpha))
    return settings


def tune(loaded: Loaded, sources: list[str], refs: list[str], device: torch.device,
         beams: tuple[int, ...] = DEFAULT_BEAMS, penalties: tuple[float, ...] = DEFAULT_PENALTIES,
         progress: bool = True) -> list[dict]:
    """BLEU on (sources, refs) for each setting, best first. Ties go to the smaller beam (it is faster)."""
    results = []
    for beam, alpha in tqdm(grid(beams, penalties), desc="tune", unit="setting", disable=not progress):
        opts = Options.from_config(loaded.config.decode, beam=beam, len_penalty=alpha)
        hyps = translate_lines(loaded, sources, opts, device)
        texts = loaded.tgt_tok.decode([h[0].tokens if h else [] for h in hyps])
        bleu = sacrebleu.corpus_bleu(texts, [refs]).score
        results.append({"beam": beam, "len_penalty": alpha, "bleu": round(bleu, 2)})
    return sorted(results, key=lambda r: (-r["bleu"], r["beam"]))


def save_tuned(loaded: Loaded, best: dict, results: list[dict], out: str | Path) -> None:
    """Write `loaded`'s checkpoint to `out` with `best`'s beam and length penalty as its decode defaults."""
    state = dict(loaded.state)
    state["config"] = {**state["config"], "decode": {**state["config"]["decode"], "beam": best["beam"],
                                                    "len_penalty": best["len_penalty"]}}
    state["metrics"] = {**(state.get("metrics") or {}), "tuned": results}
    checkpoint.save(state, out)


def tune_checkpoint(path: str | Path, out: str | Path, device: torch.device, src: str | Path | None = None,
                    ref: str | Path | None = None, beams: tuple[int, ...] = DEFAULT_BEAMS,
                    penalties: tuple[float, ...] = DEFAULT_PENALTIES, progress: bool = True) -> list[dict]:
    """Tune the checkpoint at `path` on (src, ref), by default the valid split of the data it was trained on,
    and write it to `out` with the best setting as its decode defaults. Returns every setting's BLEU, best first."""
    if (src is None) != (ref is None):
        raise MtError("give both --src and --ref, or neither to use the prepared valid split")
    if not beams or min(beams) < 1 or not penalties:
        raise MtError(f"beams {beams} and length penalties {penalties}: need at least one of each, beams >= 1")
    loaded = load_model(path, device)
    sources, refs = held_out(loaded, src, ref)
    results = tune(loaded, sources, refs, device, beams, penalties, progress)
    save_tuned(loaded, results[0], results, out)
    return results


def held_out(loaded: Loaded, src: str | Path | None = None,
             ref: str | Path | None = None) -> tuple[list[str], list[str]]:
    """(sources, references) to choose settings on: `src`/`ref`, or the valid split of the checkpoint's data."""
    if src is None:
        data = Path(loaded.config.data)
        src, ref = data / "valid.src.txt", data / "valid.tgt.txt"
        if not Path(src).is_file():
            raise MtError(f"{src}: not found; the checkpoint's data directory ({data}, relative to the "
                          "working directory) has no valid split here. Pass --src and --ref")
    sources, refs = read_text(src), read_text(ref)
    if len(sources) != len(refs):
        raise MtError(f"{src} has {len(sources)} lines but {ref} has {len(refs)}; they must be line-aligned")
    return sources, refs
