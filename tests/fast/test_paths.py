import copy
import re

import pytest
import torch
from torch import nn

import mt.fast.attention
import mt.fast.choose
import mt.fast.frozen
import mt.fast.linear
import mt.fast.loss
import mt.fast.paths
import mt.model.transformer
from mt.bench import preset_model
from mt.config import DecodeConfig
from mt.data.batches import pad
from mt.data.tokenizer import BOS, EOS, PAD
from mt.decode.search import SearchOptions, beam_search, greedy
from mt.decode.translate import compiled, translate_lines
from mt.errors import MtError
from mt.fast.attention import cpu_training_attention, matmul_attention
from mt.fast.compiled import FewRowsCompiled
from mt.fast.dropout import Dropout
from mt.fast.frozen import FrozenLinear, Int8Linear
from mt.fast.linear import Linear
from mt.fast.paths import fast_paths, for_inference, for_training
from mt.model.transformer import attention

from ..conftest import tiny_model
from .test_linear import force_cpu_matmul

pytestmark = pytest.mark.numerics


def assert_close(ours: torch.Tensor, theirs: torch.Tensor, bf16_error: float = 0.0) -> None:
    """fp32: torch.testing.assert_close (its defaults: rtol 1.3e-6, atol 1e-5). bf16 keeps 8
    significant bits and the two paths round at different places, so elements may differ by a few percent: the
    difference, as a whole, is at most `bf16_error` of `theirs` in L2 norm."""
    if ours.dtype != torch.bfloat16 and not bf16_error:
        torch.testing.assert_close(ours, theirs)
        return
    error = ((ours.float() - theirs.float()).norm() / theirs.float().norm()).item()
    assert error <= bf16_error, f"relative L2 difference {error:.4f} > {bf16_error}"


def qkv_and_mask(kind: str, dtype: torch.dtype, queries: int = 5):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(3, 2, queries, 8, generator=g).to(dtype)
    k, v = (torch.randn(3, 2, 5, 8, generator=g).to(dtype) for _ in range(2))
    keys = torch.tensor([[True] * 5, [True, True, True, False, False], [True] + [False] * 4])
    return q, k, v, keys.view(3, 1, 1, 5) if kind == "mask" else None


def attend_with_grads(fn, q, k, v, mask, p_drop, causal):
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out = fn(*leaves, mask, p_drop, causal)
    out.float().square().sum().backward()
    return [out, *(x.grad for x in leaves)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("p_drop", [0.0, 0.5])
@pytest.mark.parametrize("kind", ["causal", "mask", "none"])
def test_step_by_step_attention_computes_what_sdpa_does(monkeypatch, kind, p_drop, dtype):
    monkeypatch.setattr(mt.fast.attention, "dropout", lambda x, p, training: x)  # the same computation, minus the mask
    monkeypatch.setattr(mt.fast.attention, "steps_faster", lambda *args: True)
    taken = []
    monkeypatch.setattr(mt.fast.attention, "matmul_attention", lambda *args: taken.append(1) or matmul_attention(*args))
    q, k, v, mask = qkv_and_mask(kind, dtype)
    ours = attend_with_grads(cpu_training_attention, q, k, v, mask, p_drop, kind == "causal")
    assert taken  # the step-by-step path
    ref = attend_with_grads(attention, q, k, v, mask, 0.0, kind == "causal")  # SDPA
    for a, b in zip(ours, ref, strict=True):
        assert_close(a, b, bf16_error=2e-2 if dtype == torch.bfloat16 else 0.0)


@pytest.mark.parametrize("measured", ["steps", "fused"])
def test_training_attention_takes_the_way_measured_faster_for_its_kind_of_shape(monkeypatch, measured):
    """Asked once for each kind of shape (rows, queries and keys to a power of two, the rest as they are); the
    tests of values above and in test_contract.py hold whichever way it answers."""
    asked = []
    monkeypatch.setattr(mt.fast.attention, "choice", lambda question, candidates: asked.append(question) or measured)
    monkeypatch.setattr(mt.fast.attention, "_steps_faster", mt.fast.choose.Kept())
    taken = []
    monkeypatch.setattr(mt.fast.attention, "matmul_attention", lambda *args: taken.append(1) or matmul_attention(*args))
    q, k, v, mask = qkv_and_mask("mask", torch.float32)  # 3 x 2 rows of 5 queries by 5 keys of 8
    for _ in range(2):
        attend_with_grads(cpu_training_attention, q, k, v, mask, 0.5, False)
    assert bool(taken) == (measured == "steps")
    assert asked == [f"training attention float32, 8 rows of 8 queries by 8 keys of 8, masked, dropout, "
                     f"{torch.get_num_threads()} threads"]


@pytest.mark.parametrize("kind", ["mask", "none"])
def test_decoding_step_attention_computes_what_sdpa_does(kind):
    q, k, v, mask = qkv_and_mask(kind, torch.float32, queries=1)
    with torch.inference_mode():
        torch.testing.assert_close(matmul_attention(q, k, v, mask), attention(q, k, v, mask, 0.0, False))


def test_attention_dropout_keeps_the_rate_and_scale_of_sdpa():
    torch.manual_seed(0)
    q, k = torch.zeros(2, 2, 200, 8), torch.zeros(2, 2, 200, 8)  # uniform weights, 1/200 each
    v = torch.eye(200).expand(2, 2, 200, 200)  # each output row is its weights
    for fn in (matmul_attention, attention):
        weights = fn(q, k, v, None, 0.25, False)
        kept = weights != 0
        assert abs(kept.float().mean() - 0.75) < 0.01
        torch.testing.assert_close(weights[kept], torch.full_like(weights[kept], 1 / 200 / 0.75))


def src_tgt(b=3, s=7, t=6):
    g = torch.Generator().manual_seed(1)
    src, tgt = torch.randint(4, 40, (b, s), generator=g), torch.randint(4, 40, (b, t + 1), generator=g)
    src[1, 5:] = PAD
    tgt[:, 0] = BOS
    tgt[2, 4:] = PAD
    return src, tgt[:, :-1], tgt[:, 1:]


def loss_and_grads(model, dtype):
    src, tgt_in, tgt_out = src_tgt()
    with torch.autocast("cpu", torch.bfloat16, enabled=dtype == torch.bfloat16):
        loss = model.train()(src, tgt_in, tgt_out, 0.1)
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("norm", ["post", "pre"])
@pytest.mark.parametrize("precision", ["onednn", "mkl", "bf16"])
def test_the_model_for_training_computes_the_plain_models_loss_and_gradients(monkeypatch, precision, norm):
    force_cpu_matmul(monkeypatch, "mkl" if precision == "bf16" else precision)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    fast = for_training(tiny_model(norm=norm))
    plain = tiny_model(norm=norm)
    # Each fast path is in place, so the two models compute through different kernels.
    assert type(fast.output) is Linear and type(fast.decoder[0].ffn.dropout) is Dropout
    assert (fast.decoder[0].cross_attn.attend is cpu_training_attention
            and fast.output_loss is mt.fast.loss.output_loss)
    loss, grads = loss_and_grads(fast, dtype)
    plain_loss, plain_grads = loss_and_grads(plain, dtype)
    assert grads.keys() == plain_grads.keys()
    if dtype == torch.bfloat16:  # every gradient at once: some (the keys' biases) are rounding noise around 0
        torch.testing.assert_close(loss, plain_loss, rtol=5e-3, atol=0.0)
        assert_close(torch.cat([g.flatten() for g in grads.values()]),
                     torch.cat([g.flatten() for g in plain_grads.values()]), bf16_error=5e-2)
        return
    torch.testing.assert_close(loss, plain_loss)
    for name, grad in grads.items():  # fp32: a whole model's sums in another order
        torch.testing.assert_close(grad, plain_grads[name], rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


def test_for_training_keeps_the_parameters_and_the_checkpoint_format():
    model = tiny_model(norm="pre")
    params, state = list(model.parameters()), model.state_dict()
    fast = for_training(model)
    assert all(a is b for a, b in zip(fast.parameters(), params, strict=True))  # an optimizer sees the same ones
    assert fast.output.weight is fast.tgt_embed.weight  # tied stays tied
    assert {k: v.shape for k, v in fast.state_dict().items()} == {k: v.shape for k, v in state.items()}
    fast.load_state_dict(state)  # and plain checkpoints load into it


def hypotheses(model, src):
    return [[h.tokens for h in n] for n in beam_search(model, src, beam=3)], [h.tokens for h in greedy(model, src)]


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_decoding_for_inference_finds_what_the_plain_model_finds(norm):
    model = tiny_model(norm=norm, vocab=60)
    src, _, _ = src_tgt(b=4, s=9)
    with torch.inference_mode():
        plain = hypotheses(model, src)
        frozen = for_inference(copy.deepcopy(model), "fp32")
        assert isinstance(frozen.output, FrozenLinear)
        assert frozen.decoder[0].self_attn.attend_step is matmul_attention
        assert hypotheses(frozen, src) == plain
        memory, src_mask = model.encode(src)
        fast_memory, _ = frozen.encode(src)
        torch.testing.assert_close(fast_memory, memory)
        cache, fast_cache = model.start_cache(memory, src_mask), frozen.start_cache(memory, src_mask)
        for token in (BOS, 7, 9):
            tokens = torch.full((4,), token)
            (logits, cache), (fast_logits, fast_cache) = model.decode_step(tokens, cache), frozen.decode_step(
                tokens, fast_cache)
            torch.testing.assert_close(fast_logits, logits)


def test_mt_fast_0_turns_every_fast_path_off(monkeypatch):
    monkeypatch.setenv("MT_FAST", "0")
    model = for_inference(for_training(tiny_model()), "fp32")
    assert type(model.output) is nn.Linear and type(model.dropout) is nn.Dropout
    assert model.decoder[0].self_attn.attend is model.decoder[0].self_attn.attend_step is attention
    assert model.output_loss is mt.model.transformer.output_loss
    int8 = for_inference(tiny_model(), "int8")  # PyTorch's quantized layers, whose kernel it picks itself
    assert type(int8.output) is torch.ao.nn.quantized.dynamic.Linear and not fast_paths(int8)
    monkeypatch.setenv("MT_FAST", "yes")
    with pytest.raises(MtError, match="MT_FAST='yes': set it to 1 .* or 0"):
        for_training(tiny_model())


def test_int8_model_stays_close_to_fp32():
    model = preset_model("small")
    quantized = for_inference(copy.deepcopy(model), "int8")  # converts in place
    src = pad([[5, 6, 7, 8, 9, 10]], [], [EOS])
    tgt = torch.tensor([[2, 11, 12, 13]])
    with torch.no_grad():
        full, q = model(src, tgt), quantized(src, tgt)
    assert torch.nn.functional.cosine_similarity(full.flatten(), q.flatten(), dim=0) > 0.99


@pytest.mark.parametrize("onednn_from_rows", [1, 16, 1 << 20], ids=["onednn", "from 16 rows", "fbgemm"])
def test_int8_layers_compute_what_pytorchs_quantized_layer_does_on_either_kernel(monkeypatch, onednn_from_rows):
    """`Int8Linear` calls the quantized kernel directly: the numbers of torch's dynamically quantized Linear, exactly
    on fbgemm's kernel, to fp32 rounding on oneDNN's, which it takes where the chooser says, asked once for each
    power of two of rows."""
    asked = []

    def choice(question: str, candidates: dict) -> str:
        asked.append(question)
        return "onednn" if int(re.search(r"(\d+) rows", question).group(1)) >= onednn_from_rows else "fbgemm"

    monkeypatch.setattr(mt.fast.frozen, "choice", choice)
    model = for_inference(preset_model("small"), "int8")
    layers = [m for m in model.modules() if isinstance(m, Int8Linear)]
    assert len(layers) == len([m for m in preset_model("small").modules() if isinstance(m, nn.Linear)])
    for layer in (layers[0], model.output):
        plain = torch.ao.nn.quantized.dynamic.Linear(layer.in_features, layer.out_features)
        plain.set_weight_bias(*layer._weight_bias())
        for rows, x in ((1, torch.randn(1, layer.in_features)), (16, torch.randn(4, 4, layer.in_features))):
            for _ in range(2):
                if rows >= onednn_from_rows:
                    torch.testing.assert_close(layer(x), plain(x))
                else:
                    assert torch.equal(layer(x), plain(x))
        threads = torch.get_num_threads()
        shape = f"{layer.in_features}x{layer.out_features}"
        assert asked[-2:] == [f"int8 linear {shape}, {rows} rows, {threads} threads" for rows in (1, 16)]
        assert (layer._onednn is not None) == (onednn_from_rows <= 16)  # packed for oneDNN only where it is chosen


def test_int8_scores_every_piece_closely_even_where_the_output_rows_differ_in_scale():
    """The output layer is quantized too, a scale per row: pieces whose embeddings are small keep their logits."""
    model = preset_model("small")
    with torch.no_grad():
        model.output.weight[::2] *= 0.01  # half the pieces' rows (tied: the target embeddings) a hundred times smaller
    quantized = for_inference(copy.deepcopy(model), "int8")
    assert isinstance(quantized.output, Int8Linear)
    h = torch.randn(8, model.cfg.d_model)
    with torch.no_grad():
        full, out = model.output(h), quantized.output(h)
    assert out.dtype == torch.float32
    for rows in (slice(0, None, 2), slice(1, None, 2)):  # the small rows as close, for their size, as the large
        assert (out[:, rows] - full[:, rows]).abs().max() <= 0.04 * full[:, rows].abs().max()


def test_frozen_fp32_model_translates_exactly_as_the_trained_one():
    model = preset_model("small")
    frozen = for_inference(copy.deepcopy(model), "fp32")
    assert not any(type(m) is torch.nn.Linear or isinstance(m, torch.nn.Dropout) for m in frozen.modules())
    g = torch.Generator().manual_seed(1)
    src = pad([torch.randint(4, 8000, (n,), generator=g).tolist() for n in (3, 9, 6)], [], [EOS])
    with torch.no_grad():
        assert torch.allclose(model(src, src), frozen(src, src), atol=1e-4)
    assert [h.tokens for h in greedy(model, src)] == [h.tokens for h in greedy(frozen, src)]
    assert [[h.tokens for h in hs] for hs in beam_search(model, src, 3, nbest=3)] == \
        [[h.tokens for h in hs] for hs in beam_search(frozen, src, 3, nbest=3)]


def test_bf16_model_holds_bf16_weights_and_cache_and_decodes_in_or_out_of_autocast():
    """--precision bf16: the weights cast once (not at every call under autocast), the cache in bf16 (not cast at
    every step), and the model still callable outside autocast, in fp32 out."""
    model = preset_model("small")
    bf16 = for_inference(copy.deepcopy(model), "bf16")
    layers = [m for m in bf16.modules() if isinstance(m, FrozenLinear)]
    assert layers and all(m.weight_t.dtype == torch.bfloat16 for m in layers)
    src = pad([[5, 6, 7, 8, 9, 10], [11, 12, 13]], [], [EOS])
    tgt = torch.tensor([[BOS, 11, 12, 13], [BOS, 14, 15, 16]])
    with torch.inference_mode():
        full = model(src, tgt)
        outside = bf16(src, tgt)
        with torch.autocast("cpu", torch.bfloat16):
            inside = bf16(src, tgt)
            memory, src_mask = bf16.encode(src)
            assert bf16.start_cache(memory, src_mask).self_k[0].dtype == torch.bfloat16
    assert outside.dtype == torch.float32
    for ours in (outside, inside):
        assert_close(ours, full, bf16_error=5e-2)


def test_compiled_decoding_translates_as_the_eager_model(loaded):
    """`--compile`: the same n-best lists, in a batch and alone (2 rows: compiled on every CPU), after `compiled` has
    compiled at load."""
    lines = ["the cat sat on the mat", "a dog", "big red tree runs under the blue mat", ""]
    opts, cpu = SearchOptions.from_config(DecodeConfig(), beam=2, nbest=2), torch.device("cpu")
    for_inference(loaded.model, "fp32")

    def translated():
        return [[[h.tokens for h in hyps] for hyps in translate_lines(loaded, batch, opts, cpu)]
                for batch in (lines, lines[1:2], lines[2:3])]
    eager = translated()
    compiled(loaded, opts, cpu)
    assert translated() == eager


def test_a_compiled_step_of_many_rows_runs_eagerly():
    """From the rows where eager decoding multiplies through oneDNN, faster than the compiled step's kernel, the step
    stays eager; with no such rows (another kernel, a GPU), compiled for any number."""
    ran = []
    step = FewRowsCompiled(lambda x: ran.append("eager"), lambda x: ran.append("compiled"), 4)
    for rows in (1, 3, 4, 64):
        step(torch.zeros(rows, 1, 8))
    assert ran == ["compiled", "compiled", "eager", "eager"]
    ran.clear()
    FewRowsCompiled(lambda x: ran.append("eager"), lambda x: ran.append("compiled"), None)(torch.zeros(64, 1, 8))
    assert ran == ["compiled"]


def test_compile_leaves_an_int8_model_eager_and_says_so(loaded, capsys):
    """PyTorch's quantized layers break the compiled graph (the step ran slower compiled): `--compile` with int8
    warns on stderr and translates as the uncompiled model."""
    lines = ["the cat sat on the mat", "a dog"]
    opts, cpu = SearchOptions.from_config(DecodeConfig(), beam=2, precision="int8"), torch.device("cpu")
    for_inference(loaded.model, "int8")
    eager = [[h.tokens for h in hyps] for hyps in translate_lines(loaded, lines, opts, cpu)]
    compiled(loaded, opts, cpu)
    assert "int8 model decodes uncompiled" in capsys.readouterr().err
    assert "decoding step: compiled" not in fast_paths(loaded.model)
    assert [[h.tokens for h in hyps] for hyps in translate_lines(loaded, lines, opts, cpu)] == eager
