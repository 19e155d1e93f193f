"""Fast paths for inference, swapped into a trained model in place of its plain layers."""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

from mt.linear import Linear, linear, native_bf16, prefers_onednn

PRECISIONS = ("fp32", "bf16", "int8")


def for_inference(model: nn.Module, precision: str) -> nn.Module:
    """The model to decode with, its linear layers frozen for speed: fp32 (or bf16 under autocast) weights stored
    transposed (`FrozenLinear`), or int8 dynamically quantized.

    int8 quantizes every nn.Linear's weights but the output layer's once and each activation on the fly (CPU
    only): roughly twice the fp32 speed on CPUs with VNNI, at a small cost in BLEU (measure it with `mt evaluate`).
    Each activation's scale spans the whole batch, so an int8 translation may change slightly with the sentences
    batched beside it; fp32 translates a sentence the same alone or in any batch. The model is changed
    in place and can no longer be trained.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    if precision == "int8":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.ao.quantization announces its successor; it still works
            # The output projection is not quantized: it decides every token, and int8 there cost the most BLEU.
            # It runs in bf16 where the CPU multiplies bf16 in hardware, else in fp32.
            linears = {name for name, m in model.named_modules() if isinstance(m, nn.Linear) and name != "output"}
            for name in linears:  # the quantizer takes nn.Linear itself, not subclasses such as mt's Linear
                parent, _, child = name.rpartition(".")
                setattr(model.get_submodule(parent), child, plain_linear(model.get_submodule(name)))
            model = torch.ao.quantization.quantize_dynamic(model, linears, dtype=torch.qint8, inplace=True)
        if native_bf16():
            model.output = Bf16Linear(model.output)
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) in (nn.Linear, Linear):
                setattr(module, name, FrozenLinear(child))
    return model.eval()


def plain_linear(layer: nn.Linear) -> nn.Linear:
    """An nn.Linear holding `layer`'s parameters."""
    plain = nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None, device="meta")
    plain.weight, plain.bias = layer.weight, layer.bias
    return plain


class Bf16Linear(nn.Module):
    """nn.Linear for inference in bf16 (fp32 accumulation), returning fp32: the int8 model's output layer on CPUs
    that multiply bf16 in hardware, where it makes int8 beam search 5-12% faster (machine B) and its logits are
    good to about three significant digits."""

    def __init__(self, layer: nn.Linear):
        super().__init__()
        self.register_buffer("weight", layer.weight.detach().to(torch.bfloat16))
        self.register_buffer("bias", None if layer.bias is None else layer.bias.detach().to(torch.bfloat16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.to(torch.bfloat16), self.weight, self.bias).float()


class FrozenLinear(nn.Module):
    """nn.Linear for inference, its weight stored transposed and contiguous, (in_features, out_features).

    F.linear multiplies by the transpose of an (out, in) weight; on CPU, MKL runs the small matrices of
    step-by-step decoding faster against a weight already laid out as (in, out). Where oneDNN is the faster
    kernel (see mt/linear.py), fp32 goes through it instead, as fast with this layout.
    """

    def __init__(self, layer: nn.Linear):
        super().__init__()
        self.register_buffer("weight_t", layer.weight.detach().t().contiguous())
        self.register_buffer("bias", None if layer.bias is None else layer.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if prefers_onednn(x, self.weight_t):
            return linear(x, self.weight_t.t(), self.bias)
        flat = x.reshape(-1, x.size(-1))
        y = flat @ self.weight_t if self.bias is None else torch.addmm(self.bias, flat, self.weight_t)
        return y.view(*x.shape[:-1], y.size(-1))


def for_training(model: nn.Module) -> nn.Module:
    """The model to train, with the CPU training fast paths swapped in (see mt/fast.py's docstring)."""
    return model
