"""The decoding step compiled by torch.compile, for the few rows where it pays (`--compile`; a fast path of
mt/fast/). It traces the plain model's own step, so it computes whatever that step computes."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from mt.fast.frozen import FrozenLinear, quantized
from mt.model.transformer import Transformer


def compile_decoding(model: nn.Module) -> nn.Module:
    """The model with each Transformer's decoding step (`step_layers`: the decoder layers, not the output layer)
    compiled by torch.compile, in place, for the few rows where it pays. A step runs dozens of small ops whose
    fixed costs outweigh their work on a few rows, and compiled they are fused: a lone sentence, a small beam. On
    CPU the compiled step multiplies through PyTorch's own kernel, so from the rows where eager decoding takes
    oneDNN's faster one for the layers' largest weight (`first_onednn_rows`) the step stays eager
    (`FewRowsCompiled`), and the output layer, the largest product, always does (docs/performance.md). The first
    steps of each new kind of shape compile (`mt.decode.translate.compiled` runs them at load). An int8 model stays
    eager: PyTorch's quantized layers break the compiled graph at each one, and compiled its step ran slower."""
    if quantized(model):
        return model
    options = cpu_options()
    on_cpu = all(t.device.type == "cpu" for t in [*model.parameters(), *model.buffers()])
    for module in model.modules():
        if isinstance(module, Transformer):
            largest = max((m for m in module.decoder.modules() if isinstance(m, FrozenLinear)),
                          key=lambda m: m.weight_t.numel(), default=None)
            rows = largest.first_onednn_rows() if on_cpu and largest is not None else None
            step = torch.compile(module.step_layers, dynamic=True, fullgraph=True, options=options)
            module.step_layers = FewRowsCompiled(module.step_layers, step, rows)
    return model


def cpu_options() -> dict[str, int]:
    """torch.compile's options for code it writes for the CPU (decoding, and training with train.compile)."""
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    # Inductor picks its CPU vector width by ATEN_CPU_CAPABILITY but caches the code it writes without it: code
    # written under another setting then runs at the wrong width, out of bounds. Named, the width keys the cache.
    return {"cpp.simdlen": pick_vec_isa().bit_width()}


class FewRowsCompiled:
    """A decoding step (`Transformer.step_layers`) compiled for fewer than `rows` rows (any number, when None) and
    eager for more."""

    def __init__(self, eager: Callable[..., Tensor], compiled: Callable[..., Tensor], rows: int | None):
        self.eager, self.compiled, self.rows = eager, compiled, rows

    def __call__(self, x: Tensor, *rest) -> Tensor:
        if self.rows is None or x.size(0) < self.rows:
            return self.compiled(x, *rest)
        return self.eager(x, *rest)
