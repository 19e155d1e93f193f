"""The C decoding step (mt/fast/native_step.py) computes what the model's own `decode_step` computes: in fp32 the
same logits and cache, step by step through real searches; in int8 the products of each row quantized on its own."""

import copy

import pytest
import torch
from torch import Tensor, nn

import mt.errors
import mt.fast.choose
import mt.fast.native_step
from mt.data.batches import pad
from mt.data.tokenizer import BOS, EOS
from mt.decode.search import beam_search, greedy
from mt.fast.frozen import FrozenLinear, Int8Linear
from mt.fast.native_step import NativeDecodeStep, NativeEncode, library
from mt.fast.paths import fast_paths, for_inference
from mt.model.cache import DecoderCache

from ..conftest import tiny_model

pytestmark = [pytest.mark.numerics,
              pytest.mark.skipif(library() is None, reason="no C compiler, or a CPU without AVX2 and FMA")]

SOURCES = [[5, 9, 12, 7, 30, 11, EOS], [8, 14, 6, EOS], [22, 3 + 4, 17, 19, 25, EOS]]


def models(precision: str, **changes) -> tuple[nn.Module, nn.Module]:
    """The same tiny model twice, decoding in C and in PyTorch."""
    native = for_inference(tiny_model(seed=3, **changes), precision)
    plain = for_inference(tiny_model(seed=3, **changes), precision)
    plain.decode_step.max_rows = 0
    assert isinstance(native.decode_step, NativeDecodeStep)
    native.decode_step.max_rows = 16  # every step of the tests' searches, beyond the rows where it pays
    for model, positions in ((native, 1 << 16), (plain, 0)):  # and every source and ranking: in C, or in PyTorch,
        model.decode_step.rank.max_rows = positions           # whatever the machine measured (or, busy, did not)
        if isinstance(model.encode, NativeEncode):
            model.encode.max_rows = positions
    return native, plain


def checked(native: nn.Module, plain: nn.Module, rtol: float, atol: float) -> list[int]:
    """Makes `plain` compare every step it decodes with the C step on the same input and cache; returns the list of
    row counts it saw."""
    seen = []
    step = plain.decode_step

    def both(tokens: Tensor, cache):
        ours, _ = native.decode_step(tokens, copy.copy(cache))
        written = [k[cache.length].clone() for k in cache.self_k + cache.self_v]
        theirs, after = step.plain(tokens, cache)
        torch.testing.assert_close(ours, theirs, rtol=rtol, atol=atol)
        for a, b in zip(written, [k[cache.length] for k in cache.self_k + cache.self_v], strict=True):
            torch.testing.assert_close(a, b, rtol=rtol, atol=atol)  # the keys and values the C step cached
        seen.append(tokens.size(0))
        return theirs, after

    plain.decode_step = both
    return seen


@pytest.fixture(params=[1, 3], ids=lambda n: f"{n} threads")
def threads(request) -> int:
    """PyTorch's threads, as many shards of the sentences as the C step and encoder make (3: one sentence each)."""
    torch.set_num_threads(request.param)  # given back by conftest's keep_torch_threads
    return request.param


@pytest.mark.parametrize("changes", [dict(), dict(norm="pre"), dict(activation="gelu", output_bias=True),
                                     dict(activation="swish", tie_output=False),
                                     dict(d_model=36, d_ff=52, vocab=45)], ids=str)  # widths off the vectors' 8 and 16
def test_fp32_step_equals_the_plain_step_through_beam_search(changes, threads):
    native, plain = models("fp32", **changes)
    seen = checked(native, plain, rtol=1e-5, atol=1e-5)
    src = pad(SOURCES, [], [])
    beam_search(plain, src, beam=3, max_len_a=0.0, max_len_b=12, min_len=2)  # no sentence ends at the first step
    greedy(plain, src, max_len_a=0.0, max_len_b=12)
    greedy(plain, src[:1], max_len_a=0.0, max_len_b=12)
    assert {9, 3, 1} <= set(seen)  # beams of three sentences, greedy's three rows, a lone sentence's one


@pytest.mark.parametrize("changes", [dict(), dict(d_model=36, d_ff=52, vocab=45, norm="pre")], ids=str)
def test_int8_step_multiplies_rows_quantized_each_on_its_own(changes, threads):
    """The C int8 step against the plain step with each int8 layer replaced by a reference in PyTorch: the
    activations of each row quantized to unsigned integers with a zero point over [min(x, 0), max(x, 0)], to 256
    levels where the library sums with VNNI and 128 with AVX2, the weights PyTorch quantized."""
    native, plain = models("int8", **changes)
    quantized_by_row(plain)
    seen = checked(native, plain, rtol=1e-4, atol=1e-4)
    beam_search(plain, pad(SOURCES, [], []), beam=2, max_len_a=0.0, max_len_b=10)
    greedy(plain, pad(SOURCES[:1], [], []), max_len_a=0.0, max_len_b=10)
    assert {6, 1} <= set(seen)


def quantized_by_row(model: nn.Module) -> None:
    """Replaces each of the model's int8 layers by `RowInt8Linear`, in place."""
    for name, module in list(model.named_modules()):
        if isinstance(module, torch.ao.nn.quantized.dynamic.Linear):
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, RowInt8Linear(module))


class RowInt8Linear(nn.Module):
    def __init__(self, layer: nn.Module):
        super().__init__()
        weight = layer.weight()
        self.weight = weight.int_repr().clamp(min=-127).double() * weight.q_per_channel_scales()[:, None]
        self.bias = layer.bias()
        self.levels = 255 if library().instruction_set == "AVX-512 VNNI" else 127

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, x.size(-1)).float()
        low, high = rows.amin(dim=1, keepdim=True).clamp(max=0), rows.amax(dim=1, keepdim=True).clamp(min=0)
        scale = torch.where(high > low, (high - low) / self.levels, 1.0)
        zero = (-low / scale).round()  # in float32, as the C step rounds
        q = ((rows * (1 / scale)).round() + zero).clamp(0, self.levels)
        y = ((q - zero).double() * scale.double()) @ self.weight.t()
        y = y if self.bias is None else y + self.bias
        return y.float().view(*x.shape[:-1], -1)


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_a_step_and_an_encoding_in_shards_are_those_in_one_call_exactly(monkeypatch, precision):
    """Split across threads, each sentence's rows are computed as in one call: the same translation however many
    threads run it."""
    for layer in (Int8Linear, FrozenLinear):  # the products beside the C code (the source's keys and values) on one
        monkeypatch.setattr(layer, "takes_onednn", lambda self, rows: False)  # kernel: each thread count chooses
    native, _ = models(precision)
    src = pad(SOURCES, [], [])
    found = []
    for n in (1, 2, 3):
        torch.set_num_threads(n)
        memory, mask = native.encode(src)
        cache = native.start_cache(memory, mask, 4, beam=2)
        logits, cache = native.decode_step(torch.tensor([BOS, 9, BOS, 14, BOS, 7]), cache)
        found.append((memory[mask[:, 0, 0, :]], logits, *[k[0] for k in cache.self_k + cache.self_v]))
    for other in found[1:]:
        assert all(torch.equal(a, b) for a, b in zip(found[0], other, strict=True))


def test_int8_translates_as_fp32_does():
    """A trained-like check without training: int8 logits stay within a small fraction of fp32's spread."""
    native, _ = models("int8")
    fp32, _ = models("fp32")
    src = pad(SOURCES, [], [])
    for model in (native, fp32):
        model.cache = model.start_cache(*model.encode(src), 4)
    tokens = torch.full((3,), BOS)
    for _ in range(3):
        a, native.cache = native.decode_step(tokens, native.cache)
        b, fp32.cache = fp32.decode_step(tokens, fp32.cache)
        assert (a - b).abs().max() < 0.05 * (b.max() - b.min())
        tokens = b.argmax(-1)


def test_more_rows_than_the_c_step_takes_decode_in_pytorch(monkeypatch):
    native, _ = models("fp32")
    called = []
    monkeypatch.setattr(native.decode_step, "plain", lambda tokens, cache: called.append(len(tokens)) or (
        torch.zeros(len(tokens), 40), cache))
    native.decode_step.max_rows = 2
    cache = native.start_cache(*native.encode(pad(SOURCES, [], [])), 4)
    native.decode_step(torch.full((3,), BOS), cache)
    assert called == [3]


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_weights_loaded_after_for_inference_are_the_ones_decoded(precision):
    """The C step points at the weights; loading others into the model (new tensors, or int8's new packed ones)
    lays them out again rather than decoding with the old."""
    native, _ = models(precision)
    other = for_inference(tiny_model(seed=4), precision)
    native.load_state_dict(other.state_dict(), assign=True)
    other.decode_step.max_rows = 16  # both in C: the same weights must give the same logits
    if isinstance(other.encode, NativeEncode):
        other.encode.max_rows = native.encode.max_rows  # and their sources encoded alike
    src = pad(SOURCES, [], [])
    caches = [m.start_cache(*m.encode(src), 4) for m in (native, other)]
    ours, _ = native.decode_step(torch.full((3,), BOS), caches[0])
    theirs, _ = other.decode_step(torch.full((3,), BOS), caches[1])
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


def test_steps_the_c_step_cannot_take_are_pytorch_s():
    """A token outside the vocabulary, a cache whose beam does not match its rows, a model converted to float64
    after for_inference: PyTorch's step answers (or refuses), never the C step reading past its buffers."""
    native, plain = models("fp32")
    src = pad(SOURCES[:2], [], [])
    cache = native.start_cache(*native.encode(src), 4, beam=2)
    with pytest.raises(IndexError):
        native.decode_step(torch.full((4,), 40 + 5), cache)
    relabelled = copy.copy(cache)
    relabelled.beam = 1  # 4 rows over 2 sentences read as one row each: PyTorch's step works it out itself
    ours, _ = native.decode_step(torch.full((4,), BOS), relabelled)
    theirs, _ = plain.decode_step(torch.full((4,), BOS), plain.start_cache(*plain.encode(src), 4, beam=2))
    torch.testing.assert_close(ours, theirs)
    native.double()
    doubled = native.start_cache(*native.encode(src), 4)
    logits, _ = native.decode_step(torch.full((2,), BOS), doubled)
    assert logits.dtype == torch.float64


def c_up_to(monkeypatch, rows: int, positions: int) -> list[str]:
    """This test's measurements: C the faster up to `rows` rows and `positions` source positions; returns the
    questions asked."""
    asked = []

    def choice(question: str, candidates: dict) -> str:
        asked.append(question)
        size = int(question.rpartition(", ")[2])
        return "c" if size <= (rows if question.startswith("decoding step") else positions) else "pytorch"

    monkeypatch.setattr(mt.fast.choose, "choice", choice)
    return asked


def test_the_c_step_and_encoder_take_as_many_rows_as_they_are_measured_faster_for(monkeypatch):
    """The crossover is the last size of the ladder at which C was measured the faster, asked once per threads;
    `fast_paths` (what `mt bench` prints) names it."""
    asked = c_up_to(monkeypatch, rows=8, positions=64)
    model = for_inference(tiny_model(), "fp32")
    threads = torch.get_num_threads()
    assert f"decoding step: C ({library().instruction_set}), fp32, up to 8 rows on {threads} threads" in fast_paths(
        model)
    assert f"encoder: C, up to 64 source positions on {threads} threads" in fast_paths(model)
    assert [q.rpartition(", ")[2] for q in asked] == ["1", "2", "4", "8", "16", "16", "32", "64", "128"]
    fast_paths(model)
    assert len(asked) == 9  # remembered
    ran = []
    monkeypatch.setattr(model.encode, "run", lambda src: ran.append(src.numel()) or model.encode.plain(src))
    model.encode(torch.randint(4, 40, (4, 16)))
    model.encode(torch.randint(4, 40, (5, 13)))  # 65 positions: PyTorch's
    assert ran == [64]


@pytest.mark.parametrize("rows", [[0, 1, 1, 3, 4, 5], [1, 0, 2, 3, 4, 5], [0, 3, 3, 1, 4, 5], [5, 4, 3, 2, 1, 0]])
def test_rows_beam_search_moves_are_moved_in_c_as_in_pytorch(rows):
    native, _ = models("fp32")
    g = torch.Generator().manual_seed(0)
    buffers = [torch.randn(5, 6, 2, 3, generator=g) for _ in range(4)]
    mem = [torch.zeros(2, 2, 4, 3)] * 2
    mask = torch.ones(2, 1, 1, 4, dtype=torch.bool)
    in_c = DecoderCache(mem, mem, [b.clone() for b in buffers[:2]], [b.clone() for b in buffers[2:]], mask, 4, 3,
                        native.decode_step.move_rows)
    in_torch = DecoderCache(mem, mem, [b.clone() for b in buffers[:2]], [b.clone() for b in buffers[2:]], mask, 4, 3)
    in_c, in_torch = in_c.select(torch.tensor(rows)), in_torch.select(torch.tensor(rows))
    for a, b, before in zip(in_c.self_k + in_c.self_v, in_torch.self_k + in_torch.self_v, buffers, strict=True):
        assert torch.equal(a[:4], b[:4])  # the filled positions
        assert torch.equal(a[:4], before[:4, rows])
    with pytest.raises(IndexError, match="outside the cache's 6 rows"):
        DecoderCache(mem, mem, buffers[:2], buffers[2:], mask, 4, 3, native.decode_step.move_rows).select(
            torch.tensor([0, 1, 2, 3, 4, 9]))


def test_a_lone_sentence_decoded_in_c_is_pytorch_s():
    native, plain = models("fp32")
    src = pad(SOURCES[:1], [], [])
    for beam in (2, 4):
        ours = beam_search(native, src, beam=beam, max_len_a=0.0, max_len_b=12, nbest=beam)[0]
        theirs = beam_search(plain, src, beam=beam, max_len_a=0.0, max_len_b=12, nbest=beam)[0]
        assert [h.tokens for h in ours] == [h.tokens for h in theirs]
        assert [h.score for h in ours] == pytest.approx([h.score for h in theirs], abs=1e-4)
    ours, theirs = (greedy(m, src, max_len_a=0.0, max_len_b=12)[0] for m in (native, plain))
    assert ours.tokens == theirs.tokens
    assert ours.logprob == pytest.approx(theirs.logprob, abs=1e-4)


def ending_often(seed: int, precision: str, eos_bias: float) -> nn.Module:
    """A tiny model for decoding in which EOS is about as likely as the best other token."""
    model = tiny_model(seed=seed, output_bias=True)
    with torch.no_grad():
        model.output.bias[EOS] = eos_bias
    return for_inference(model, precision)


@pytest.mark.parametrize("precision", ["fp32", "int8"])
@pytest.mark.parametrize("seed", [3, 4, 5])
def test_greedy_search_in_one_call_into_c_finds_what_the_search_step_by_step_finds(precision, seed):
    """A few sentences' greedy search, all of it in C: the tokens and log-probabilities of the search in Python over
    the same C step, rows ending at their own steps (EOS, or each one's length limit; EOS barred before min_len)."""
    native, stepwise = ending_often(seed, precision, 2.5), ending_often(seed, precision, 2.5)
    stepwise.decode_step.greedy = None  # the search in Python, each step in C
    calls = []
    real = native.decode_step.greedy_in_c
    native.decode_step.greedy_in_c = lambda *args: calls.append(1) or real(*args)
    for model in (native, stepwise):
        model.decode_step.max_rows = 16
    lengths = set()
    for src, min_len in ((pad(SOURCES, [], []), 0), (pad(SOURCES, [], []), 3), (pad(SOURCES[1:2], [], []), 0)):
        ours, theirs = (greedy(m, src, max_len_a=1.0, max_len_b=2, min_len=min_len) for m in (native, stepwise))
        assert [h.tokens for h in ours] == [h.tokens for h in theirs]
        assert [h.logprob for h in ours] == pytest.approx([h.logprob for h in theirs], abs=1e-4)
        assert all(len(h.tokens) >= min_len for h in ours)
        lengths.update(len(h.tokens) for h in ours)
    assert len(calls) == 3
    assert min(lengths) < 3 and len(lengths) >= 2  # rows ended at several steps, some before min_len would allow


@pytest.mark.parametrize("precision", ["fp32", "int8"])
@pytest.mark.parametrize("seed", [3, 4])
def test_a_lone_sentence_s_beam_search_in_one_call_into_c_finds_what_the_search_step_by_step_finds(precision, seed):
    """All of a lone sentence's beam search in C: the n-best lists, scores and log-probabilities of the search in
    Python over the same C step, hypotheses finishing at several steps (EOS favoured), with and without min_len."""
    native, stepwise = ending_often(seed, precision, 2.0), ending_often(seed, precision, 2.0)
    stepwise.decode_step.beam_search = None  # the search in Python, each step in C
    calls, real = [], native.decode_step.beam_in_c
    native.decode_step.beam_in_c = lambda *args: calls.append(1) or real(*args)
    for model in (native, stepwise):
        model.decode_step.max_rows = 16
    lengths = set()
    for src in (pad(SOURCES[:1], [], []), pad(SOURCES[1:2], [], [])):
        for beam, nbest, alpha, min_len in ((4, 1, 0.6, 0), (3, 3, 1.0, 0), (2, 2, 0.0, 3), (5, 2, 0.6, 0)):
            ours, theirs = (beam_search(m, src, beam, alpha, 1.0, 3, nbest, min_len)[0] for m in (native, stepwise))
            assert [h.tokens for h in ours] == [h.tokens for h in theirs], (beam, nbest, alpha, min_len)
            assert [h.score for h in ours] == pytest.approx([h.score for h in theirs], abs=1e-6)
            assert [h.logprob for h in ours] == pytest.approx([h.logprob for h in theirs], abs=1e-6)
            lengths.update(len(h.tokens) for h in ours)
    assert len(calls) == 8
    assert len(lengths) >= 3  # hypotheses ended at several steps


@pytest.mark.parametrize("changes", [dict(), dict(norm="pre", activation="gelu"), dict(activation="swish"),
                                     dict(d_model=36, d_ff=52, vocab=45, norm="pre")], ids=str)
def test_fp32_encoder_in_c_equals_pytorch_s(changes, threads):
    native, _ = models("fp32", **changes)
    src = pad(SOURCES, [], [])  # three sentences, two of them padded
    memory, mask = native.encode(src)
    theirs, their_mask = native.encode.plain(src)
    assert torch.equal(mask, their_mask)
    kept = mask[:, 0, 0, :]
    torch.testing.assert_close(memory[kept], theirs[kept], rtol=1e-5, atol=1e-5)  # padding's rows are read by none


@pytest.mark.parametrize("changes", [dict(), dict(d_model=36, d_ff=52, vocab=45, norm="pre")], ids=str)
def test_int8_encoder_multiplies_rows_quantized_each_on_its_own(changes, threads):
    native, plain = models("int8", **changes)
    quantized_by_row(plain)
    src = pad(SOURCES, [], [])
    memory, mask = native.encode(src)
    theirs, _ = plain.encode.plain(src)
    kept = mask[:, 0, 0, :]
    torch.testing.assert_close(memory[kept], theirs[kept], rtol=1e-4, atol=1e-4)


def test_what_the_c_encoder_cannot_take_is_pytorch_s(monkeypatch):
    """More positions than it takes, a token outside the vocabulary, a model back in training (dropout): PyTorch's
    encoder answers (or refuses)."""
    native, _ = models("fp32")
    called = []
    plain = native.encode.plain
    monkeypatch.setattr(native.encode, "plain", lambda src: called.append(src.numel()) or plain(src))
    src = pad(SOURCES, [], [])
    native.encode.max_rows = src.numel() - 1
    native.encode(src)
    native.encode.max_rows = src.numel()
    native.encode(src)
    assert called == [src.numel()]
    with pytest.raises(IndexError):
        native.encode(torch.tensor([[5, 40 + 5, EOS]]))
    native.train()
    native.encode(src)
    assert called[-1] == src.numel()
