"""The fast linear layers compute nn.Linear on either CPU kernel, and take for each product the kernel that this
machine's measurement chose (mt/fast/choose.py): here the measurement is stood in for by a chooser whose answer
the test sets, so that no verdict depends on this CPU."""

import copy
import re
import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mt.fast.choose
import mt.fast.frozen
import mt.fast.linear
from mt.data.tokenizer import BOS
from mt.decode.search import beam_search
from mt.fast.frozen import FrozenLinear
from mt.fast.linear import Linear, OneDnnLinear, forced, onednn_available
from mt.fast.paths import fast_paths, for_inference, for_training

from ..conftest import tiny_model

pytestmark = pytest.mark.numerics

onednn = pytest.mark.skipif(not onednn_available(), reason="this PyTorch build has no oneDNN linear")


def force_cpu_matmul(monkeypatch, choice: str) -> None:
    """Every fp32 CPU matmul of mt's fast linears through `choice` ("onednn" or "mkl", as MT_CPU_MATMUL says) for
    this test, whatever this machine's measurements chose."""
    if choice == "onednn" and not onednn_available():
        pytest.skip("this PyTorch build has no oneDNN linear")
    monkeypatch.setenv("MT_CPU_MATMUL", choice)
    assert forced() == choice


def chooser_says(monkeypatch, onednn_from_rows: int, trains_on: str = "onednn") -> list[str]:
    """The kernel choices of this test: oneDNN for decoding's products from `onednn_from_rows` rows (a power of two),
    MKL for fewer; `trains_on` for training's; returns the questions asked."""
    monkeypatch.delenv("MT_CPU_MATMUL", raising=False)
    monkeypatch.setattr(mt.fast.linear, "_training", mt.fast.choose.Kept())
    asked = []

    def choice(question: str, candidates: dict) -> str:
        asked.append(question)
        rows = re.search(r"(\d+) rows", question)
        if rows is None:
            return trains_on
        return "onednn" if int(rows.group(1)) >= onednn_from_rows else "mkl"

    monkeypatch.setattr(mt.fast.linear, "choice", choice)
    return asked


def forward_and_grads(fn, x, w, b, grad):
    """fn(x, w, b) and the gradients of x, w (and b) for the output gradient `grad`."""
    leaves = [p.detach().clone().requires_grad_() for p in (x, w, b) if p is not None]
    out = fn(*leaves) if b is not None else fn(*leaves, None)
    out.backward(grad)
    return [out] + [p.grad for p in leaves]


@onednn
@pytest.mark.parametrize("bias", [True, False])
def test_onednn_linear_computes_what_f_linear_computes_forward_and_backward(bias):
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(3, 9, 48, generator=g), torch.randn(80, 48, generator=g)
    b = torch.randn(80, generator=g) if bias else None
    grad = torch.randn(3, 9, 80, generator=g)
    for ours, theirs in zip(forward_and_grads(OneDnnLinear.apply, x, w, b, grad),
                            forward_and_grads(F.linear, x, w, b, grad), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-4)  # fp32: the same sums in another order


@onednn
def test_a_layer_first_met_on_a_busy_machine_takes_the_measured_kernel_once_it_can_be_timed(monkeypatch, tmp_path):
    """Training whose first products were timed while other processes kept the cores busy multiplies on the default
    (MKL) only until the question may be timed again (RETRY_S), then on the kernel measured the faster."""
    monkeypatch.delenv("MT_CPU_MATMUL", raising=False)
    monkeypatch.setattr(mt.fast.linear, "_training", mt.fast.choose.Kept())
    monkeypatch.setattr(mt.fast.choose, "path", lambda: tmp_path / "choices.json")
    monkeypatch.setattr(mt.fast.choose, "_made", {})
    monkeypatch.setattr(mt.fast.choose, "_busy", {})
    timings = iter([None] * mt.fast.choose.TRIES + [{"mkl": 0.002, "onednn": 0.001}])
    monkeypatch.setattr(mt.fast.choose, "measured", lambda candidates: next(timings))
    x, w = torch.randn(4, 48), torch.randn(80, 48)
    assert not mt.fast.linear.trains_on_onednn(x, w) and not mt.fast.linear.trains_on_onednn(x, w)  # busy: MKL
    later = time.monotonic() + mt.fast.choose.RETRY_S
    monkeypatch.setattr(mt.fast.choose, "clock", lambda: later)
    assert mt.fast.linear.trains_on_onednn(x, w) and mt.fast.linear.trains_on_onednn(x, w)


@pytest.mark.parametrize("kernel", ["onednn", "mkl"])
def test_the_fast_linear_layer_computes_what_nn_linear_computes(monkeypatch, kernel):
    force_cpu_matmul(monkeypatch, kernel)
    torch.manual_seed(0)
    plain = nn.Linear(48, 80)
    fast = Linear(48, 80)
    fast.load_state_dict(plain.state_dict())
    x, grad = torch.randn(2, 7, 48), torch.randn(2, 7, 80)
    results = []
    for layer in (fast, plain):
        leaf = x.clone().requires_grad_()
        out = layer(leaf)
        out.backward(grad)
        results.append((out, leaf.grad, layer.weight.grad, layer.bias.grad))
    for ours, theirs in zip(*results, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-4)  # fp32: the same sums in another order
    with torch.inference_mode():  # decoding takes a shorter way to the same kernel: the very same numbers
        assert torch.equal(fast(x), results[0][0].detach())
    # Outside its conditions (here bf16 autocast) it is the plain kernel: the very same numbers.
    with torch.autocast("cpu", torch.bfloat16):
        assert torch.equal(fast(x), plain(x))


@pytest.mark.parametrize("kernel", ["onednn", "mkl"])
def test_the_model_learns_and_translates_the_same_on_either_cpu_kernel(monkeypatch, kernel):
    src = torch.randint(4, 40, (3, 7), generator=torch.Generator().manual_seed(1))
    tgt = torch.randint(4, 40, (3, 6), generator=torch.Generator().manual_seed(2))
    tgt[:, 0] = BOS
    results = []
    for choice in (kernel, None):  # None: the plain model, nn.Linear throughout
        if choice:
            force_cpu_matmul(monkeypatch, choice)
        model = for_training(tiny_model()) if choice else tiny_model()
        loss = F.cross_entropy(model(src, tgt).flatten(0, 1), tgt.roll(-1, 1).flatten())
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters()]
        hyps = beam_search(for_inference(model, "fp32") if choice else model, src, beam=3)
        results.append((loss.detach(), grads, [[h.tokens for h in n] for n in hyps]))
    (loss_a, grads_a, hyps_a), (loss_b, grads_b, hyps_b) = results
    torch.testing.assert_close(loss_a, loss_b)
    for a, b in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert hyps_a == hyps_b


def test_a_wrong_kernel_override_is_refused_with_the_choices(monkeypatch):
    monkeypatch.setenv("MT_CPU_MATMUL", "blas")
    with pytest.raises(ValueError, match="MT_CPU_MATMUL must be one of auto, mkl, onednn"):
        forced()


def spied(monkeypatch) -> list:
    calls = []
    for module in (mt.fast.linear, mt.fast.frozen):
        real = module.onednn_mm
        monkeypatch.setattr(module, "onednn_mm", lambda *args, real=real: calls.append(args) or real(*args))
    return calls


@onednn
def test_decoding_takes_the_kernel_chosen_for_each_power_of_two_of_rows(monkeypatch):
    """Each product goes where the chooser said for its rows (rounded up to a power of two) and threads, asked once
    per kind of shape, and the layer computes nn.Linear either way."""
    asked = chooser_says(monkeypatch, onednn_from_rows=8)
    calls = spied(monkeypatch)
    plain = nn.Linear(48, 80)
    frozen = FrozenLinear(plain)
    for rows, kernel in ((1, "mkl"), (4, "mkl"), (5, "onednn"), (8, "onednn"), (100, "onednn"), (3, "mkl"),
                         (7, "onednn")):
        x = torch.randn(rows, 1, 48)
        calls.clear()
        with torch.no_grad():
            torch.testing.assert_close(frozen(x), plain(x), rtol=1e-5, atol=1e-4)
        assert ("onednn" if calls else "mkl") == kernel, rows
    threads = torch.get_num_threads()
    assert asked == [f"decoding linear 48x80, {rows} rows, {threads} threads" for rows in (1, 4, 8, 128)]
    assert frozen.first_onednn_rows() == 8  # where `--compile` hands a step back to the eager layers


@onednn
@pytest.mark.parametrize("trains", ["onednn", "mkl"])
def test_training_takes_the_kernel_chosen_for_its_weight(monkeypatch, trains):
    asked = chooser_says(monkeypatch, onednn_from_rows=1, trains_on=trains)
    calls = spied(monkeypatch)
    plain, layer = nn.Linear(64, 96), Linear(64, 96)
    layer.load_state_dict(plain.state_dict())
    x, grad = torch.randn(40, 64), torch.randn(40, 96)
    for module in (plain, layer):
        module(x).backward(grad)
    torch.testing.assert_close(layer.weight.grad, plain.weight.grad, rtol=1e-4, atol=1e-4)
    assert bool(calls) == (trains == "onednn")
    assert asked == [f"training linear 64x96, {torch.get_num_threads()} threads"]  # once, for all three products


@pytest.mark.parametrize("kernel", ["onednn", "mkl", "auto"])
def test_fast_paths_say_which_kernels_the_products_may_take(monkeypatch, kernel):
    if kernel == "auto":
        monkeypatch.delenv("MT_CPU_MATMUL", raising=False)
    else:
        force_cpu_matmul(monkeypatch, kernel)
    paths = fast_paths(for_inference(tiny_model(), "fp32")) + fast_paths(for_training(tiny_model()))
    note = {"onednn": "oneDNN (MT_CPU_MATMUL)", "mkl": "MKL (MT_CPU_MATMUL)",
            "auto": "the faster of MKL and oneDNN as measured" if onednn_available() else "MKL"}[kernel]
    assert f"linear: frozen, fp32 weights transposed; matmuls on {note}, a choice per weight and rows" in paths
    assert f"linear: fp32 matmuls on {note}, a choice per weight" in paths


@onednn
def test_a_frozen_layer_packs_its_weight_again_when_it_changes_and_copies_without_it(monkeypatch):
    """oneDNN multiplies by a copy of the weight packed at first use: a weight loaded afterwards is the one used,
    and a deep copy of the layer (whose packed copy has no storage to copy) computes what the layer computes."""
    force_cpu_matmul(monkeypatch, "onednn")
    plain = nn.Linear(512, 2048)
    frozen = mt.fast.frozen.FrozenLinear(plain)
    x = torch.randn(64, 512)
    with torch.no_grad():
        frozen(x)
        plain.weight.mul_(2.0)
        frozen.load_state_dict({"weight_t": plain.weight.t(), "bias": plain.bias})
        torch.testing.assert_close(frozen(x), plain(x), rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(copy.deepcopy(frozen)(x), plain(x), rtol=1e-5, atol=1e-4)


def test_a_layer_frozen_in_inference_mode_multiplies_through_onednn(monkeypatch):
    """A model frozen under torch.inference_mode (an ensemble's members, a server's warm-up) has weights that keep
    no version counter: oneDNN's packed copy is keyed without one."""
    force_cpu_matmul(monkeypatch, "onednn")
    plain = nn.Linear(64, 32)
    with torch.inference_mode():
        frozen = mt.fast.frozen.FrozenLinear(plain)
        x = torch.randn(8, 64)
        torch.testing.assert_close(frozen(x), plain(x), rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(frozen(x), plain(x), rtol=1e-5, atol=1e-5)
