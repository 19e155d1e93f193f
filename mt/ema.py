"""An exponential moving average of the weights (`train.ema`): a second copy of the model that follows the
trained one, w_avg ← d·w_avg + (1 − d)·w after every update, so it averages about the last 1/(1 − d) steps
(0.999: about 1,000). It smooths the noise of the last updates as checkpoint averaging does, but over every
step rather than a few snapshots (Polyak averaging; Marian's `--exponential-smoothing`, fairseq's `--ema-decay`).

Early on the decay is held below d, at (1 + step) / (10 + step), so the average does not drag the random
initial weights along for thousands of steps: a run validated at step 200 sees a model, not mostly noise.
The update is PyTorch's own EMA step (`torch.optim.swa_utils.get_ema_multi_avg_fn` is the same `_foreach_lerp_`),
without `AveragedModel`'s wrapper, so the averaged weights keep the model's parameter names in checkpoints.
"""

from __future__ import annotations

import copy

import torch


def decay_at(step: int, decay: float) -> float:
    """The decay applied after update `step` (1-based)."""
    return min(decay, (1 + step) / (10 + step))


class WeightAverage:
    """The averaged copy of `model` (on its device, in eval mode, no gradients), started from `start` (a state
    dict, e.g. a resumed run's averaged weights) or from the model's weights."""

    def __init__(self, model: torch.nn.Module, decay: float, start: dict | None = None):
        self.decay = decay
        self.model = copy.deepcopy(model).eval().requires_grad_(False)
        if start is not None:
            self.model.load_state_dict(start)
        self.params = list(self.model.parameters())

    @torch.no_grad()
    def update(self, model: torch.nn.Module, step: int) -> None:
        """Move the average towards `model`'s weights after update `step`."""
        torch._foreach_lerp_(self.params, list(model.parameters()), 1.0 - decay_at(step, self.decay))
