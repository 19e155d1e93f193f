"""Lexically constrained beam search: what it finishes holds the phrases whenever the length limit leaves room,
it ends (with a fallback) when they cannot be placed, and a search without constraints is the plain one."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mt.data.tokenizer import EOS, PAD
from mt.decode.constrained import Constraints, Phrases, Progress, allocate, bank_sizes, holds
from mt.decode.constrained_search import constrained_beam_search
from mt.decode.ctranslate2 import CTranslate2Model
from mt.decode.rerank import Reranked
from mt.decode.search import SearchOptions, beam_search, translate_ids
from mt.errors import MtError

from ..conftest import tiny_model
from .test_search import FixedModel, sources

CPU = torch.device("cpu")
MODELS = [tiny_model(seed=s) for s in range(3)]
R2L = tiny_model(seed=7, right_to_left=True)
TOKENS = st.integers(4, 39)  # tiny_model's vocabulary without the specials


def options(**changes) -> SearchOptions:
    opts = SearchOptions(beam=4, len_penalty=0.6, max_len_a=1.0, max_len_b=12, batch_tokens=64)
    for key, value in changes.items():
        setattr(opts, key, value)
    return opts


def rows(src: torch.Tensor) -> list[list[int]]:
    return [[t for t in row if t not in (PAD, EOS)] for row in src.tolist()]


def test_progress_follows_a_phrase_and_loses_it_when_left_half_way():
    rule = Phrases([[5, 6, 7], [9], []])  # the empty phrase is dropped
    assert rule.total == 4 and rule.allowed(Progress()) == {5, 9}
    p = rule.advance(Progress(), 5)
    assert p == Progress(0, 0, 1) and rule.met(p) == 1 and rule.allowed(p) == {6}
    assert rule.advance(p, 8) == Progress()  # left half-way: its progress is lost
    assert rule.advance(p, 9) == Progress(0b10, closed=True)  # ... and the token may start (here: place) another
    done = rule.advance(rule.advance(rule.advance(Progress(), 5), 6), 7)
    assert done == Progress(0b01, closed=True) and rule.placed(done) == 1 and not rule.complete(done)
    assert not rule.advance(done, 8).closed  # only the piece that ends a phrase closes it
    assert rule.complete(rule.advance(done, 9)) and rule.allowed(rule.advance(done, 9)) == set()


@settings(max_examples=60, derandomize=True, deadline=None)
@given(st.integers(1, 12), st.lists(st.integers(0, 9), min_size=1, max_size=6))
def test_the_beam_is_shared_among_the_banks_and_the_furthest_bank_with_candidates_gets_a_slot(beam, counts):
    sizes = bank_sizes(beam, counts)
    assert sum(sizes) == beam and min(sizes) >= 0
    furthest = max((b for b, c in enumerate(counts) if c), default=None)
    if furthest is not None:
        assert sizes[furthest] >= 1
    scored = [(-float(i), b) for b, c in enumerate(counts) for i in range(c)]
    assert len(allocate(scored, beam, len(counts))) == min(beam, len(scored))  # no slot empty while one waits


@settings(max_examples=15, derandomize=True, deadline=None)
@given(st.integers(0, 2), st.integers(1, 5), st.lists(st.lists(st.lists(TOKENS, min_size=1, max_size=3),
                                                               max_size=3), min_size=1, max_size=4))
def test_every_translation_holds_its_phrases_when_the_limit_leaves_room(seed, beam, phrases):
    src = sources(n=len(phrases), seed=seed)
    need = max(sum(len(p) for p in c) for c in phrases)
    glued = frozenset(range(30, 40))  # none may follow a phrase's last piece
    found = constrained_beam_search(MODELS[seed], src, Constraints(phrases, glued), beam=beam, max_len_a=0.0,
                                    max_len_b=need + 2, nbest=min(2, beam))
    for hyps, c in zip(found, phrases, strict=True):
        assert hyps and holds(hyps[0].tokens, c), (c, hyps[0].tokens)
        assert len(hyps[0].tokens) <= need + 1
        out = hyps[0].tokens + [EOS]
        for p in c:  # some occurrence of each phrase is not glued onto
            assert any(out[i:i + len(p)] == p and out[i + len(p)] not in glued for i in range(len(out) - len(p)))
        assert [h.score for h in hyps if holds(h.tokens, c)] == sorted(
            [h.score for h in hyps if holds(h.tokens, c)], reverse=True)


def test_a_hand_made_distribution_gives_the_expected_constrained_beams():
    # Step 1: A=4 (0.6) or B=5 (0.4); then EOS (1.0) after either, or C=6 after A (the model never wants it).
    table = {(): {4: 0.6, 5: 0.4}, (4,): {EOS: 0.9, 6: 0.1}, (5,): {EOS: 1.0}, (4, 6): {EOS: 1.0}}
    model = FixedModel(table)
    src = torch.tensor([[4, 5, EOS]])
    assert beam_search(model, src, 2, 0.0, 1.0, 5)[0][0].tokens == [4]
    # B must be placed: the model's second choice at step 1 is the translation, with its own probability.
    hyps = constrained_beam_search(model, src, Constraints([[[5]]]), beam=2, len_penalty=0.0, max_len_a=1.0,
                                   max_len_b=5)[0]
    assert hyps[0].tokens == [5] and hyps[0].logprob == pytest.approx(math.log(0.4))
    # C after A: placed where the model allows it least badly.
    hyps = constrained_beam_search(model, src, Constraints([[[6]]]), beam=2, len_penalty=0.0, max_len_a=1.0,
                                   max_len_b=5)[0]
    assert hyps[0].tokens == [4, 6] and hyps[0].logprob == pytest.approx(math.log(0.06))


def test_phrases_that_cannot_fit_end_the_search_with_the_best_fallback():
    src = sources(n=2, seed=1)
    too_long = [[[7, 8, 9, 10, 11, 12]], [[5], [6, 7, 8, 9, 10, 11]]]
    found = constrained_beam_search(MODELS[0], src, Constraints(too_long), beam=3, max_len_a=0.0, max_len_b=4,
                                    nbest=2)
    for hyps in found:
        assert len(hyps) == 2 and all(len(h.tokens) <= 3 for h in hyps)
    assert holds(found[1][0].tokens, [[5]])  # the phrase that fits is placed: most phrases first


def test_without_constraints_the_search_is_the_plain_one():
    src = sources(n=6, seed=2)
    srcs = rows(src)
    for model in MODELS[:1]:
        for opts in (options(), options(beam=1), options(nbest=2)):
            plain = translate_ids(model, srcs, opts, CPU)
            for none in (None, Constraints([[] for _ in srcs]), Constraints([[[]] for _ in srcs])):
                assert translate_ids(model, srcs, opts, CPU, none) == plain
            # A source without phrases, searched beside some that have them, is searched as without (in other
            # batches, which may change its scores in the last digits).
            mixed = [[[5, 6]] if i % 2 else [] for i in range(len(srcs))]
            got = translate_ids(model, srcs, opts, CPU, Constraints(mixed))
            for i in range(0, len(srcs), 2):
                assert [h.tokens for h in got[i]] == [h.tokens for h in plain[i]]
                assert [h.score for h in got[i]] == pytest.approx([h.score for h in plain[i]], abs=1e-4)
            assert all(holds(got[i][0].tokens, mixed[i]) for i in range(1, len(srcs), 2))


def test_a_right_to_left_model_places_the_phrases_in_reading_order():
    srcs = rows(sources(n=3, seed=4))
    phrases = [[[5, 6, 7]], [[8, 9]], []]
    for hyps, c in zip(translate_ids(R2L, srcs, options(), CPU, Constraints(phrases)), phrases, strict=True):
        assert holds(hyps[0].tokens, c)


def test_a_reranked_model_searches_and_ranks_under_the_constraints():
    model = Reranked(MODELS[1], R2L)
    srcs = rows(sources(n=3, seed=5))
    phrases = [[[5, 6]], [[9], [10]], [[11]]]
    for beam in (1, 3):
        for hyps, c in zip(translate_ids(model, srcs, options(beam=beam, nbest=1), CPU, Constraints(phrases)),
                           phrases, strict=True):
            assert holds(hyps[0].tokens, c)


def test_a_ctranslate2_export_refuses_constraints_in_one_line():
    export = object.__new__(CTranslate2Model)  # its translator is never reached
    with pytest.raises(MtError, match="cannot constrain its search.*--glossary-method replace"):
        export.search([[5, 6]], options(), CPU, Constraints([[[7]]]))
