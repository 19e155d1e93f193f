"""Beam search whose translations must hold given target phrases (a glossary's terms, mt/decode/glossary.py):
`constrained_beam_search`, which `translate_ids` (mt/decode/search.py) runs for the sources with phrases. The
bookkeeping of dynamic beam allocation is mt/decode/constrained.py's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from mt.data.tokenizer import BOS, EOS
from mt.decode.constrained import Constraints, Phrases, Progress, allocate
from mt.decode.hypotheses import Hypothesis, candidates, length_penalty, max_lengths


@dataclass
class Slot:
    """A live hypothesis of constrained search: its total log-probability, pieces and progress on the phrases."""

    score: float
    tokens: list[int]
    progress: Progress


@torch.inference_mode()
def constrained_beam_search(model, src: Tensor, constraints: Constraints, beam: int = 4, len_penalty: float = 0.6,
                            max_len_a: float = 1.5, max_len_b: int = 10, nbest: int = 1) -> list[list[Hypothesis]]:
    """Beam search in which each sentence's translations hold its phrases of `constraints` (piece ids, in the order
    the model writes them), by dynamic beam allocation (Post & Vilar 2018; the bookkeeping is
    mt/decode/constrained.py's); no `constraints.glued` piece follows a phrase's last piece.

    Each beam is offered (`offers`) the best continuations of `beam_search`, its best token and the next piece of
    each phrase it could go on with; the beam is shared among banks by pieces placed (`choose`). A hypothesis may
    end only once it holds every phrase (`forbid`). It always ends: at the length limit every beam ends, and those
    that could not hold every phrase rank after any that do, most phrases placed first (`best_first`).
    """
    if nbest > beam:
        raise ValueError(f"nbest ({nbest}) cannot exceed the beam size ({beam})")
    memory, src_mask = model.encode(src)
    limits = max_lengths(src, max_len_a, max_len_b, model.cfg.max_len).tolist()
    steps, n, k = max(limits), src.size(0), beam
    cache = model.start_cache(memory, src_mask, steps, beam=k)
    rules = [Phrases(c) for c in constraints.phrases]
    glued = torch.tensor(sorted(constraints.glued), dtype=torch.long, device=src.device)
    slots: list[list[Slot | None]] = [[Slot(0.0, [], Progress())] + [None] * (k - 1) for _ in range(n)]
    active = list(range(n))  # the original sentence of each running one
    found: list[list[Hypothesis]] = [[] for _ in range(n)]  # those that hold every phrase
    fallback: list[list[tuple[int, Hypothesis]]] = [[] for _ in range(n)]  # (phrases placed, hypothesis): others
    last = torch.full((n * k,), BOS, dtype=torch.long, device=src.device)
    for step in range(steps):
        logits, cache = model.decode_step(last, cache)
        logp = torch.log_softmax(logits.float(), dim=-1)  # (n*k, V)
        ends = logp[:, EOS].tolist()
        penalty = length_penalty(step + 1, len_penalty)
        forbid(logp, slots, [rules[i] for i in active], glued)
        offered = offers(slots, [rules[i] for i in active], logp)
        kept, parents, tokens = [], [], []
        for s, row in enumerate(slots):
            i, rule, offer = active[s], rules[active[s]], offered[s]
            for j, slot in enumerate(row):
                if slot is not None and not rule.complete(slot.progress):  # where it would have ended, if allowed
                    ended = slot.score + (0.0 if limits[i] <= step + 1 else ends[s * k + j])
                    fallback[i].append((rule.placed(slot.progress), Hypothesis(slot.tokens, ended / penalty, ended)))
            if limits[i] <= step + 1:  # every beam ends here: those that hold every phrase are found
                for slot in row:
                    if slot is not None and rule.complete(slot.progress):
                        found[i].append(Hypothesis(slot.tokens, slot.score / penalty, slot.score))
                continue
            moves, pick = choose(row, rule, offer, penalty, found[i])
            if len(found[i]) >= nbest:
                found[i] = sorted(found[i], key=lambda h: -h.score)[:nbest]
            if not pick or (len(found[i]) >= nbest and found[i][-1].score >= moves[pick[0]][0] / penalty):
                continue  # done: no live beam can beat the nbest-th found
            kept.append(s)
            chosen = [moves[p] for p in pick] + [None] * (k - len(pick))
            parents += [s * k + (m[1] if m else 0) for m in chosen]
            tokens += [m[2] if m else EOS for m in chosen]
            slots[s] = [Slot(m[0], row[m[1]].tokens + [m[2]], m[3]) if m else None for m in chosen]
        if not kept:
            break
        sentences = None if len(kept) == len(active) else torch.tensor(kept, device=src.device)
        slots, active = [slots[s] for s in kept], [active[s] for s in kept]
        last = torch.tensor(tokens, device=src.device)
        cache = cache.select(torch.tensor(parents, device=src.device), sentences)
    return [best_first(found[i], fallback[i], nbest) for i in range(n)]


def choose(row: list[Slot | None], rule: Phrases, offer: dict[tuple[int, int], float], penalty: float,
           found: list[Hypothesis]) -> tuple[list[tuple], list[int]]:
    """A sentence's moves on offer, (score, beam, token, progress), and which of them go on (`allocate`'s pick);
    an ending among the beam's best of those that hold every phrase is added to `found`."""
    k = len(row)
    moves = [(score, j, tok, rule.advance(row[j].progress, tok)) for (j, tok), score in offer.items()]
    top = sorted((m for m in moves if rule.complete(m[3])), key=lambda m: -m[0])[:k]
    for score, j, tok, _ in top:
        if tok == EOS:
            found.append(Hypothesis(row[j].tokens, score / penalty, score))
    moves = [m for m in moves if m[2] != EOS and m[0] > -torch.inf]
    return moves, allocate([(m[0], rule.met(m[3])) for m in moves], k, rule.total + 1)


def forbid(logp: Tensor, slots: list[list[Slot | None]], rules: list[Phrases], glued: Tensor) -> None:
    """In place, on the running beams' log-probabilities (n*k, V): no ending for a hypothesis that does not hold
    every phrase yet, and no `glued` piece right after a phrase's last piece (its last word ends with it)."""
    k = len(slots[0]) if slots else 0
    unfinished = [s * k + j for s, row in enumerate(slots) for j, slot in enumerate(row)
                  if slot is not None and not rules[s].complete(slot.progress)]
    logp[unfinished, EOS] = -torch.inf
    closed = [s * k + j for s, row in enumerate(slots) for j, slot in enumerate(row)
              if slot is not None and slot.progress.closed]
    if closed and glued.numel():
        logp[torch.tensor(closed, device=logp.device)[:, None], glued] = -torch.inf


def offers(slots: list[list[Slot | None]], rules: list[Phrases], logp: Tensor) -> list[dict[tuple[int, int], float]]:
    """Each running sentence's continuations on offer, {(beam, token): score}: each beam's next piece of every phrase
    it could go on with, its best token, and the sentence's best continuations as `beam_search` has them."""
    k = len(slots[0]) if slots else 0
    scores = torch.tensor([[-torch.inf if slot is None else slot.score for slot in row] for row in slots],
                          device=logp.device)
    top_scores, top_beam, top_tok = (t.tolist() for t in candidates(scores, logp))
    best_lp, best_tok = (t.tolist() for t in logp.max(dim=1))
    wanted = [(s * k + j, tok) for s, row in enumerate(slots) for j, slot in enumerate(row) if slot is not None
              for tok in rules[s].allowed(slot.progress)]
    wanted_lp = logp[[r for r, _ in wanted], [t for _, t in wanted]].tolist() if wanted else []
    offered: list[dict[tuple[int, int], float]] = [{} for _ in slots]
    for (row, tok), lp in zip(wanted, wanted_lp, strict=True):
        offered[row // k][(row % k, tok)] = slots[row // k][row % k].score + lp
    for s, row in enumerate(slots):
        for j, slot in enumerate(row):
            if slot is not None:
                offered[s][(j, best_tok[s * k + j])] = slot.score + best_lp[s * k + j]
        for score, j, tok in zip(top_scores[s], top_beam[s], top_tok[s], strict=True):
            if score > -torch.inf:
                offered[s][(j, tok)] = score
    return offered


def best_first(found: list[Hypothesis], fallback: list[tuple[int, Hypothesis]], nbest: int) -> list[Hypothesis]:
    """A sentence's `nbest`: those that hold every phrase by score, then the others, most phrases placed first."""
    placed = sorted(found, key=lambda h: -h.score)[:nbest]
    rest = sorted(fallback, key=lambda m: (-m[0], -m[1].score))[:nbest - len(placed)]
    return placed + [h for _, h in rest]
