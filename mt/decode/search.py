"""Greedy and beam search over a batch of source sentences, decoding incrementally with a KV cache; and the
teacher-forced score of given translations (`score_ids`), which rerankers and `mt score` ask for.

What decodes is asked through one interface: `translate_ids(model, srcs, opts, device)`. mt's own models and
ensembles of them decode incrementally (`encode`, `start_cache`, `decode_step`) and are searched here; a kind that
searches its own way (a model reranked by others, mt/decode/rerank.py; a CTranslate2 export,
mt/decode/ctranslate2.py) has a `search(srcs, opts, device)` method, which is called instead. Likewise for
attention weights: such a kind has `cross_attention(src, tgt)` (mt/decode/alignments.py).

Both functions take a model with `encode` / `start_cache` / `decode_step` (see mt/model/transformer.py) and a padded
source batch (B, S), and return hypotheses as lists of piece ids without BOS/EOS. Finished sentences leave the
running batch, so a long sentence does not keep short ones computing. `constrained_beam_search` is beam search
whose translations must hold given target phrases (a glossary's terms; mt/decode/constrained.py), which
`translate_ids` takes per source.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm import tqdm

from mt.config import DecodeConfig
from mt.data.batches import batch_by_tokens, pad, shift_targets
from mt.data.tokenizer import BOS, EOS, PAD
from mt.decode.constrained import Constraints, Phrases, Progress, allocate
from mt.device import attention_kernels
from mt.device import autocast as device_autocast
from mt.model.cache import DecoderCache


def autocast(precision: str, device: torch.device):
    """bf16 runs the search under autocast; fp32 and int8 (a model from `for_inference`) run as they are."""
    return device_autocast(torch.bfloat16 if precision == "bf16" else None, device)


@dataclass
class SearchOptions:
    """How to search: what `mt translate` may change per call; the rest comes from the checkpoint's decode config."""

    beam: int
    len_penalty: float
    max_len_a: float
    max_len_b: int
    batch_tokens: int
    nbest: int = 1
    precision: str = "fp32"  # bf16 runs the search under autocast; int8 needs a model from for_inference
    rerank_weight: float = 1.0  # a checkpoint with a right-to-left reranker's w (mt/decode/rerank.py)
    channel_weight: float = 0.25  # a checkpoint with a channel model's c (mt/decode/rerank.py)
    finish_all: bool = False  # beam search: until `beam` hypotheses have finished, not the best one alone

    @classmethod
    def from_config(cls, decode_cfg: DecodeConfig, **changes) -> SearchOptions:
        opts = cls(decode_cfg.beam, decode_cfg.len_penalty, decode_cfg.max_len_a, decode_cfg.max_len_b,
                   decode_cfg.batch_tokens, rerank_weight=decode_cfg.rerank_weight,
                   channel_weight=decode_cfg.channel_weight, finish_all=decode_cfg.finish_all)
        for key, value in changes.items():
            if value is not None:
                setattr(opts, key, value)
        return opts


@dataclass
class Hypothesis:
    tokens: list[int]  # pieces, without BOS/EOS
    score: float  # log-probability divided by the length penalty: what beams are ranked by
    logprob: float  # total log-probability, EOS included


def max_lengths(src: Tensor, a: float, b: int, limit: int) -> Tensor:
    """Per sentence output limit (in tokens, EOS included): a * source length + b, within the model's positions."""
    src_len = (src != PAD).sum(1)
    return (a * src_len.float() + b).long().clamp(min=1, max=limit - 1)


def length_penalty(length: Tensor | int, alpha: float) -> Tensor | float:
    """GNMT (Wu et al. 2016): ((5 + length) / 6) ** alpha; alpha 0 ranks by raw log-probability."""
    return ((5 + length) / 6) ** alpha


@torch.inference_mode()
def greedy(model, src: Tensor, max_len_a: float = 1.5, max_len_b: int = 10, min_len: int = 0) -> list[Hypothesis]:
    """The most likely next token at every step until EOS or the length limit (EOS barred before `min_len`)."""
    memory, src_mask = model.encode(src)
    limit = max_lengths(src, max_len_a, max_len_b, model.cfg.max_len)
    steps = int(limit.max())
    cache = model.start_cache(memory, src_mask, steps)
    n = src.size(0)
    active = torch.arange(n, device=src.device)  # original row of each running row
    tokens = torch.full((n,), BOS, dtype=torch.long, device=src.device)
    out = torch.full((n, steps), EOS, dtype=torch.long, device=src.device)
    logprob = torch.zeros(n, device=src.device)
    for step in range(steps):
        logits, cache = model.decode_step(tokens, cache)
        logp = next_token_logprobs(logits, step < min_len, limit[active] <= step + 1)
        best, tokens = logp.max(dim=-1)
        out[active, step] = tokens
        logprob[active] += best
        running = tokens != EOS
        if not running.all():
            if not running.any():
                break
            keep = running.nonzero().squeeze(1)
            active, tokens, cache = active[keep], tokens[keep], cache.select(keep, keep)
    return [Hypothesis(until_eos(row), lp, lp) for row, lp in zip(out.tolist(), logprob.tolist(), strict=True)]


@torch.inference_mode()
def beam_search(model, src: Tensor, beam: int = 4, len_penalty: float = 0.6, max_len_a: float = 1.5,
                max_len_b: int = 10, nbest: int = 1, min_len: int = 0) -> list[list[Hypothesis]]:
    """Beam search with the GNMT length penalty; returns the `nbest` best hypotheses per sentence, best first.

    A hypothesis that emits EOS among the top `beam` candidates is finished. A sentence stops once it has
    `nbest` finished hypotheses and no live beam can still beat the worst of them, judging a live beam by its
    score normalised at the current length (as most toolkits do; with len_penalty 0 the judgment is exact,
    since log-probabilities only fall). With beam 1 this is exactly greedy search. EOS is barred before
    `min_len` tokens (benchmarks use it, with the length limit, to fix the output length).
    """
    if nbest > beam:
        raise ValueError(f"nbest ({nbest}) cannot exceed the beam size ({beam})")
    if src.size(0) * beam <= FEW_ROWS:
        return few_beam_search(model, src, beam, len_penalty, max_len_a, max_len_b, nbest, min_len)
    memory, src_mask = model.encode(src)
    limit = max_lengths(src, max_len_a, max_len_b, model.cfg.max_len)
    steps = int(limit.max())
    beams = Beams.start(model.start_cache(memory, src_mask, steps, beam=beam), src.size(0), beam, src.device)
    finished = Finished.start(src.size(0), nbest, src.device)
    for step in range(steps):
        logits, beams.cache = model.decode_step(beams.last, beams.cache)
        at_limit = (limit[beams.active] <= step + 1).repeat_interleave(beam)
        logp = next_token_logprobs(logits, step < min_len, at_limit)
        top_scores, top_beam, top_tok = candidates(beams.scores, logp)
        penalty = length_penalty(step + 1, len_penalty)
        finished.add(beams, top_scores, top_beam, top_tok, penalty)
        if not beams.advance(top_scores, top_beam, top_tok, finished.kth_best, penalty):
            break
    return [sorted(hyps, key=lambda h: h.score, reverse=True)[:nbest] for hyps in finished.hyps]


FEW_ROWS = 8  # up to this many rows (sentences x beam) beam search keeps its books in Python lists


def few_beam_search(model, src: Tensor, beam: int, len_penalty: float, max_len_a: float, max_len_b: int,
                    nbest: int, min_len: int) -> list[list[Hypothesis]]:
    """`beam_search` for a few rows (a lone sentence's beam), the same search with its bookkeeping in Python lists.

    Why: each step of `beam_search` runs some sixty small tensor operations, microseconds each whatever their size;
    for a few rows that is as long as the decoding step itself (docs/performance.md). Here a step runs the decoder,
    the log-probabilities and each row's best tokens in PyTorch, and ranks its few dozen candidates in Python: the
    same hypotheses as `Beams` and `Finished` find (tests hold them equal), up to the order of exact ties.
    """
    memory, src_mask = model.encode(src)
    limits = max_lengths(src, max_len_a, max_len_b, model.cfg.max_len).tolist()
    n, k, steps = src.size(0), beam, max(limits)
    cache = model.start_cache(memory, src_mask, steps, beam=k)
    active = list(range(n))  # the original sentence of each running one
    scores = [[0.0] + [-math.inf] * (k - 1) for _ in range(n)]  # per running sentence, per slot
    prefixes: list[list[list[int]]] = [[[] for _ in range(k)] for _ in range(n)]
    hyps: list[list[Hypothesis]] = [[] for _ in range(n)]
    kth_best = [-math.inf] * n  # as Finished.kth_best
    last = torch.full((n * k,), BOS, dtype=torch.long, device=src.device)
    for step in range(steps):
        logits, cache = model.decode_step(last, cache)
        row_lp, row_tok = row_candidates(model, logits, min(2 * k, logits.size(1)), step < min_len,
                                         [limits[i] <= step + 1 for i in active for _ in range(k)])
        penalty = length_penalty(step + 1, len_penalty)
        kept, parents, tokens = [], [], []
        for s, i in enumerate(active):
            cand = sorted(((scores[s][j] + lp, j, tok) for j in range(k)
                           for lp, tok in zip(row_lp[s * k + j], row_tok[s * k + j], strict=True)),
                          key=lambda c: -c[0])[:2 * k]
            for score, j, tok in cand[:k]:  # Finished.add
                if tok == EOS and score > -math.inf:
                    hyps[i].append(Hypothesis(list(prefixes[s][j]), score / penalty, score))
                    if len(hyps[i]) >= nbest:
                        hyps[i] = sorted(hyps[i], key=lambda h: h.score, reverse=True)[:nbest]
                        kth_best[i] = hyps[i][-1].score
            live = sorted(((-math.inf if tok == EOS else score, j, tok) for score, j, tok in cand),
                          key=lambda c: -c[0])[:k]  # Beams.advance
            if not kth_best[i] < live[0][0] / penalty:
                continue  # done: no live beam can beat the nbest-th finished one
            slot = few_slot_order([j for _, j, _ in live])
            chosen = [live[c] for c in slot]
            kept.append(s)
            parents += [s * k + j for _, j, _ in chosen]
            tokens += [tok for _, _, tok in chosen]
            scores[s] = [score for score, _, _ in chosen]
            prefixes[s] = [prefixes[s][j] + [tok] for _, j, tok in chosen]
        if not kept:
            break
        sentences = None if len(kept) == len(active) else torch.tensor(kept, device=src.device)
        active, scores, prefixes = [active[s] for s in kept], [scores[s] for s in kept], [prefixes[s] for s in kept]
        last = torch.tensor(tokens, device=src.device)
        cache = cache.select(torch.tensor(parents, device=src.device), sentences)
    return [sorted(h, key=lambda h: h.score, reverse=True)[:nbest] for h in hyps]


def row_candidates(model, logits: Tensor, width: int, bar_eos: bool,
                   at_limit: list[bool]) -> tuple[list[list[float]], list[list[int]]]:
    """Each row's `width` best tokens and their log-probabilities, as `next_token_logprobs` and `top_tokens` give
    them, in lists: in one call into C where the model decodes there (`NativeDecodeStep.top_logprobs`) and no row is
    at its length limit (its last step); with `bar_eos`, EOS dropped from one more."""
    top = getattr(model.decode_step, "top_logprobs", None)
    if top is None or logits.device.type != "cpu" or any(at_limit) or width + bar_eos > logits.size(1):
        logp = next_token_logprobs(logits, bar_eos, torch.tensor(at_limit, device=logits.device))
        return tuple(t.tolist() for t in top_tokens(logp, width))
    values, tokens = top(logits, width + bar_eos)
    if bar_eos:  # EOS cannot be chosen: each row's best without it
        for lp, tok in zip(values, tokens, strict=True):
            drop = tok.index(EOS) if EOS in tok else width
            del lp[drop], tok[drop]
    return values, tokens


def few_slot_order(parents: list[int]) -> list[int]:
    """`slot_order` of one sentence, in lists: for each slot, the index of the child (among `parents`, best first)
    that goes in it."""
    k = len(parents)
    first = [parents.index(p) == c for c, p in enumerate(parents)]
    childless = iter(j for j in range(k) if j not in parents)
    slot = [p if f else next(childless) for p, f in zip(parents, first, strict=True)]
    order = [0] * k
    for child, at in enumerate(slot):
        order[at] = child
    return order


@dataclass
class Beams:
    """The k live beams of each running sentence, side by side: row s*k + j of (n*k, ...) is sentence s's beam j."""

    cache: DecoderCache  # the decoder's state, rows as above
    active: Tensor  # (n,) the original sentence of each running sentence
    scores: Tensor  # (n, k) total log-probability of each beam
    prefixes: Tensor  # (n*k, steps so far) the tokens each beam has emitted
    last: Tensor  # (n*k,) each beam's last token: the next step's input

    @classmethod
    def start(cls, cache: DecoderCache, n: int, k: int, device: torch.device) -> Beams:
        scores = torch.full((n, k), -torch.inf, device=device)
        scores[:, 0] = 0.0  # all beams start identical: only the first may expand at step 0
        return cls(cache, torch.arange(n, device=device), scores,
                   torch.zeros((n * k, 0), dtype=torch.long, device=device),
                   torch.full((n * k,), BOS, dtype=torch.long, device=device))

    def advance(self, top_scores: Tensor, top_beam: Tensor, top_tok: Tensor, kth_best: Tensor,
                penalty: float) -> bool:
        """Keep the k best continuations that do not end in EOS and drop the sentences that are done; False
        when none is left. Each parent's first child takes its parent's slot, so that the cache copies only
        the rows of the other children (into the slots of dead beams)."""
        k = self.scores.size(1)
        live = top_scores.masked_fill(top_tok == EOS, -torch.inf)
        ranked, pick = live.topk(k, dim=1)  # (n, k), best first
        at = pick.gather(1, slot_order(top_beam.gather(1, pick)))  # the candidate each slot gets
        best, scores = ranked[:, 0], live.gather(1, at)
        beam_of, tok = top_beam.gather(1, at), top_tok.gather(1, at)
        parent = (torch.arange(self.active.numel(), device=scores.device)[:, None] * k + beam_of).view(-1)
        # A sentence is done when no live beam can beat the nbest-th finished one (-inf >= -inf: none can).
        keep = kth_best[self.active] < best / penalty
        sentences = None  # the encoder side changes only when sentences finish
        active = self.active
        if not keep.all():
            if not keep.any():
                return False
            sentences = keep.nonzero().squeeze(1)
            parent = parent.view(-1, k)[keep].view(-1)
            scores, tok, active = scores[keep], tok[keep], active[keep]
        self.prefixes = torch.cat([self.prefixes.index_select(0, parent), tok.view(-1, 1)], dim=1)
        self.active, self.scores, self.last = active, scores, tok.view(-1)
        self.cache = self.cache.select(parent, sentences)
        return True


@dataclass
class Finished:
    """The finished hypotheses of every sentence, and the score a live beam must beat to matter."""

    hyps: list[list[Hypothesis]]  # per original sentence; at most `nbest` once that many are found
    kth_best: Tensor  # (N,) score of each sentence's nbest-th finished hypothesis, -inf until there are nbest
    nbest: int

    @classmethod
    def start(cls, n: int, nbest: int, device: torch.device) -> Finished:
        return cls([[] for _ in range(n)], torch.full((n,), -torch.inf, device=device), nbest)

    def add(self, beams: Beams, top_scores: Tensor, top_beam: Tensor, top_tok: Tensor, penalty: float) -> None:
        """Finish the hypotheses that end in EOS among each sentence's k best candidates (a few per step)."""
        k = beams.scores.size(1)
        ends = (top_tok[:, :k] == EOS) & torch.isfinite(top_scores[:, :k])
        if not ends.any():
            return
        for s, j in ends.nonzero().tolist():
            i = int(beams.active[s])
            logprob = float(top_scores[s, j])
            tokens = beams.prefixes[s * k + int(top_beam[s, j])].tolist()
            self.hyps[i].append(Hypothesis(tokens, logprob / penalty, logprob))
            if len(self.hyps[i]) >= self.nbest:
                self.hyps[i] = sorted(self.hyps[i], key=lambda h: h.score, reverse=True)[:self.nbest]
                self.kth_best[i] = self.hyps[i][-1].score


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


def candidates(scores: Tensor, logp: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Each sentence's 2k best continuations of its k beams (2k: at least k of them do not end in EOS), best
    first: their scores (n, 2k), the beam each continues and the token it adds.

    They are among the beams' 2k best tokens each, so the top-k runs over (n*k, V) once and then over
    (n, k*2k), never over k*V.
    """
    k = scores.size(1)
    width = min(2 * k, logp.size(1))
    row_lp, row_tok = top_tokens(logp, width)  # (n*k, width)
    cand = (scores.view(-1, 1) + row_lp).view(-1, k * width)  # (n, k*width)
    top_scores, top_idx = cand.topk(min(2 * k, cand.size(1)), dim=1)
    return top_scores, top_idx // width, row_tok.view(-1, k * width).gather(1, top_idx)


def top_tokens(logp: Tensor, k: int, chunk: int = 64) -> tuple[Tensor, Tensor]:
    """`logp.topk(k, dim=1)` in two short passes: the k best of a row lie in the k chunks (of `chunk` tokens)
    with the highest maxima, since any other chunk has k elements above its maximum. The chunk maxima are one
    vectorised reduction; torch.topk over a whole vocabulary is not."""
    rows, vocab = logp.shape
    whole = vocab // chunk * chunk
    if whole < 4 * k * chunk:
        return logp.topk(k, dim=1)
    best_chunks = logp[:, :whole].view(rows, -1, chunk).amax(dim=2).topk(k, dim=1).indices  # (rows, k)
    cols = (best_chunks[:, :, None] * chunk + torch.arange(chunk, device=logp.device)).view(rows, -1)
    if whole < vocab:  # the tail that fills no chunk is always a candidate
        cols = torch.cat([cols, torch.arange(whole, vocab, device=logp.device).expand(rows, -1)], dim=1)
    values, at = logp.gather(1, cols).topk(k, dim=1)
    return values, cols.gather(1, at)


def slot_order(parents: Tensor) -> Tensor:
    """Where the next beams go, given the beam each continues (n, k): each parent's first (best) child takes
    its parent's slot, the other children the slots of the parents left without children, in order. Returns,
    for each slot, the index of the child in it; the slots of a sentence are then in no order of score."""
    k = parents.size(1)
    children = F.one_hot(parents, k)  # (n, child, parent)
    first = children.cumsum(1).gather(2, parents[..., None]).squeeze(2) == 1
    childless_first = (children.sum(1) > 0).to(torch.int8).argsort(dim=1, stable=True)  # childless parents first
    slot = torch.where(first, parents, childless_first.gather(1, ((~first).cumsum(1) - 1).clamp(min=0)))
    return slot.argsort(1)  # slot is a permutation: its inverse


def next_token_logprobs(logits: Tensor, bar_eos: bool, at_limit: Tensor) -> Tensor:
    """Log-probabilities (B, V) of the next token. With `bar_eos`, EOS cannot be chosen; rows `at_limit` may
    only end (EOS gets log-probability 0, all else -inf)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    if bar_eos:
        logp[:, EOS] = -torch.inf
    if at_limit.any():
        logp[at_limit] = -torch.inf
        logp[at_limit, EOS] = 0.0
    return logp


def until_eos(tokens: list[int]) -> list[int]:
    return tokens[:tokens.index(EOS)] if EOS in tokens else tokens


@torch.inference_mode()
def score_ids(model, srcs: list[list[int]], tgts: list[list[int]], device: torch.device | str = "cpu",
              batch_tokens: int = 4096, progress: bool = False) -> list[float]:
    """`score_pairs` of piece ids (no EOS; targets in reading order), each within the model's length."""
    if model.cfg.right_to_left:  # it reads a target last piece first
        tgts = [t[::-1] for t in tgts]
    scores = [0.0] * len(srcs)
    lengths = [max(len(s), len(t)) + 1 for s, t in zip(srcs, tgts, strict=True)]
    for idx in tqdm(batch_by_tokens(lengths, batch_tokens), unit="batch",
                    disable=not progress or not sys.stderr.isatty()):
        src = pad([srcs[i] for i in idx], [], [EOS]).to(device)
        tgt_in, tgt_out = (t.to(device) for t in shift_targets([tgts[i] for i in idx]))
        logp = torch.log_softmax(model(src, tgt_in).float(), dim=-1)  # (B, T, V)
        token_logp = logp.gather(-1, tgt_out[:, :, None]).squeeze(-1)  # (B, T)
        totals = token_logp.masked_fill(tgt_out == PAD, 0.0).sum(dim=1)
        for i, total in zip(idx, totals.tolist(), strict=True):
            scores[i] = total
    return scores


def search_lines(model, srcs: list[list[int] | None], opts: SearchOptions, device: torch.device,
                 constraints: Constraints | None = None) -> list[list[Hypothesis]]:
    """`translate_ids` of the sources that are not None, in order; an empty list for each None."""
    todo = [i for i, src in enumerate(srcs) if src is not None]
    results: list[list[Hypothesis]] = [[] for _ in srcs]
    held = None if constraints is None else constraints.select(todo)
    for i, hyps in zip(todo, translate_ids(model, [srcs[i] for i in todo], opts, device, held), strict=True):
        results[i] = hyps
    return results


def translate_ids(model, srcs: list[list[int]], opts: SearchOptions, device: torch.device,
                  constraints: Constraints | None = None) -> list[list[Hypothesis]]:
    """Search for every source (piece ids, no EOS); results in input order, `opts.nbest` per source. A model
    that searches its own way has a `search` method and is asked; any other is searched here over its KV cache.

    `constraints` (mt/decode/constrained.py): per source, the target phrases its translations must hold, e.g. a
    glossary's terms (mt/decode/glossary.py); the sources with some are searched by `constrained_beam_search`, in
    batches of their own, and the others as without. A model that searches its own way is asked with them only
    when some source has any, and refuses them if it cannot honour them."""
    if constraints is not None and not constraints:
        constraints = None
    if hasattr(model, "search"):
        return model.search(srcs, opts, device) if constraints is None else model.search(srcs, opts, device,
                                                                                          constraints)
    if constraints is not None and model.cfg.right_to_left:  # it writes the phrases last piece first too: what
        # glues onto a phrase's end would come before it, unseen, so words are not kept whole
        constraints = Constraints([[phrase[::-1] for phrase in phrases] for phrases in constraints.phrases])
    results: list[list[Hypothesis]] = [[] for _ in srcs]
    has = [constraints is not None and any(constraints.phrases[i]) for i in range(len(srcs))]
    plain, held = [i for i in range(len(srcs)) if not has[i]], [i for i in range(len(srcs)) if has[i]]
    for todo, constrained in ((plain, False), (held, True)):
        for batch in batch_by_tokens([len(srcs[i]) + 1 for i in todo], opts.batch_tokens):
            idx = [todo[b] for b in batch]
            src = pad([srcs[i] for i in idx], [], [EOS]).to(device)
            found = max(opts.nbest, opts.beam) if opts.finish_all else opts.nbest
            with autocast(opts.precision, device), attention_kernels(device):
                if constrained:
                    hyps = constrained_beam_search(model, src, constraints.select(idx), opts.beam, opts.len_penalty,
                                                   opts.max_len_a, opts.max_len_b, found)
                elif opts.beam == 1 and opts.nbest == 1:
                    hyps = [[h] for h in greedy(model, src, opts.max_len_a, opts.max_len_b)]
                else:
                    hyps = beam_search(model, src, opts.beam, opts.len_penalty, opts.max_len_a, opts.max_len_b,
                                       found)
            for i, h in zip(idx, hyps, strict=True):
                results[i] = h[:opts.nbest]
    if model.cfg.right_to_left:  # its pieces came last first: turn them back before anything reads them
        for hyps in results:
            for h in hyps:
                h.tokens.reverse()
    return results
