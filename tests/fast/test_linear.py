import copy
import functools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mt.bench
import mt.fast.frozen
import mt.fast.linear
import mt.fast.paths
from mt.data.tokenizer import BOS
from mt.decode.search import beam_search
from mt.fast.linear import (
    Linear,
    OneDnnLinear,
    onednn_available,
    onednn_min_rows,
    onednn_mm,
    onednn_pays,
    onednn_trains,
    use_onednn,
)
from mt.fast.paths import for_inference, for_training

from ..conftest import tiny_model

pytestmark = pytest.mark.numerics

onednn = pytest.mark.skipif(not onednn_available(), reason="this PyTorch build has no oneDNN linear")


def force_cpu_matmul(monkeypatch, choice: str) -> None:
    """Every fp32 CPU matmul of mt's fast linears through `choice` ("onednn" or "mkl", as MT_CPU_MATMUL says) for
    this test, whatever this machine's rule picks."""
    if choice == "onednn" and not onednn_available():
        pytest.skip("this PyTorch build has no oneDNN linear")
    monkeypatch.setenv("MT_CPU_MATMUL", choice)
    fresh_kernel_rules(monkeypatch)
    assert mt.fast.linear.use_onednn() == mt.fast.linear.onednn_trains() == (choice == "onednn")


def fresh_kernel_rules(monkeypatch) -> None:
    """The kernel rules decided afresh for this test (caches of their own), wherever they are read: by the layers,
    and by fast_paths and `mt bench`, which report what the layers chose."""
    own, trains = functools.cache(use_onednn.__wrapped__), functools.cache(onednn_trains.__wrapped__)
    for module in (mt.fast.linear, mt.fast.paths, mt.bench):
        monkeypatch.setattr(module, "use_onednn", own)
        monkeypatch.setattr(module, "onednn_trains", trains)


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
    use_onednn.cache_clear()
    try:
        with pytest.raises(ValueError, match="MT_CPU_MATMUL must be one of auto, mkl, onednn"):
            use_onednn()
    finally:
        use_onednn.cache_clear()


@onednn
@pytest.mark.parametrize("capability", ["AVX2", "AVX512"])
def test_decoding_takes_mkl_for_a_few_rows_and_onednn_for_many(monkeypatch, capability):
    """oneDNN's fixed cost per call outweighs its faster kernel on a lone sentence's step, and on a weight small
    enough for MKL to multiply from the L2 cache: those products go to MKL, a batch's to oneDNN, and both compute
    the layer. With AVX2, MKL also takes a large down-projection's products from 128 rows (a beam 4 batch of 32)."""
    force_cpu_matmul(monkeypatch, "onednn")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    calls = []
    monkeypatch.setattr(mt.fast.frozen, "onednn_mm", lambda *args: calls.append(args) or onednn_mm(*args))
    for (n_in, n_out), rows, kernel in (((512, 2048), 1, "mkl"), ((512, 2048), 2, "onednn"),
                                        ((512, 2048), 64, "onednn"), ((256, 256), 16, "mkl"),
                                        ((256, 256), 64, "onednn"), ((2048, 512), 127, "onednn"),
                                        ((2048, 512), 128, "mkl" if capability == "AVX2" else "onednn"),
                                        ((512, 2048), 256, "onednn"), ((512, 256), 256, "onednn")):
        plain = nn.Linear(n_in, n_out)
        frozen = mt.fast.frozen.FrozenLinear(plain)
        x = torch.randn(rows, 1, n_in)
        calls.clear()
        with torch.no_grad():
            torch.testing.assert_close(frozen(x), plain(x), rtol=1e-5, atol=1e-4)
        assert ("onednn" if calls else "mkl") == kernel, (n_in, n_out, rows)


@onednn
@pytest.mark.parametrize("capability, trains", [("AVX2", False), ("AVX512", True)])
def test_an_amd_cpu_decodes_through_onednn_and_trains_through_it_with_avx512_only(monkeypatch, capability, trains):
    """A batch's decoding products go to oneDNN on both; training's to oneDNN with AVX-512 and to MKL with AVX2
    alone, where MKL trained faster. `mt bench` says which, and the layer computes nn.Linear either way."""
    monkeypatch.delenv("MT_CPU_MATMUL", raising=False)
    monkeypatch.setattr(mt.fast.linear, "cpu_vendor", lambda: "AuthenticAMD")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    fresh_kernel_rules(monkeypatch)
    calls = []
    for module in (mt.fast.linear, mt.fast.frozen):
        monkeypatch.setattr(module, "onednn_mm", lambda *args: calls.append(args) or onednn_mm(*args))
    plain, layer = nn.Linear(512, 2048), Linear(512, 2048)
    layer.load_state_dict(plain.state_dict())
    x, grad = torch.randn(64, 512), torch.randn(64, 2048)
    for module in (plain, layer):
        module(x).backward(grad)
    torch.testing.assert_close(layer.weight.grad, plain.weight.grad, rtol=1e-4, atol=1e-4)
    assert bool(calls) == trains
    calls.clear()
    with torch.no_grad():
        torch.testing.assert_close(mt.fast.frozen.FrozenLinear(plain)(x), plain(x), rtol=1e-5, atol=1e-4)
    assert calls
    assert mt.bench.cpu_matmul() == ("onednn" if trains else "onednn decoding, mkl training")


@onednn
@pytest.mark.parametrize("kernel", ["onednn", "mkl"])
def test_bench_says_whether_decoding_multiplies_by_packed_weights(monkeypatch, kernel):
    force_cpu_matmul(monkeypatch, kernel)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    paths = mt.fast.paths.fast_paths(for_inference(tiny_model(), "fp32"))
    assert ("linear: frozen, weights transposed, packed for oneDNN" in paths) == (kernel == "onednn")
    assert ("linear: large down-projections through MKL from 128 rows" in paths) == (kernel == "onednn")
    assert any(path.startswith("linear: frozen, weights transposed") for path in paths)


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


@onednn
@pytest.mark.parametrize("capability", ["AVX2", "AVX512"])
def test_the_compiled_step_stops_at_the_rows_where_a_layer_takes_onednn(monkeypatch, capability):
    """`onednn_min_rows`, where `--compile` hands a step back to the eager layers, is the first row count at which
    the layer's product goes to oneDNN; with MKL chosen, there is none."""
    force_cpu_matmul(monkeypatch, "onednn")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    for shape in ((128, 512), (256, 1024), (512, 2048)):
        weight = torch.empty(shape)
        rows = onednn_min_rows(weight.numel())
        assert onednn_pays(rows, weight) and not onednn_pays(rows - 1, weight), (shape, rows)
    force_cpu_matmul(monkeypatch, "mkl")
    assert onednn_min_rows(512 * 2048) is None
