import pytest
import torch
import torch.nn.functional as F

import mt.linear
from mt.fast import for_inference
from mt.linear import OneDnnLinear, use_onednn
from mt.search import beam_search
from mt.tokenizer import BOS

from .conftest import tiny_model

onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available()
                            or not hasattr(torch.ops.mkldnn, "_linear_pointwise"),
                            reason="this PyTorch build has no oneDNN linear")


@onednn
@pytest.mark.parametrize("bias", [True, False])
def test_onednn_linear_computes_what_f_linear_computes_forward_and_backward(bias):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 9, 48, generator=g).requires_grad_()
    w = torch.randn(80, 48, generator=g).requires_grad_()
    b = torch.randn(80, generator=g).requires_grad_() if bias else None
    grad = torch.randn(3, 9, 80, generator=g)

    def grads(fn):
        for p in (x, w, b):
            if p is not None:
                p.grad = None
        out = fn(x, w, b)
        out.backward(grad)
        return [out] + [p.grad for p in (x, w, b) if p is not None]

    for ours, theirs in zip(grads(OneDnnLinear.apply), grads(F.linear), strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-4)


@onednn
def test_the_model_learns_and_translates_the_same_on_either_cpu_kernel(monkeypatch):
    src = torch.randint(4, 40, (3, 7), generator=torch.Generator().manual_seed(1))
    tgt = torch.randint(4, 40, (3, 6), generator=torch.Generator().manual_seed(2))
    tgt[:, 0] = BOS
    results = []
    for kernel in (True, False):
        monkeypatch.setattr(mt.linear, "use_onednn", lambda kernel=kernel: kernel)
        model = tiny_model()
        loss = F.cross_entropy(model(src, tgt).flatten(0, 1), tgt.roll(-1, 1).flatten())
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters()]
        hyps = beam_search(for_inference(model, "fp32"), src, beam=3)
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
