"""Many processes, one run: the process group that `torchrun` describes, and the few collectives training needs.

`torchrun --nproc_per_node N -m mt train ...` starts N copies of `mt train` with RANK, WORLD_SIZE and LOCAL_RANK in
their environment (and MASTER_ADDR/MASTER_PORT to meet at). `start` joins that group: NCCL between GPUs (this
process trains on cuda:LOCAL_RANK), gloo between CPU processes. Without those variables, or with a world of one,
nothing is started and every helper here is a no-op: a single process trains as it always did.

Two groups: the default one (NCCL on GPU) carries gradients and device tensors; a gloo group carries the small
host-side agreements (stop or go on, barriers), so agreeing on them never waits for the GPU's queue to drain.

How W processes train one model with DistributedDataParallel (mt/train/loop.py):
- Data: one optimizer step takes W × A consecutive batches of the epoch's batch list (A = train.accumulate), and
  rank r trains on the r-th, (r + W)-th, ... of them (`mt.data.batches.step_batches`). That is the step single-process
  training with accumulate W × A takes, and the data position (epoch, batch) stays one global number, the same on
  every rank: a run can resume with another number of processes (with another W × A its steps hold more or
  fewer batches from then on).
- Loss: every rank divides its summed loss by the target tokens of the whole step (all ranks' batches, counted
  from the lengths on disk, so no communication) and multiplies it by W, because DDP averages the ranks'
  gradients: the result is the per-token gradient of the whole step, as one process would compute it.
- Agreement: a step is skipped on every rank when any rank's loss or gradients are not finite; rank 0's time
  budget (`train.max_minutes`) and a SIGINT/SIGTERM on any rank stop every rank after the same step
  (`agree_max`); a cooldown by the clock follows the furthest rank's clock.
- Rank 0 alone validates, writes checkpoints, config.yaml and log.jsonl, and prints; the others wait at a barrier.
- Dropout: rank 0 draws from the single-process stream, rank r > 0 from one seeded with (seed, rank, step)
  (`rank_seed`), so a run with dropout is not bitwise equal to single-process training. Checkpoints hold rank 0's
  random state; on resume, the other ranks reseed from (seed, rank, step).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from mt.errors import MtError

_host_group = None  # gloo group for host-side agreements; None when not distributed
_owned = False  # whether `start` created the process group (and so `stop` destroys it)
_depth = 0  # `start`s not yet stopped: an ensemble run's members train inside the run's one group


def launched() -> bool:
    """Whether torchrun (or another launcher setting its variables) started this process as one of several."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def start(device: torch.device) -> torch.device:
    """Join the launcher's process group, if launched as one of several processes; returns the device this process
    trains on (cuda:LOCAL_RANK on GPUs). A group the caller has already started is used as it is, and so is the
    group of an enclosing `start` (each `start` is paired with a `stop`)."""
    global _host_group, _owned, _depth
    if not launched():
        return device
    if device.type == "cuda":
        local, visible = int(os.environ.get("LOCAL_RANK", "0")), torch.cuda.device_count()
        if local >= visible:  # else CUDA's own "invalid device ordinal", which names neither cause nor fix
            raise MtError(f"torchrun started more processes on this node than it has GPUs ({visible}): pass "
                          f"--nproc_per_node {visible}, or set train.device=cpu to train on CPU processes")
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    _depth += 1
    if _depth > 1:
        return device
    _owned = not dist.is_initialized()
    if _owned:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                device_id=device if device.type == "cuda" else None)
    _host_group = dist.group.WORLD if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
    return device


def stop() -> None:
    """The end of a `start`: the outermost one leaves the process group, if it created it."""
    global _host_group, _owned, _depth
    if _depth == 0:  # not started: a single process
        return
    _depth -= 1
    if _depth > 0:
        return
    if _owned:
        dist.destroy_process_group()
    _host_group, _owned = None, False


def active() -> bool:
    return _host_group is not None


def rank() -> int:
    return dist.get_rank() if active() else 0


def world_size() -> int:
    return dist.get_world_size() if active() else 1


def barrier() -> None:
    """Wait until every rank gets here, e.g. while rank 0 validates and saves (host-side: no GPU sync)."""
    if active():
        dist.barrier(group=_host_group)


@contextmanager
def cores_of_waiting_ranks(device: torch.device) -> Iterator[None]:
    """Rank 0 on CPU, while the other ranks of its node wait at a barrier (validation): use their cores too, that
    is its threads times LOCAL_WORLD_SIZE (2 single-thread processes on 2 cores: validation on 2 threads)."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if not active() or device.type != "cpu" or local < 2:
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(threads * local)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum `tensor` over all ranks, in place, and return it. A device tensor on GPU: no host sync by itself."""
    if active():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def agree_max(value: int) -> int:
    """The largest of every rank's `value` (host-side). With codes ordered by urgency, every rank acts on the
    most urgent request any of them made, at the same step."""
    if not active():
        return value
    flag = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=_host_group)
    return int(flag.item())


def wrap(model: torch.nn.Module, device: torch.device) -> DistributedDataParallel | None:
    """The model under DistributedDataParallel (it averages gradients over ranks in the backward pass), or None
    when not distributed. Its constructor broadcasts rank 0's weights, so every rank starts from the same ones."""
    if not active():
        return None
    # The only buffer (the sinusoid table) is a constant: broadcasting it before every forward would be waste.
    # torch 2.13 renamed the option (the old name is deprecated there); earlier releases know only the old one.
    known = inspect.signature(DistributedDataParallel).parameters
    name = "forward_sync_buffers" if "forward_sync_buffers" in known else "broadcast_buffers"
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                   **{name: False})


def sync_gradients(ddp: DistributedDataParallel | None, last: bool) -> AbstractContextManager:
    """Around one micro-batch's forward and backward: all-reduce its gradients only when it is the step's last
    (the earlier ones accumulate locally, and the last all-reduce carries their sum)."""
    if ddp is None or last:
        return nullcontext()
    return ddp.no_sync()


def rank_seed(seed: int, rank: int, step: int) -> int:
    """The dropout seed of rank > 0 from `step` on: well mixed, so no two (seed, rank, step) share a stream."""
    return int(np.random.SeedSequence([seed, rank, step]).generate_state(1)[0])
