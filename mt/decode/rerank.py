"""Reranking: second opinions on the K best translations of a left-to-right model (or ensemble).

Two models can give them, stored beside the left-to-right one by `mt ensemble`:
- a right-to-left model (`model.right_to_left`, the `reranker`): it reads each target from its other end, so its
  mistakes are not the left-to-right model's (Liu et al. 2016's agreement, Sennrich et al. 2016's reranking); the
  recipes' `train.rerank` trains one as an ensemble run's last member. It also searches: its own K best join the
  left-to-right model's (Liu et al.'s joint K best), since a translation one model ranks low in its beam the other
  may have found;
- a model of the reverse direction (the `channel`, e.g. de→en beside en→de, any vocabulary): it scores how well a
  translation explains its source, log P(source | translation) (Yee et al. 2019's noisy channel, without their
  language model).

Every command that searches (translate, tune, report, serve, bench) then ranks the K best (2K with a reranker) by

    ((log P_l2r + w · log P_r2l) / lp(length) + c · log P_channel / lp(source length)) / (1 + w + c),

w and c the checkpoint's `decode.rerank_weight` and `decode.channel_weight` (`mt tune` chooses them; a missing
model's weight counts as 0) and lp the search's length penalty. The channel's score is the source's, so the
source's length divides it (Yee et al.'s 1/s): divided by the translation's, it would pay a translation for every
word it adds. Greedy search (beam 1) has nothing to rerank; it, forced scoring (`mt score`) and attention use the
left-to-right model, as does a reranker's weight 0 (it then neither searches nor scores).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, NamedTuple, Protocol

import torch
from torch import Tensor, nn

from mt.decode.alignments import cross_attention
from mt.decode.constrained import Constraints, holds
from mt.decode.search import (
    Hypothesis,
    SearchOptions,
    autocast,
    length_penalty,
    score_ids,
    search_lines,
    translate_ids,
)

if TYPE_CHECKING:
    from mt.data.tokenizer import Tokenizer


class Reverse(Protocol):
    """What a channel needs of its loaded checkpoint (mt/decode/load.py's `Loaded`): the model and its own
    tokenizers, and what leads its sources."""

    model: nn.Module
    src_tok: Tokenizer
    tgt_tok: Tokenizer
    lead: list[int]


class Channel:
    """A checkpoint of the reverse direction, loaded, and the forward model's tokenizers to hand it text."""

    def __init__(self, reverse: Reverse, src_tok: Tokenizer, tgt_tok: Tokenizer, lead: list[int]):
        self.reverse, self.src_tok, self.tgt_tok, self.lead = reverse, src_tok, tgt_tok, lead

    def logprobs(self, srcs: list[list[int] | None], found: list[list[Hypothesis]], batch_tokens: int,
                 device: torch.device) -> Explained:
        """log P(source | hypothesis) of each hypothesis in `found`, both turned to text and read in the channel's
        vocabulary (the source as the forward model read it: a piece it did not know stays unknown), and the
        length of each source so read."""
        owners = [i for i, hyps in enumerate(found) for _ in hyps]
        texts = self.tgt_tok.decode([h.tokens for hyps in found for h in hyps])
        limit = self.reverse.model.cfg.max_len - 1  # another vocabulary may cut a sentence into more pieces
        ch_srcs = [(self.reverse.lead + s)[:limit] for s in self.reverse.src_tok.encode(texts)]
        once = sorted(set(owners))  # each source read once, however many hypotheses it has
        encoded = self.reverse.tgt_tok.encode(self.src_tok.decode([srcs[i][len(self.lead):] for i in once]))
        read = {i: t[:limit] for i, t in zip(once, encoded, strict=True)}
        scores = per_source(found, score_ids(self.reverse.model, ch_srcs, [read[i] for i in owners], device,
                                             batch_tokens))
        return Explained(scores, [len(read[i]) + 1 if i in read else 1 for i in range(len(found))])  # EOS scored


class Explained(NamedTuple):
    """A channel model's opinion: log P(source | hypothesis) grouped per source, and each source's length in the
    channel's pieces, EOS included."""
    scores: list[list[float]]
    source_lengths: list[int]


class Reranked(nn.Module):
    """The decoding interface of `mt.model.transformer.Transformer`, served by the left-to-right model `left`;
    `right`, a right-to-left model of the same vocabulary, and `channel`, a model of the reverse direction, are there to
    `rerank` what searching `left` finds (either may be None)."""

    def __init__(self, left: nn.Module, right: nn.Module | None = None, channel: Channel | None = None):
        super().__init__()
        self.left, self.right, self.channel = left, right, channel
        self.cfg = left.cfg

    def encode(self, src: Tensor):
        return self.left.encode(src)

    def start_cache(self, memory, src_mask: Tensor, max_steps: int | None = None, beam: int = 1):
        return self.left.start_cache(memory, src_mask, max_steps, beam=beam)

    def decode_step(self, tokens: Tensor, cache):
        return self.left.decode_step(tokens, cache)

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        return self.left(src, tgt)

    def right_searches(self, weight: float) -> bool:
        """Whether the right-to-left model searches for candidates of its own at reranker weight `weight`."""
        return self.right is not None and weight > 0

    def search(self, srcs: list[list[int]], opts: SearchOptions, device: torch.device,
               constraints: Constraints | None = None) -> list[list[Hypothesis]]:
        """Greedy: the left-to-right model's; a beam: its K best (and the right-to-left model's) reranked. With
        `constraints` (see mt/decode/search.py's `translate_ids`), each model's K best are searched under them."""
        if opts.beam == 1:
            return translate_ids(self.left, srcs, opts, device, constraints)
        found, views = self.candidates(srcs, opts, device, constraints)
        ranked = rerank(found, views, opts.rerank_weight, opts.channel_weight, opts.len_penalty, 2 * opts.beam)
        if constraints is not None:  # those that hold every phrase first, as the search ranks them
            ranked = [sorted(hyps, key=lambda h, c=c: not holds(h.tokens, c))
                      for hyps, c in zip(ranked, constraints.phrases, strict=True)]
        return [hyps[:opts.nbest] for hyps in ranked]

    def candidates(self, srcs: list[list[int] | None], opts: SearchOptions, device: torch.device,
                   constraints: Constraints | None = None) -> tuple[list[list[Hypothesis]], Opinions]:
        """What `rerank` chooses among for each source (none for a None source): the left-to-right model's K best,
        joined by the right-to-left model's own where it has a weight, and every model's scores of each. They do
        not depend on the weights, so `mt tune` asks once per beam and length penalty."""
        wide = replace(opts, nbest=opts.beam)
        found = search_lines(self.left, srcs, wide, device, constraints)
        theirs = search_lines(self.right, srcs, wide, device, constraints) \
            if self.right_searches(opts.rerank_weight) else None
        with autocast(opts.precision, device):
            if theirs is not None:
                found = joined(self, srcs, found, theirs, opts.batch_tokens, device)
            return found, opinions(self, srcs, found, opts.batch_tokens, device)

    def cross_attention(self, src: Tensor, tgt: Tensor) -> Tensor:
        """The attention of the model that wrote the translation: the left-to-right one's."""
        return cross_attention(self.left, src, tgt)


Opinions = tuple[list[list[float]] | None, Explained | None]  # (log P_r2l, the channel's), None: no such model


def opinions(model: Reranked, srcs: list[list[int] | None], found: list[list[Hypothesis]], batch_tokens: int,
             device: torch.device) -> Opinions:
    """The right-to-left and channel models' log-probabilities of each hypothesis in `found` (each source's
    left-to-right K best; none for a None source)."""
    backward = None
    if model.right is not None:
        backward = per_source(found, score_ids(model.right, [srcs[i] for i, hyps in enumerate(found) for _ in hyps],
                                               [h.tokens for hyps in found for h in hyps], device, batch_tokens))
    channel = None if model.channel is None else model.channel.logprobs(srcs, found, batch_tokens, device)
    return backward, channel


def joined(model: Reranked, srcs: list[list[int]], left: list[list[Hypothesis]], right: list[list[Hypothesis]],
           batch_tokens: int, device: torch.device) -> list[list[Hypothesis]]:
    """Each source's left-to-right K best, then those of the right-to-left model's (`right`, in reading order) that
    are new, with the left-to-right model's log-probability of each, which the reranking starts from."""
    new = []
    for ours, theirs in zip(left, right, strict=True):
        seen = {tuple(h.tokens) for h in ours}
        new.append([h for h in theirs if tuple(h.tokens) not in seen])
    logprobs = per_source(new, score_ids(model.left, [srcs[i] for i, hyps in enumerate(new) for _ in hyps],
                                         [h.tokens for hyps in new for h in hyps], device, batch_tokens))
    return [ours + [Hypothesis(h.tokens, p, p) for h, p in zip(hyps, ps, strict=True)]
            for ours, hyps, ps in zip(left, new, logprobs, strict=True)]


def per_source(found: list[list[Hypothesis]], scores: list[float]) -> list[list[float]]:
    """`scores`, one per hypothesis of `found` in order, grouped as `found` is."""
    flat = iter(scores)
    return [[next(flat) for _ in hyps] for hyps in found]


def rerank(found: list[list[Hypothesis]], views: Opinions, weight: float, channel_weight: float,
           len_penalty: float, nbest: int) -> list[list[Hypothesis]]:
    """The `nbest` of each source's hypotheses `found`, best first by the score above, which each returned
    hypothesis carries; `logprob` stays the left-to-right model's."""
    backward, channel = views
    weight, channel_weight = (weight if backward is not None else 0.0), (channel_weight if channel is not None else 0.0)

    def score(i: int, j: int, h: Hypothesis) -> float:
        own = h.logprob + (weight * backward[i][j] if backward is not None else 0.0)
        explains = 0.0 if channel is None else \
            channel_weight * channel.scores[i][j] / length_penalty(channel.source_lengths[i], len_penalty)
        return (own / length_penalty(len(h.tokens) + 1, len_penalty) + explains) / (1 + weight + channel_weight)

    return [sorted((Hypothesis(h.tokens, score(i, j, h), h.logprob) for j, h in enumerate(hyps)),
                   key=lambda h: -h.score)[:nbest] for i, hyps in enumerate(found)]
