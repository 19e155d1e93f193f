"""Choose the decoder's beam size and length penalty on held-out data, and make them the checkpoint's defaults.

The length penalty that suits a model depends on how it was trained (an undertrained model stops early and
likes a high penalty), so it is chosen per model on the validation set, never on the test set. The winner is
written into the checkpoint's `decode` config: `mt translate` and `mt evaluate` then use it without flags. A
checkpoint with a right-to-left reranker or a channel model (mt/decode/rerank.py) has their weights chosen too, for
every beam above 1; a plain one, whether its beam search stops at its best finished hypothesis or finishes `beam`
of them (`decode.finish_all`; a reranked one always finishes them, its K best).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import sacrebleu
from tqdm import tqdm

from mt.data.lines import check_aligned, check_not_input, check_output, read_text
from mt.decode.evaluate import length_ratio
from mt.errors import MtError
from mt.options import DEVICE
from mt.runlock import writing_into

if TYPE_CHECKING:  # torch and the model load when tuning starts, not when `mt --help` reads the defaults below
    import torch

    from mt.decode.load import Loaded

DEFAULT_BEAMS = (1, 5)
# A reranker gains from a wider beam: more candidates to choose among (docs/experiments.md)
RERANK_BEAMS = (1, 5, 8, 12)
DEFAULT_PENALTIES = (0.6, 0.8, 1.0, 1.2, 1.5)
DEFAULT_WEIGHTS = (0.5, 1.0)  # a reranker's; both have won on Multi30k's valid (docs/experiments.md)
CHANNEL_WEIGHTS = (0.0, 0.1, 0.25)  # a channel model's: above 0.25 it lost on Multi30k's valid; 0 turns it off
FINISH_ALL = (False, True)  # a plain beam search's stop: at its best finished hypothesis, or once `beam` are finished
WEIGHT_KEYS = ("rerank_weight", "channel_weight")  # a setting's reranking weights, where it has them
CHOSEN_KEYS = (*WEIGHT_KEYS, "finish_all")  # what a setting chooses beside beam and length penalty, where it has it


def decode_choices(state: dict) -> tuple[str, ...]:
    """Which of CHOSEN_KEYS a checkpoint's beam search has: its reranking models' weights, or without either, its
    stop (`finish_all`; a reranked search always finishes its K best)."""
    weights = tuple(key for key, model in zip(WEIGHT_KEYS, ("reranker", "channel"), strict=True) if model in state)
    return weights or ("finish_all",)


def parse_grid(beams: str, penalties: str, weights: str = "1") -> tuple[tuple[int, ...], tuple[float, ...],
                                                                     tuple[float, ...]]:
    """`--beams 1,5 --len-penalties 0.6,1.0 --rerank-weights 0.5,1` as numbers; at least one of each, beams >= 1."""
    try:
        beam_list = tuple(int(b) for b in beams.split(","))
        penalty_list = tuple(float(a) for a in penalties.split(","))
    except ValueError:
        raise MtError(f"--beams {beams!r} / --len-penalties {penalties!r}: expected comma-separated numbers, "
                      "e.g. 1,5") from None
    if min(beam_list) < 1:
        raise MtError(f"--beams {beams!r}: each beam size must be at least 1")
    if not all(0 <= a <= 10 for a in penalty_list):  # NaN fails too
        raise MtError(f"--len-penalties {penalties!r}: each length penalty must be in [0, 10]")
    return beam_list, penalty_list, parse_weights(weights, "--rerank-weights")


def parse_weights(weights: str, flag: str) -> tuple[float, ...]:
    """A reranking model's comma-separated weights, each 0 (the left-to-right scores alone) or more."""
    try:
        weight_list = tuple(float(w) for w in weights.split(","))
    except ValueError:
        raise MtError(f"{flag} {weights!r}: expected comma-separated numbers, e.g. 0.5,1") from None
    if not all(w >= 0 for w in weight_list):
        raise MtError(f"{flag} {weights!r}: each weight must be 0 (the left-to-right scores alone) or more")
    return weight_list


def parse_finish(finish: str) -> tuple[bool, ...]:
    """`--finish-all no,yes` as (False, True)."""
    answers = {"no": False, "yes": True}
    words = [word.strip().lower() for word in finish.split(",")]
    if not all(word in answers for word in words):
        raise MtError(f"--finish-all {finish!r}: expected no, yes, or no,yes")
    return tuple(dict.fromkeys(answers[word] for word in words))


def grid(beams: tuple[int, ...], penalties: tuple[float, ...], weights: tuple[float | None, ...] = (None,),
         channel_weights: tuple[float | None, ...] = (None,), finish: tuple[bool | None, ...] = (None,)
         ) -> list[tuple[int, float, float | None, float | None, bool | None]]:
    """(beam, len_penalty, rerank weight, channel weight, finish_all) settings to try; greedy search ignores the
    penalty, has nothing to rerank and finishes one hypothesis, so it is tried once; None: no such choice."""
    settings = []
    for beam in beams:
        for alpha in penalties[:1] if beam == 1 else penalties:
            for weight in weights[:1] if beam == 1 else weights:
                for channel in channel_weights[:1] if beam == 1 else channel_weights:
                    for finish_all in finish[:1] if beam == 1 else finish:
                        settings.append((beam, alpha, weight, channel, finish_all))
    return settings


def tune(loaded: Loaded, sources: list[str], refs: list[str], device: torch.device,
         beams: tuple[int, ...] = DEFAULT_BEAMS, penalties: tuple[float, ...] = DEFAULT_PENALTIES,
         progress: bool = True, weights: tuple[float, ...] = DEFAULT_WEIGHTS,
         channel_weights: tuple[float, ...] = CHANNEL_WEIGHTS, finish: tuple[bool, ...] = FINISH_ALL) -> list[dict]:
    """BLEU on (sources, refs) for each setting, best first. Ties go to the smaller beam (it is faster), then to
    the search that stops first. `weights` are tried only with a right-to-left reranker, `channel_weights` only with
    a channel model, `finish` only without either."""
    # torch and the model: imported only to tune, so that `mt --help` reads the defaults above without them
    from mt.decode.rerank import rerank
    from mt.decode.search import SearchOptions
    from mt.decode.translate import encode_lines, translate_lines

    model, choices = loaded.model, decode_choices(loaded.state)
    results = []
    candidates: dict = {}  # (beam, alpha, reranker searches): the K best and every model's scores, for all weights
    reranks = hasattr(model, "candidates")  # a reranked model's candidates serve every weight
    srcs = encode_lines(loaded, sources) if reranks else []
    settings = grid(beams, penalties, *(axis if key in choices else (None,)
                                        for key, axis in zip(CHOSEN_KEYS, (weights, channel_weights, finish),
                                                             strict=True)))
    for beam, alpha, weight, channel_weight, finish_all in tqdm(settings, desc="tune", unit="setting",
                                                                disable=not progress):
        opts = SearchOptions.from_config(loaded.config.decode, beam=beam, len_penalty=alpha, rerank_weight=weight,
                                   channel_weight=channel_weight, finish_all=finish_all)
        if reranks and beam > 1:
            key = beam, alpha, model.right_searches(opts.rerank_weight)
            if key not in candidates:
                candidates[key] = model.candidates(srcs, opts, device)
            hyps = rerank(*candidates[key], opts.rerank_weight, opts.channel_weight, alpha, 1)
        else:
            hyps = translate_lines(loaded, sources, opts, device)
        texts = loaded.tgt_tok.decode([h[0].tokens if h else [] for h in hyps])
        bleu = sacrebleu.corpus_bleu(texts, [refs])
        chosen = {key: value for key, value in zip(CHOSEN_KEYS, (weight, channel_weight, finish_all), strict=True)
                  if key in choices and beam > 1}
        results.append({"beam": beam, "len_penalty": alpha, **chosen, "bleu": round(bleu.score, 2),
                        "length_ratio": length_ratio(bleu)})
    return sorted(results, key=lambda r: (-r["bleu"], r["beam"], r.get("finish_all", False)))


def save_tuned(loaded: Loaded, best: dict, results: list[dict], out: str | Path) -> None:
    """Write `loaded`'s checkpoint to `out` with `best`'s beam and length penalty as its decode defaults."""
    from mt import checkpoint  # torch: imported only to tune

    state = dict(loaded.state)
    chosen = {key: best[key] for key in ("beam", "len_penalty", *CHOSEN_KEYS) if key in best}
    state["config"] = {**state["config"], "decode": {**state["config"]["decode"], **chosen}}
    state["metrics"] = {**(state.get("metrics") or {}), "tuned": results}
    checkpoint.save(state, out)


def tune_checkpoint(path: Path, out: Path, src: Path | None, ref: Path | None, beams: str | None, penalties: str,
                    device: str = DEVICE, progress: bool = True, to: str | None = None,
                    weights: str = ",".join(map(str, DEFAULT_WEIGHTS)),
                    channel_weights: str = ",".join(map(str, CHANNEL_WEIGHTS)), finish: str = "no,yes") -> list[dict]:
    """Tune the checkpoint at `path` on (src, ref), by default the valid split of the data it was trained on,
    over the comma-separated `beams` (None: DEFAULT_BEAMS, or RERANK_BEAMS with a reranker or channel) and
    `penalties` (and a reranker's `weights`, a channel model's `channel_weights`, a plain model's `finish`: "no",
    "yes" or both, whether beam search finishes `beam` hypotheses), and write it to `out` with the
    best setting as its decode defaults. `to` turns a two-way model to its other direction, which `out` then
    translates. Returns every setting's BLEU, best first."""
    # torch and the model: imported only to tune
    from mt.decode.load import load_model
    from mt.device import pick_device

    if (src is None) != (ref is None):
        raise MtError("give both --src and --ref, or neither to use the prepared valid split")
    beam_list, penalty_list, weight_list = parse_grid(beams or "1", penalties, weights)
    channel_list = parse_weights(channel_weights, "--channel-weights")
    finish_list = parse_finish(finish)
    # --out may be --checkpoint: it is read whole before it is written over, with its decode defaults changed
    check_not_input(out, "--out", [path for path in (src, ref) if path is not None])
    check_output(out, "--out", create_parent=True)
    dev = pick_device(device)
    with writing_into(out):
        loaded = load_model(path, dev, to=to)
        if beams is None:
            beam_list = RERANK_BEAMS if hasattr(loaded.model, "candidates") else DEFAULT_BEAMS  # reranker or channel
        sources, refs = held_out(loaded, src, ref)
        results = tune(loaded, sources, refs, dev, beam_list, penalty_list, progress, weight_list, channel_list,
                       finish_list)
        save_tuned(loaded, results[0], results, out)
    return results


def summary(results: list[dict], out: Path) -> str:
    """What `mt tune` prints: each setting's BLEU, best first, then the choice written to `out`."""
    def weight(r: dict) -> str:
        return "".join(f"  {key} {r[key]:.2f}" for key in WEIGHT_KEYS if key in r) \
            + ("  finish_all" if r.get("finish_all") else "")

    lines = [f"beam {r['beam']:2d}  len_penalty {r['len_penalty']:.2f}{weight(r)}  BLEU {r['bleu']:6.2f}"
             + f"  length {r['length_ratio']:.3f}" for r in results]
    best = results[0]
    lines.append(f"{out}: decodes with beam {best['beam']}, len_penalty {best['len_penalty']}"
                 + "".join(f", {key} {best[key]}" for key in CHOSEN_KEYS if key in best))
    return "\n".join(lines)


def held_out(loaded: Loaded, src: str | Path | None = None,
             ref: str | Path | None = None) -> tuple[list[str], list[str]]:
    """(sources, references) to choose settings on: `src`/`ref`, or the valid split of the checkpoint's data."""
    if src is None:
        from mt.data.batches import text_files  # torch: imported only to tune

        data = Path(loaded.config.data)
        src, ref = text_files(data, "valid", loaded.state.get("langs"))
        if not Path(src).is_file():
            raise MtError(f"{src}: not found; the checkpoint's data directory ({data}, relative to the "
                          "working directory) has no valid split here. Pass --src and --ref")
    sources, refs = read_text(src), read_text(ref)
    check_aligned(src, len(sources), ref, len(refs))
    return sources, refs
