"""Linear layers for decoding (fast paths of mt/fast/): `FrozenLinear`, an fp32 or bf16 weight stored transposed
(and packed for oneDNN where it takes the product), and int8, every linear layer dynamically quantized."""

from __future__ import annotations

import warnings

import torch
from torch import Tensor, nn

from mt.fast.choose import LOCK, Kept, choice, rows_class
from mt.fast.linear import decoding_kernel, decoding_on_cpu, onednn_mm, pack_for_onednn, relinked


def quantized(model: nn.Module) -> bool:
    """Whether the model has int8 layers (`quantize_int8`)."""
    return any(isinstance(m, torch.ao.nn.quantized.dynamic.Linear) for m in model.modules())


def quantize_int8(model: nn.Module, fast: bool = True) -> nn.Module:
    """The model with every linear layer dynamically quantized to int8, in place: as `Int8Linear`, or with `fast`
    False (MT_FAST=0) as PyTorch's own layer.

    Each output channel (a row of the weight) gets its own scale: the output layer's rows are the target pieces'
    embeddings, whose norms differ by piece, and one scale for all of them cost BLEU (docs/performance.md)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization announces its successor; it still works
        linears = {name for name, m in model.named_modules() if isinstance(m, nn.Linear)}
        for name in linears:  # the quantizer takes nn.Linear itself, not subclasses like mt.fast.linear's Linear
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, relinked(model.get_submodule(name), nn.Linear))
        per_channel = torch.ao.quantization.per_channel_dynamic_qconfig
        mapping = {nn.Linear: Int8Linear if fast else torch.ao.nn.quantized.dynamic.Linear}
        return torch.ao.quantization.quantize_dynamic(model, dict.fromkeys(linears, per_channel), mapping=mapping,
                                                      inplace=True)


class Int8Linear(torch.ao.nn.quantized.dynamic.Linear):
    """PyTorch's dynamically quantized linear layer, calling its kernel directly: the layer's own forward checks its
    dtype and version and copies the output on every call, a fixed cost that a lone sentence pays on every product
    (docs/performance.md).

    The weights are packed for PyTorch's default int8 kernel (fbgemm's); where oneDNN's (AMX on CPUs that have it)
    is measured the faster for a product's rows, the same int8 weights go through it, packed again once. Both
    quantize the input alike (7-bit, `reduce_range`) and add in integers, so their outputs agree to fp32 rounding.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._onednn = None  # the weights packed for oneDNN, once it takes a product
        self._kernels = Kept()  # (rows class, threads) → whether oneDNN takes the product

    def forward(self, x: Tensor) -> Tensor:
        packed = self._packed_params._packed_params
        rows = x.numel() // x.size(-1) if x.dim() else 1
        if not torch.compiler.is_compiling() and self.takes_onednn(rows):
            packed = self.onednn_packed()
        return torch.ops.quantized.linear_dynamic(x, packed, reduce_range=True)

    def takes_onednn(self, rows: int) -> bool:
        """Whether oneDNN's int8 kernel is this machine's faster for `rows` inputs, measured once for each power of
        two of rows and threads."""
        key = (rows_class(rows), torch.get_num_threads())
        known = self._kernels.get(key)
        if known is None:
            if "onednn" not in torch.backends.quantized.supported_engines:
                return self._kernels.keep(key, False)
            x = torch.randn(key[0], self.in_features, generator=torch.Generator().manual_seed(0))
            plain = self._packed_params._packed_params
            onednn = self.onednn_pack() if self._onednn is None else self._onednn  # kept only if chosen
            question = f"int8 linear {self.in_features}x{self.out_features}, {key[0]} rows, {key[1]} threads"
            kernel = choice(question, {
                "fbgemm": lambda: torch.ops.quantized.linear_dynamic(x, plain, reduce_range=True),
                "onednn": lambda: torch.ops.quantized.linear_dynamic(x, onednn, reduce_range=True)})
            known = self._kernels.keep(key, kernel == "onednn", question)
        return known

    def onednn_packed(self):
        """The layer's int8 weights and bias packed for oneDNN, at first use, kept."""
        if self._onednn is None:
            self._onednn = self.onednn_pack()
        return self._onednn

    def onednn_pack(self):
        with LOCK:  # the engine set, process-wide, decides whose layout linear_prepack packs for
            engine = torch.backends.quantized.engine
            try:
                torch.backends.quantized.engine = "onednn"
                return torch.ops.quantized.linear_prepack(*self._weight_bias())
            finally:
                torch.backends.quantized.engine = engine

    def set_weight_bias(self, weight: Tensor, bias: Tensor | None) -> None:
        super().set_weight_bias(weight, bias)
        self._onednn = None  # packed again from the new weights at next use

    def __getstate__(self) -> dict:
        """Copies and pickles leave the oneDNN packing and the choices out: made again at first use."""
        return {**self.__dict__, "_onednn": None, "_kernels": Kept()}


class FrozenLinear(nn.Module):
    """nn.Linear for inference, its weight stored transposed and contiguous, (in_features, out_features).

    F.linear multiplies by the transpose of an (out, in) weight; on CPU, MKL runs the small matrices of
    step-by-step decoding faster against a weight already laid out as (in, out). Where oneDNN is measured the
    faster kernel for a product's rows (`takes_onednn`), fp32 goes through it instead, against a copy of the weight
    packed once in oneDNN's own layout.

    `dtype` bf16 stores the weight in bf16 for `--precision bf16`: autocast would cast an fp32 weight at every call,
    most of a bf16 step's time on a CPU that multiplies bf16 in hardware (docs/performance.md).
    """

    def __init__(self, layer: nn.Linear, dtype: torch.dtype | None = None):
        super().__init__()
        weight = layer.weight.detach().to(dtype or layer.weight.dtype)
        self.register_buffer("weight_t", weight.t().contiguous())
        self.register_buffer("bias", None if layer.bias is None else layer.bias.detach().to(weight.dtype).clone())
        self._packed: tuple[tuple[int, int], Tensor] | None = None  # (weight_t's address and version, packed)
        self._kernels = Kept()  # (rows class, threads) → whether oneDNN takes the product

    def forward(self, x: Tensor) -> Tensor:
        weight_t = self.weight_t  # once: a buffer is looked up through nn.Module.__getattr__
        if x.dtype == weight_t.dtype:
            return self.product(x, weight_t)
        y = self.product(x.to(weight_t.dtype), weight_t)  # a bf16 layer: its input cast as autocast casts it
        return y if torch.is_autocast_enabled(x.device.type) else y.to(x.dtype)  # outside autocast, back

    def product(self, x: Tensor, weight_t: Tensor) -> Tensor:
        bias = self.bias
        flat = x.reshape(-1, x.size(-1))
        if decoding_on_cpu(x, weight_t) and self.takes_onednn(flat.size(0)):
            return onednn_mm(flat, self.packed(weight_t), bias).view(*x.shape[:-1], weight_t.size(1))
        y = flat @ weight_t if bias is None else torch.addmm(bias, flat, weight_t)
        return y.view(*x.shape[:-1], y.size(-1))

    def takes_onednn(self, rows: int) -> bool:
        """Whether oneDNN is this machine's faster kernel for `rows` inputs against this weight, measured once for
        each power of two of rows and threads (mt/fast/linear.py's `decoding_kernel`)."""
        key = (rows_class(rows), torch.get_num_threads())
        known = self._kernels.get(key)
        if known is None:
            weight_t = self.weight_t
            kernel, asked = decoding_kernel(weight_t, key[0], lambda: pack_for_onednn(weight_t.t()))
            known = self._kernels.keep(key, kernel == "onednn", *asked)
        return known

    def first_onednn_rows(self, most: int = 1024) -> int | None:
        """The fewest rows, a power of two up to `most`, that this layer multiplies through oneDNN; None if none."""
        rows = 1
        while rows <= most:
            if self.takes_onednn(rows):
                return rows
            rows *= 2
        return None

    def packed(self, weight_t: Tensor) -> Tensor:
        """The weight in oneDNN's layout, packed at first use and again if `weight_t` is replaced or written to."""
        key = (weight_t.data_ptr(), -1 if weight_t.is_inference() else weight_t._version)  # inference: none kept
        if self._packed is None or self._packed[0] != key:
            self._packed = (key, pack_for_onednn(weight_t.t()))
        return self._packed[1]

    def __getstate__(self) -> dict:
        """Copies and pickles leave the packed weight out (oneDNN's layout has no storage to copy): packed again."""
        return {**self.__dict__, "_packed": None}
