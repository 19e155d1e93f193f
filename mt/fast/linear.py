"""Linear layers on the fastest fp32 matrix-multiply kernel of this CPU (a fast path of mt/fast/).

PyTorch runs fp32 `F.linear` on CPU through MKL, and MKL keeps to its AVX2 code on processors that are not
Intel's; oneDNN, also inside PyTorch, uses AVX-512 wherever the CPU has it, and its AVX2 code multiplies the
model's decoding matrices faster than MKL's too (docs/performance.md). Decoding multiplies by weights packed once
in oneDNN's layout (`pack_for_onednn`) on x86 CPUs that are not Intel's and have AVX2 or AVX-512, except for a lone
row or a small weight's few rows (`onednn_pays`): oneDNN's fixed cost per call outweighs its faster kernel there,
and MKL takes them, as it takes a large down-projection's hundred rows and more with AVX2. `Linear` is an `nn.Linear`
(same parameters, same checkpoints) whose fp32 CPU matmuls, forward and backward, go through oneDNN where decoding's
do and the CPU has AVX-512; with AVX2 alone MKL trains faster (`onednn_trains`). The choices are facts of the
machine, not timings, so every process on it computes the same numbers (resuming a run continues it bitwise).
Everything else (GPU, bf16 autocast, other dtypes, `torch.compile`, Intel CPUs, where MKL has its AVX-512 code) is
`F.linear`.

`MT_CPU_MATMUL=mkl` or `=onednn` overrides the rule (benchmarks use it to compare the two side by side).
"""

from __future__ import annotations

import functools
import os

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mt.device import cpu_vendor

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


@functools.cache
def use_onednn() -> bool:
    """Whether fp32 CPU matmuls go through oneDNN in this process: MT_CPU_MATMUL, else the machine's rule."""
    choice = os.environ.get("MT_CPU_MATMUL", "auto")
    if choice not in CHOICES:
        raise ValueError(f"MT_CPU_MATMUL must be one of {', '.join(CHOICES)}, not {choice!r}")
    if not onednn_available():
        return False
    if choice != "auto":
        return choice == "onednn"
    return cpu_vendor() not in ("GenuineIntel", "") and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


@functools.cache
def onednn_trains() -> bool:
    """Whether training's fp32 CPU matmuls (forward and both gradients) go through oneDNN: MT_CPU_MATMUL, else where
    decoding's do and the CPU has AVX-512; with AVX2 alone MKL multiplies a batch's thousands of rows faster."""
    if os.environ.get("MT_CPU_MATMUL", "auto") != "auto":
        return use_onednn()
    return use_onednn() and torch.backends.cpu.get_cpu_capability() == "AVX512"


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


def plain_cpu_fp32(x: Tensor, weight: Tensor) -> bool:
    """fp32 on CPU, outside autocast and torch.compile: where mt's own CPU kernels apply."""
    return (x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32
            and not torch.is_autocast_enabled("cpu") and not torch.compiler.is_compiling())


# The smallest product, in rows and in multiply-adds (rows x in x out), for which oneDNN against a packed weight beats
# MKL in decoding, by the CPU's vector width: and four times the multiply-adds for a weight small enough to stay in a
# core's L2 cache (256 KiB), which MKL multiplies at full speed (docs/performance.md).
ONEDNN_MIN_PRODUCT = {"AVX512": (2, 1_000_000), "AVX2": (2, 1_000_000)}
L2_RESIDENT = 65_536  # fp32 weights of at most this many elements


def min_macs(rule: tuple[int, int], weight_size: int) -> int:
    return rule[1] * 4 if weight_size <= L2_RESIDENT else rule[1]


# From this many rows, MKL multiplies by a narrowing weight (in >= 2 x out: a feed-forward layer's down-projection)
# of at least NARROWING_MIN_SIZE elements faster than oneDNN against its packed copy, by the CPU's vector width; not
# measured with AVX-512, where oneDNN keeps them. A smaller one (512 -> 256) decoded faster in oneDNN
# (docs/performance.md).
MKL_NARROWING_FROM_ROWS = {"AVX2": 128}
NARROWING_MIN_SIZE = 1024 * 256


def onednn_pays(rows: int, weight_t: Tensor) -> bool:
    """Whether oneDNN is the faster kernel for `rows` inputs against `weight_t`, (in, out) as `FrozenLinear` holds it:
    not for the few rows of a decoding step, where its fixed cost per call outweighs the work, nor, with AVX2, for
    a large narrowing weight's many rows."""
    capability = torch.backends.cpu.get_cpu_capability()
    rule = ONEDNN_MIN_PRODUCT.get(capability, (0, 0))
    narrowing_from = MKL_NARROWING_FROM_ROWS.get(capability)
    if (narrowing_from is not None and rows >= narrowing_from and weight_t.size(0) >= 2 * weight_t.size(1)
            and weight_t.numel() >= NARROWING_MIN_SIZE):
        return False
    return rows >= rule[0] and rows * weight_t.numel() >= min_macs(rule, weight_t.numel())


def onednn_min_rows(weight_size: int) -> int | None:
    """The fewest rows for which fp32 CPU decoding multiplies through oneDNN against a weight of `weight_size`
    elements (`onednn_pays`); None where it never does (another kernel chosen, or no rule for this CPU)."""
    rule = ONEDNN_MIN_PRODUCT.get(torch.backends.cpu.get_cpu_capability())
    if rule is None or not use_onednn():
        return None
    return max(rule[0], -(-min_macs(rule, weight_size) // weight_size))


def prefers_onednn(x: Tensor, weight: Tensor) -> bool:
    """fp32 on CPU, outside autocast and torch.compile, where oneDNN is decoding's faster kernel."""
    return plain_cpu_fp32(x, weight) and use_onednn()


def trains_on_onednn(x: Tensor, weight: Tensor) -> bool:
    """fp32 on CPU, outside autocast and torch.compile, where oneDNN is training's faster kernel."""
    return plain_cpu_fp32(x, weight) and onednn_trains()


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
