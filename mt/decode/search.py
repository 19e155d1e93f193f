"""Greedy and beam search over a batch of source sentences, decoding incrementally with a KV cache; and the
teacher-forced score of given translations (`score_ids`), which rerankers and `mt score` ask for.

What decodes is asked through one interface: `translate_ids(model, srcs, opts, device)`. mt's own models and
ensembles of them decode incrementally (`encode`, `start_cache`, `decode_step`) and are searched here; a kind that
searches its own way (a model reranked by others, mt/decode/rerank.py; a CTranslate2 export,
mt/decode/ctranslate2.py) has a `search(srcs, opts, device)` method, which is called instead. Likewise for
attention weights: such a kind has `cross_attention(src, tgt)` (mt/decode/alignments.py).

Both functions take a model with `encode` / `start_cache` / `decode_step` (see mt/model/transformer.py) and a padded
source batch (B, S), and return hypotheses as lists of piece ids without BOS/EOS. Finished sentences leave the
running batch, so a long sentence does not keep short ones computing; they leave together, once they are a quarter
of its rows (`COMPACT_AT`), since each leaving copies the cache of the rows that stay. A few rows (a lone sentence,
its beam) are searched by mt/decode/few_rows.py, the same searches with their books in Python lists; what all
searches share is mt/decode/hypotheses.py's. `constrained_beam_search` (mt/decode/constrained_search.py) is beam
search whose translations must hold given target phrases (a glossary's terms), which `translate_ids` takes per
source.
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
from mt.decode.constrained import Constraints
from mt.decode.constrained_search import constrained_beam_search
from mt.decode.few_rows import few_beam_search, few_greedy
from mt.decode.hypotheses import (
    Hypothesis,
    best_tokens,
    length_penalty,
    max_lengths,
    next_token_best,
    ranked,
    until_eos,
)
from mt.device import attention_kernels
from mt.device import autocast as device_autocast
from mt.model.cache import DecoderCache

# The share of a running batch's rows that must be finished before they leave it: until then they decode on, their
# outputs ignored. Each leaving copies every kept row's cache: a quarter at a time copies a third as much
# (docs/performance.md).
COMPACT_AT = 0.25


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


FEW_ROWS = 8  # up to this many rows (sentences x beam) a search keeps its books in Python lists (few_rows.py)


@torch.inference_mode()
def greedy(model, src: Tensor, max_len_a: float = 1.5, max_len_b: int = 10, min_len: int = 0) -> list[Hypothesis]:
    """The most likely next token at every step until EOS or the length limit (EOS barred before `min_len`)."""
    if src.size(0) <= FEW_ROWS:
        return few_greedy(model, src, max_len_a, max_len_b, min_len)
    memory, src_mask = model.encode(src)
    limit = max_lengths(src, max_len_a, max_len_b, model.cfg.max_len)
    steps = int(limit.max())
    cache = model.start_cache(memory, src_mask, steps)
    n = src.size(0)
    active = torch.arange(n, device=src.device)  # original row of each running row
    tokens = torch.full((n,), BOS, dtype=torch.long, device=src.device)
    out = torch.full((n, steps), EOS, dtype=torch.long, device=src.device)
    logprob = torch.zeros(n, device=src.device)
    done = torch.zeros(n, dtype=torch.bool, device=src.device)  # rows that ended and decode on, ignored
    for step in range(steps):
        logits, cache = model.decode_step(tokens, cache)
        best, tokens = next_token_best(logits, step < min_len, limit[active] <= step + 1)
        tokens, best = tokens.masked_fill(done, EOS), best.masked_fill(done, 0.0)
        out[active, step] = tokens
        logprob[active] += best
        done = tokens == EOS
        ended = int(done.sum())  # the step's one wait for the device: whether to stop, compact, or go on
        if ended:
            if ended == done.numel():
                break
            if ended >= COMPACT_AT * done.numel():
                keep = (~done).nonzero().squeeze(1)
                active, tokens, done, cache = active[keep], tokens[keep], done[keep], cache.select(keep, keep)
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
    # The first step's beams are all alike: it decodes one row per sentence, then the cache widens to the beams.
    beams = Beams.start(model.start_cache(memory, src_mask, steps), src.size(0), beam, src.device)
    finished = Finished.start(src.size(0), nbest, steps, src.device)
    for step in range(steps):
        if step == 0:
            logits, first = model.decode_step(beams.last[::beam], beams.cache)
            logits, beams.cache = logits.repeat_interleave(beam, dim=0), first.widen(beam)
        else:
            logits, beams.cache = model.decode_step(beams.last, beams.cache)
        at_limit = (limit[beams.active] <= step + 1).repeat_interleave(beam)
        row_lp, row_tok = best_tokens(model, logits, min(2 * beam, logits.size(1)), step < min_len, at_limit)
        top_scores, top_beam, top_tok = ranked(beams.scores, row_lp, row_tok)
        penalty = length_penalty(step + 1, len_penalty)
        finished.add(beams, top_scores, top_beam, top_tok, penalty)
        if not beams.advance(top_scores, top_beam, top_tok, finished.kth_best, penalty):
            break
    return finished.hypotheses()


@dataclass
class Beams:
    """The k live beams of each running sentence, side by side: row s*k + j of (n*k, ...) is sentence s's beam j."""

    cache: DecoderCache  # the decoder's state, rows as above (one per sentence before the first step)
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
        # A sentence is done when no live beam can beat the nbest-th finished one (-inf >= -inf: none can). A done
        # sentence's beams decode on, scored -inf (so they finish nothing) and unmoved, until done sentences are
        # COMPACT_AT of the batch and leave it together.
        keep = kth_best[self.active] < best / penalty
        sentences = None  # the encoder side changes only when sentences finish
        active = self.active
        done = int((~keep).sum())  # the step's one wait for the device: whether to stop, compact, or go on
        if done:
            if done == keep.numel():
                return False
            if done >= COMPACT_AT * keep.numel():
                sentences = keep.nonzero().squeeze(1)
                parent = parent.view(-1, k)[keep].view(-1)
                scores, tok, active = scores[keep], tok[keep], active[keep]
            else:
                scores = scores.masked_fill(~keep[:, None], -torch.inf)
                rows = torch.arange(parent.numel(), device=parent.device)
                parent = torch.where(keep.repeat_interleave(k), parent, rows)
        self.prefixes = torch.cat([self.prefixes.index_select(0, parent), tok.view(-1, 1)], dim=1)
        self.active, self.scores, self.last = active, scores, tok.view(-1)
        self.cache = self.cache.select(parent, sentences)
        return True


@dataclass
class Finished:
    """The finished hypotheses of every sentence, best first, and the score a live beam must beat to matter: kept on
    the search's device, so that finishing hypotheses never waits for the host (on a GPU, each such wait stalls the
    queue of kernels). A slot scored -inf holds none."""

    scores: Tensor  # (N, nbest) each sentence's best finished hypotheses' scores, best first, in float64 as Python's
    logprobs: Tensor  # (N, nbest) their total log-probabilities
    tokens: Tensor  # (N, nbest, steps) their pieces, EOS after the last
    lengths: Tensor  # (N, nbest) how many pieces each has

    @classmethod
    def start(cls, n: int, nbest: int, steps: int, device: torch.device) -> Finished:
        return cls(torch.full((n, nbest), -torch.inf, dtype=torch.float64, device=device),
                   torch.zeros(n, nbest, device=device),
                   torch.full((n, nbest, steps), EOS, dtype=torch.long, device=device),
                   torch.zeros(n, nbest, dtype=torch.long, device=device))

    @property
    def kth_best(self) -> Tensor:
        """(N,) the score of each sentence's nbest-th finished hypothesis, -inf until there are nbest."""
        return self.scores[:, -1].float()

    def add(self, beams: Beams, top_scores: Tensor, top_beam: Tensor, top_tok: Tensor, penalty: float) -> None:
        """Finish the hypotheses that end in EOS among each sentence's k best candidates, ranked with those already
        finished; among equal scores the earlier finished, then the better candidate, comes first."""
        n, k = beams.scores.shape
        nbest, length = self.scores.size(1), beams.prefixes.size(1)
        ends = (top_tok[:, :k] == EOS) & torch.isfinite(top_scores[:, :k])
        logprob = top_scores[:, :k]
        score = (logprob.double() / penalty).masked_fill(~ends, -torch.inf)
        parents = beams.prefixes.view(n, k, length).gather(1, top_beam[:, :k, None].expand(-1, -1, length))
        tokens = torch.full((n, k, self.tokens.size(2)), EOS, dtype=torch.long, device=parents.device)
        tokens[:, :, :length] = parents
        active = beams.active
        ranked, order = torch.cat([self.scores[active], score], 1).sort(dim=1, descending=True, stable=True)
        order = order[:, :nbest]

        def best(kept: Tensor, new: Tensor) -> Tensor:
            """The finished `kept` (n, nbest, ...) and `new` (n, k, ...) side by side, in the ranked order."""
            both = torch.cat([kept, new], 1)
            return both.gather(1, order.view(*order.shape, *[1] * (both.dim() - 2)).expand(-1, -1, *both.shape[2:]))

        self.scores[active] = ranked[:, :nbest]
        self.logprobs[active] = best(self.logprobs[active], logprob)
        self.lengths[active] = best(self.lengths[active], torch.full_like(ends, length, dtype=torch.long))
        self.tokens[active] = best(self.tokens[active], tokens)

    def hypotheses(self) -> list[list[Hypothesis]]:
        """Each sentence's finished hypotheses, best first: read from the device once, at the end."""
        found = []
        for scores, logprobs, tokens, lengths in zip(self.scores.tolist(), self.logprobs.tolist(), self.tokens.tolist(),
                                                     self.lengths.tolist(), strict=True):
            found.append([Hypothesis(t[:n], s, lp) for s, lp, t, n in zip(scores, logprobs, tokens, lengths,
                                                                          strict=True) if s != -math.inf])
        return found


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
