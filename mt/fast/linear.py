"""Linear layers on the faster fp32 matrix-multiply kernel of this machine (a fast path of mt/fast/).

PyTorch multiplies fp32 on CPU through MKL; oneDNN, also inside PyTorch, has kernels of its own. Which is the faster
depends on the CPU (MKL keeps to its AVX2 code on processors that are not Intel's, where oneDNN uses AVX-512), the
libraries, the shape and the threads, so mt does not guess: each product is timed both ways at its first use for
its kind of shape (mt/fast/choose.py) and the faster kept, for good, on this machine. Decoding multiplies by weights
packed once in oneDNN's layout (`pack_for_onednn`) where oneDNN is the faster (`decoding_kernel`, for
`FrozenLinear` in mt/fast/frozen.py); `Linear`, an `nn.Linear` (same parameters, same checkpoints), takes all three
products of training (forward and both gradients) in oneDNN where that is the faster for its weight
(`training_kernel`). bf16 decoding products (`--precision bf16`) are timed the same way where the CPU multiplies
bf16 in hardware. Everything else (GPU, other dtypes, `torch.compile`) is `F.linear`.

`MT_CPU_MATMUL=mkl` or `=onednn` puts every product on one kernel (benchmarks compare the two side by side).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mt.device import native_bf16
from mt.fast.choose import Kept, choice

CHOICES = ("auto", "mkl", "onednn")


def onednn_mm(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x (N, in) @ weight (out, in)^T + bias through oneDNN; strided (transposed) operands need no copy."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


# The rows oneDNN lays a packed weight out for: any other count multiplies by it as fast (docs/performance.md).
PACKED_FOR_ROWS = 256


def pack_for_onednn(weight: Tensor) -> Tensor:
    """weight (out, in) reordered once into oneDNN's own layout: given a plain weight, oneDNN reorders it at every
    call, which is most of its cost for decoding's products of a few dozen rows."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), PACKED_FOR_ROWS)


def onednn_available() -> bool:
    """Whether this PyTorch build has the oneDNN linear kernel."""
    return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


def forced() -> str | None:
    """The kernel MT_CPU_MATMUL puts every product on ("mkl" or "onednn"), or None (auto: measured)."""
    value = os.environ.get("MT_CPU_MATMUL", "auto")
    if value not in CHOICES:
        raise ValueError(f"MT_CPU_MATMUL must be one of {', '.join(CHOICES)}, not {value!r}")
    if value == "onednn" and not onednn_available():
        return "mkl"
    return None if value == "auto" else value


def kernel_note() -> str:
    """Which kernels the products may take here, for `fast_paths`."""
    kernel = forced()
    if kernel is not None:
        return f"{'oneDNN' if kernel == 'onednn' else 'MKL'} (MT_CPU_MATMUL)"
    return "the faster of MKL and oneDNN as measured" if onednn_available() else "MKL"


def decoding_kernel(weight_t: Tensor, rows: int, packed: Callable[[], Tensor]) -> tuple[str, list[str]]:
    """"mkl" or "onednn", the faster on this machine for `rows` inputs against weight_t, (in, out) as `FrozenLinear`
    holds it, in fp32 or bf16, oneDNN multiplying by its packed copy (`packed()`); and the questions asked of
    mt/fast/choose.py. ("mkl" is PyTorch's own product, which in bf16 is oneDNN's unpacked.)"""
    kernel = forced()
    bf16 = weight_t.dtype == torch.bfloat16
    if kernel is not None or not onednn_available() or (bf16 and not native_bf16()):
        return kernel or "mkl", []
    n_in, out = weight_t.shape
    x = torch.randn(rows, n_in, generator=torch.Generator().manual_seed(0)).to(weight_t.dtype)
    bias, weight = torch.zeros(out, dtype=weight_t.dtype), packed()
    question = f"decoding linear {'bf16 ' if bf16 else ''}{n_in}x{out}, {rows} rows, {torch.get_num_threads()} threads"
    return choice(question, {"mkl": lambda: torch.addmm(bias, x, weight_t),
                             "onednn": lambda: onednn_mm(x, weight, bias)}), [question]


TRAINING_ROWS = 512  # a batch's products are timed at this many rows: a few milliseconds, the speed of thousands
_training = Kept()  # (weight shape, threads, forced) → whether oneDNN trains it, as `training_kernel` chose


def training_kernel(weight: Tensor) -> tuple[str, list[str]]:
    """"mkl" or "onednn", the faster on this machine for training's three products with `weight` (out, in): the
    forward, the input's gradient and the weight's; and the questions asked of mt/fast/choose.py."""
    kernel = forced()
    if kernel is not None or not onednn_available():
        return kernel or "mkl", []
    out, n_in = weight.shape
    generator = torch.Generator().manual_seed(0)
    w, x, g = (weight.detach(), torch.randn(TRAINING_ROWS, n_in, generator=generator),
               torch.randn(TRAINING_ROWS, out, generator=generator))

    def mkl():
        return F.linear(x, w), g @ w, g.t() @ x

    def onednn():
        return onednn_mm(x, w), onednn_mm(g, w.t()), onednn_weight_grad(g, x)

    question = f"training linear {n_in}x{out}, {torch.get_num_threads()} threads"
    with torch.no_grad():
        return choice(question, {"mkl": mkl, "onednn": onednn}), [question]


class OneDnnLinear(torch.autograd.Function):
    """y = x W^T + b with all three matmuls (forward, input and weight gradients) in oneDNN."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        flat = x.reshape(-1, x.size(-1))
        ctx.save_for_backward(flat, weight)
        ctx.x_shape, ctx.has_bias = x.shape, bias is not None
        return onednn_mm(flat, weight, bias).view(*x.shape[:-1], weight.size(0))

    @staticmethod
    def backward(ctx, grad: Tensor):
        flat, weight = ctx.saved_tensors
        g = grad.reshape(-1, grad.size(-1))
        grad_x = onednn_mm(g, weight.t()).view(ctx.x_shape) if ctx.needs_input_grad[0] else None
        grad_w = onednn_weight_grad(g, flat) if ctx.needs_input_grad[1] else None
        grad_b = g.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_x, grad_w, grad_b


def onednn_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """x (..., in) @ weight^T + bias through oneDNN, without autograd: for decoding, where nothing needs a gradient."""
    return onednn_mm(x.reshape(-1, x.size(-1)), weight, bias).view(*x.shape[:-1], weight.size(0))


def onednn_weight_grad(g: Tensor, x: Tensor) -> Tensor:
    """g^T x, (out, in), for g (N, out) and x (N, in). oneDNN copies an input given transposed, not a weight, so
    the smaller of the two goes in as the input: for the output layer, x rather than the tokens × vocabulary
    gradient."""
    if x.size(1) <= g.size(1):
        return onednn_mm(x.t(), g.t()).t()
    return onednn_mm(g.t(), x.t())


def decoding_on_cpu(x: Tensor, weight: Tensor) -> bool:
    """A decoding product mt's CPU kernels take: fp32 outside autocast, or bf16 (which autocast leaves as it is),
    outside torch.compile."""
    if x.device.type != "cpu" or x.dtype != weight.dtype or torch.compiler.is_compiling():
        return False
    return x.dtype == torch.bfloat16 or (x.dtype == torch.float32 and not torch.is_autocast_enabled("cpu"))


def plain_cpu_fp32(x: Tensor, weight: Tensor) -> bool:
    """fp32 on CPU, outside autocast and torch.compile: where mt's own CPU kernels apply."""
    return (x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32
            and not torch.is_autocast_enabled("cpu") and not torch.compiler.is_compiling())


def trains_on_onednn(x: Tensor, weight: Tensor) -> bool:
    """fp32 on CPU, outside autocast and torch.compile, where oneDNN is training's faster kernel for `weight`."""
    if not plain_cpu_fp32(x, weight):
        return False
    key = (tuple(weight.shape), torch.get_num_threads(), forced())
    onednn = _training.get(key)
    if onednn is None:
        kernel, asked = training_kernel(weight)
        onednn = _training.keep(key, kernel == "onednn", *asked)
    return onednn


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """F.linear, through oneDNN for fp32 on CPU where that trains faster (see the module docstring)."""
    if trains_on_onednn(x, weight):
        if not torch.is_grad_enabled():  # decoding: the same kernel without autograd.Function's cost per call
            return onednn_linear(x, weight, bias)
        return OneDnnLinear.apply(x, weight, bias)
    return F.linear(x, weight, bias)


def linear_grads(g: Tensor, x: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
    """The gradients of `linear(x, weight)` for the output gradient g (N, out), x (N, in): g W and g^T x."""
    if trains_on_onednn(x, weight):
        return onednn_mm(g, weight.t()), onednn_weight_grad(g, x)
    return g @ weight, g.t() @ x


class Linear(nn.Linear):
    """nn.Linear on `linear`: the same parameters and state dict, the faster CPU kernel."""

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)


def relinked(layer: nn.Linear, cls: type[nn.Linear]) -> nn.Linear:
    """A `cls` (nn.Linear or a subclass) holding `layer`'s own parameters, not copies."""
    new = cls(layer.in_features, layer.out_features, bias=layer.bias is not None, device="meta")
    new.weight, new.bias = layer.weight, layer.bias
    return new.train(layer.training)
