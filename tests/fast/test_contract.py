"""Every fast path against the plain model over every feature of `ModelConfig`: for each field and every value it
allows (a Literal's choices, a bool's two, the numbers below), the training paths give the plain loss and
gradients, and the decoding paths (FrozenLinear, the step's attention, the C step and encoder, fp32, bf16 and int8)
the plain encoder output and logits, or the path declines (mt/fast/contract.py). A field added to ModelConfig fails
here until every contract names it and the walk has values for it."""

import dataclasses
import typing
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor

import mt.fast.attention
import mt.fast.dropout
from mt.config import ModelConfig
from mt.data.tokenizer import BOS, PAD
from mt.fast.contract import CONTRACTS, NATIVE_ENCODE, NATIVE_STEP
from mt.fast.native_step import NativeDecodeStep, NativeEncode, library
from mt.fast.paths import declined, fast_paths, for_inference, for_training
from mt.model.transformer import Transformer

from .test_native_step import quantized_by_row

pytestmark = pytest.mark.numerics

BASE = dict(d_model=16, n_heads=2, n_enc_layers=2, n_dec_layers=2, d_ff=32, activation="relu", norm="post",
            dropout=0.0, attn_dropout=0.0, act_dropout=0.0, max_len=24, src_vocab_size=40, tgt_vocab_size=40,
            share_embeddings=True, tie_output=True, output_bias=False, right_to_left=False)
# The values walked beyond the base for fields that are neither a Literal nor a bool, each with what else it needs
# (two vocabularies need embeddings of their own). 18 and 30: widths outside int8's groups of four.
NUMBERS = {
    "d_model": [24, 18], "n_heads": [1, 4], "n_enc_layers": [0, 1, 3], "n_dec_layers": [1, 3], "d_ff": [48, 30],
    "dropout": [0.3], "attn_dropout": [0.3], "act_dropout": [0.3], "max_len": [9, 64],
    "src_vocab_size": [(33, {"share_embeddings": False})], "tgt_vocab_size": [(45, {"share_embeddings": False})],
    "share_embeddings": [(False, {})],
}
FIELDS = [f.name for f in dataclasses.fields(ModelConfig)]


def values(name: str) -> list[tuple[object, dict]]:
    kind = typing.get_type_hints(ModelConfig)[name]
    if typing.get_origin(kind) is typing.Literal:
        return [(v, {}) for v in typing.get_args(kind)]
    if kind is bool and name not in NUMBERS:
        return [(True, {}), (False, {})]
    return [v if isinstance(v, tuple) else (v, {}) for v in NUMBERS[name]]


def variants() -> list:
    walked = [pytest.param(BASE, id="base")]
    for name in FIELDS:
        for value, needs in values(name):
            if value != BASE[name]:
                walked.append(pytest.param(BASE | needs | {name: value}, id=f"{name}={value}"))
    return walked


def test_every_contract_names_every_field_and_the_walk_has_values_for_each():
    for contract in CONTRACTS:
        assert sorted(contract.computes) == sorted(FIELDS), f"{contract.name}: name every ModelConfig field"
    assert sorted(BASE) == sorted(FIELDS)
    for name in FIELDS:
        assert values(name), f"model.{name}: give the walk values for it in NUMBERS"


def kept_by_column(x: Tensor, p: float, training: bool = True, inplace: bool = False) -> Tensor:
    """Dropout whose mask keeps the same columns of the last dimension everywhere: the plain and the fast models then
    drop the same elements, however a path lays the rows out (packed or padded)."""
    if not training or p == 0.0:
        return x
    keep = (torch.arange(x.size(-1), device=x.device) % 3 != 1).to(x.dtype)
    return x * keep / (1 - p)


def same_masks(monkeypatch) -> None:
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False):
        if dropout_p == 0.0:
            return sdpa(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
        return mt.fast.attention.matmul_attention(q, k, v, attn_mask, dropout_p, is_causal)

    monkeypatch.setattr(torch.nn.functional, "dropout", kept_by_column)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", attention)
    monkeypatch.setattr(mt.fast.dropout, "dropout", kept_by_column)
    monkeypatch.setattr(mt.fast.attention, "dropout", kept_by_column)


def built(settings: dict, cls: type = ModelConfig) -> Transformer:
    torch.manual_seed(0)
    return Transformer(cls(**settings))


def batch(cfg: ModelConfig) -> tuple[Tensor, Tensor, Tensor]:
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, cfg.src_vocab_size, (3, 7), generator=g)
    tgt = torch.randint(4, cfg.tgt_vocab_size, (3, 7), generator=g)
    src[1, 5:], tgt[2, 4:] = PAD, PAD
    tgt[:, 0] = BOS
    return src, tgt[:, :-1], tgt[:, 1:]


def loss_and_grads(model: Transformer) -> tuple[Tensor, dict[str, Tensor]]:
    loss = model.train()(*batch(model.cfg), smoothing=0.1)
    loss.backward()
    return loss.detach(), {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("settings", variants())
def test_training_paths_give_the_plain_loss_and_gradients(monkeypatch, settings):
    same_masks(monkeypatch)
    plain_loss, plain_grads = loss_and_grads(built(settings))
    loss, grads = loss_and_grads(for_training(built(settings)))
    torch.testing.assert_close(loss, plain_loss, rtol=1e-5, atol=1e-5)
    assert grads.keys() == plain_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, plain_grads[name], rtol=1e-4, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


def encoded_and_stepped(model: Transformer, starts: Transformer) -> tuple[Tensor, list[Tensor]]:
    """The encoder's output at the real positions and the logits of five decoding steps along fixed tokens, from the
    cache that `starts` makes of the source (the cross-attention's keys and values)."""
    src, tgt, _ = batch(model.cfg)
    with torch.inference_mode():
        memory, src_mask = model.encode(src)
        cache = starts.start_cache(starts.encode(src)[0], src_mask, max_steps=min(8, model.cfg.max_len))
        logits = []
        for t in range(5):
            step, cache = model.decode_step(tgt[:, t], cache)
            logits.append(step)
    return memory[src_mask[:, 0, 0]], logits


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
@pytest.mark.parametrize("settings", variants())
def test_decoding_paths_give_the_plain_encoder_output_and_logits(settings, precision):
    """fp32 against the plain model, bf16 against the plain model under autocast; int8's C step against PyTorch's
    int8 layers with each row quantized on its own, as the C step quantizes (tests/fast/test_native_step.py)."""
    fast = for_inference(built(settings), precision)
    plain = for_inference(built(settings), precision) if precision == "int8" else built(settings).eval()
    plain.decode_step = getattr(plain.decode_step, "plain", plain.decode_step)  # PyTorch's, not the C step
    plain.encode = getattr(plain.encode, "plain", plain.encode)
    if isinstance(fast.decode_step, NativeDecodeStep) and precision == "int8":
        quantized_by_row(plain)
    cfg = fast.cfg
    native = library() is not None and precision in NATIVE_STEP  # no C for bf16
    assert isinstance(fast.decode_step, NativeDecodeStep) == (native and not NATIVE_STEP[precision].declines(cfg))
    assert isinstance(fast.encode, NativeEncode) == (native and not NATIVE_ENCODE[precision].declines(cfg))
    if isinstance(fast.decode_step, NativeDecodeStep):
        fast.decode_step.max_rows = 16  # the test's three rows in C, wherever the machine's crossover lies
    if isinstance(fast.encode, NativeEncode):
        fast.encode.max_rows = 1 << 16  # and its source in C, whatever the machine measured (or, busy, did not)
    tolerance = dict(rtol=1e-4, atol=1e-4) if precision == "int8" else dict(rtol=1e-5, atol=1e-5)
    # int8: the C step reads keys and values that PyTorch's int8 layers made, so both start from the reference's
    starts = plain if precision == "int8" else fast
    with torch.autocast("cpu", torch.bfloat16, enabled=precision == "bf16"):
        memory, logits = encoded_and_stepped(fast, starts)
        plain_memory, plain_logits = encoded_and_stepped(plain, plain)
    for ours, theirs in zip([memory, *logits], [plain_memory, *plain_logits], strict=True):
        if precision == "bf16":  # 8 significant bits, rounded where oneDNN's and PyTorch's products differ
            assert ((ours.float() - theirs.float()).norm() / theirs.float().norm()).item() < 2e-2
        else:
            torch.testing.assert_close(ours, theirs, **tolerance)


@dataclass
class WithQkNorm(ModelConfig):
    qk_norm: bool = False  # a feature no fast path has been told of


def test_a_field_no_contract_names_turns_every_path_off():
    settings = BASE | {"dropout": 0.1}
    trained = for_training(built(settings, WithQkNorm))
    decoding = for_inference(built(settings, WithQkNorm), "fp32")
    assert fast_paths(trained) == [] and fast_paths(decoding) == []
    assert declined(trained) == sorted(f"{c.name}: computes no model.qk_norm" for c in CONTRACTS)


def test_a_value_a_contract_does_not_list_turns_that_path_off():
    """int8's C step packs its weights in groups of four inputs: a width of 18 runs in PyTorch, and says why."""
    model = for_inference(built(BASE | {"d_model": 18}), "int8")
    assert not isinstance(model.decode_step, NativeDecodeStep) and not isinstance(model.encode, NativeEncode)
    assert "the int8 decoding step in C: computes no model.d_model=18" in declined(model)
