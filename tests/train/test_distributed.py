"""Training with several processes (torchrun, DDP over gloo on CPU) is the same training as one process with the same
effective batch: the ranks split each step's batches, normalise the loss per token of the whole step, and end with
identical weights; the data position is global, so a run resumes with another number of processes."""

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import yaml

from mt import checkpoint
from mt.config import Config, ModelConfig, to_dict
from mt.errors import MtError
from mt.train import distributed
from mt.train.loop import train
from mt.train.resume import resume_config

from ..conftest import prepare_corpus

ROOT = Path(__file__).resolve().parents[2]
needs_gloo = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="torch.distributed with the gloo backend is not available")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    return prepare_corpus(tmp_path_factory.mktemp("corpus"), n_valid=10)


def config(data: Path, **train_changes) -> Config:
    """A tiny model without dropout (each rank has its own dropout stream, so only dropout 0 can match one process),
    one thread (so that processes agree bit for bit) and fp32 (whose rounding is what the tolerances allow for)."""
    cfg = Config(data=str(data), model=ModelConfig(d_model=32, n_heads=4, n_enc_layers=1, n_dec_layers=1, d_ff=64,
                                                   dropout=0.0, max_len=32))
    train_cfg = cfg.train
    train_cfg.max_tokens, train_cfg.warmup, train_cfg.log_every, train_cfg.valid_bleu = 256, 10, 2, False
    train_cfg.threads, train_cfg.keep_checkpoints, train_cfg.precision = 1, 10, "fp32"
    train_cfg.device = "cpu"  # gloo between CPU processes, also on a machine with fewer GPUs than processes
    # Adam is blind to the scale of the gradient except through eps: with a large eps the update is about
    # lr × gradient, so a loss normalised wrongly (say, without the × world that undoes DDP's averaging) changes
    # the weights visibly. The large lr keeps those updates well above float noise.
    train_cfg.eps, train_cfg.lr = 1.0, 1.0
    for key, value in train_changes.items():
        setattr(train_cfg, key, value)
    return cfg


def test_rank_0_validates_on_the_cores_of_the_ranks_waiting_for_it(monkeypatch):
    # On CPU the node's other ranks idle at the barrier while rank 0 validates: it borrows their threads.
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setattr(distributed, "active", lambda: True)
    threads = torch.get_num_threads()
    with pytest.raises(RuntimeError, match="validation failed"):
        with distributed.cores_of_waiting_ranks(torch.device("cpu")):
            assert torch.get_num_threads() == 2 * threads
            raise RuntimeError("validation failed")
    assert torch.get_num_threads() == threads  # given back, even after an error
    with distributed.cores_of_waiting_ranks(torch.device("cuda", 0)):  # GPU ranks: the host's threads are not spare
        assert torch.get_num_threads() == threads


def test_more_processes_than_gpus_is_refused_with_the_fix(monkeypatch):
    # As `torchrun --nproc_per_node 2` on a one-GPU node makes its second process: CUDA alone says "invalid ordinal".
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(MtError, match=r"more processes on this node than it has GPUs \(1\): pass --nproc_per_node 1"):
        distributed.start(torch.device("cuda"))
    assert not dist.is_initialized()


@pytest.mark.parametrize("torch_option", ["forward_sync_buffers", "broadcast_buffers"])
def test_the_model_is_wrapped_without_syncing_buffers_in_any_torch(monkeypatch, torch_option):
    # torch 2.13 renamed broadcast_buffers to forward_sync_buffers; torch 2.11 (a GPU node's) rejected the new name.
    made = {}

    def ddp(module, device_ids=None, **options):
        made.update(options, device_ids=device_ids)
        return module

    ddp.__signature__ = inspect.Signature([inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                                           for name in ("module", "device_ids", torch_option)])
    monkeypatch.setattr(distributed, "DistributedDataParallel", ddp)
    monkeypatch.setattr(distributed, "active", lambda: True)
    distributed.wrap(torch.nn.Linear(2, 2), torch.device("cuda", 1))
    assert made == {torch_option: False, "device_ids": [1]}


# ---------------------------------------------------------------------------------------------- two processes

# Runs `mt.train.loop.train` as torchrun's worker, then saves the weights this rank ended with: the checkpoint only
# shows rank 0's. The recorded model is the one the training step was given (the DDP wrapper).
RUNNER = """
import os, sys, torch
import mt.train.loop
from mt.config import load_config

models = []
real_step = mt.train.loop.train_step

def recording_step(model, *args):
    models[:] = [model]
    return real_step(model, *args)

mt.train.loop.train_step = recording_step
mt.train.loop.train(load_config(sys.argv[2]), sys.argv[3])
torch.save(models[0].module.state_dict(), os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.pt"))
"""


def log_records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]


def assert_close_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name, tensor in a.items():
        torch.testing.assert_close(tensor, b[name], rtol=1e-5, atol=1e-6, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.numerics  # weights one process and two agree on within fp32 rounding
@needs_gloo
def test_two_processes_train_as_one_with_the_same_effective_batch(prepared, tmp_path):
    # One process, accumulate 4: 8 steps, a checkpoint at step 4.
    straight = tmp_path / "straight"
    train(config(prepared, accumulate=4, max_steps=8, valid_every=4), straight, progress=False)

    # Two processes, accumulate 2 each: the same 4 batches a step.
    run, ranks = tmp_path / "ddp", tmp_path / "ranks"
    ranks.mkdir()
    (tmp_path / "runner.py").write_text(RUNNER, encoding="utf-8")
    (tmp_path / "ddp.yaml").write_text(yaml.safe_dump(to_dict(config(prepared, accumulate=2, max_steps=4,
                                                                       valid_every=4))), encoding="utf-8")
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                             str(tmp_path / "runner.py"), str(ranks), str(tmp_path / "ddp.yaml"), str(run)],
                            capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert result.returncode == 0, result.stderr

    # The ranks end with identical weights, which are the ones rank 0 saved.
    rank0, rank1 = (torch.load(ranks / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    ddp_last = checkpoint.load(run / "last.pt")
    for name, tensor in rank0.items():
        assert torch.equal(tensor, rank1[name]) and torch.equal(tensor, ddp_last["model"][name]), name
    # ... and match one process's after the same steps; so does the logged loss per token.
    assert ddp_last["step"] == 4
    assert_close_weights(ddp_last["model"], checkpoint.load(straight / "checkpoint-4.pt")["model"])
    logged = {r["step"]: r["loss"] for r in log_records(run) if "loss" in r}
    expected = {r["step"]: r["loss"] for r in log_records(straight) if "loss" in r and r["step"] <= 4}
    assert logged == pytest.approx(expected, rel=1e-5)
    # Only rank 0 speaks and writes: one start line, one log line per interval.
    assert result.stderr.count("model: ") == 1 and "× 2 processes" in result.stderr
    assert [r["step"] for r in log_records(run)] == [2, 4, 4]  # two intervals, one validation

    # The data position is global: one process resumes the two processes' run and ends where `straight` did.
    train(resume_config(run, ["train.accumulate=4", "train.max_steps=8"]), run, resume=True, progress=False)
    assert_close_weights(checkpoint.load(run / "last.pt")["model"], checkpoint.load(straight / "last.pt")["model"])
    epochs = [r["epoch"] for r in log_records(straight)]
    assert epochs[-1] > epochs[0], "the 8 steps should cross an epoch boundary"



@needs_gloo
def test_an_ensemble_run_trains_each_member_in_the_one_process_group(prepared, tmp_path):
    (tmp_path / "members.yaml").write_text(yaml.safe_dump(to_dict(config(prepared, max_steps=4, valid_every=4,
                                                                          members=2))), encoding="utf-8")
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                             "-m", "mt", "train", str(tmp_path / "members.yaml"), "--out", str(tmp_path / "run"),
                             "--quiet"], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert result.returncode == 0, result.stderr
    for i, seed in ((1, 1), (2, 1001)):
        last = checkpoint.load(tmp_path / "run" / f"member-{i}" / "last.pt")
        assert last["step"] == 4 and last["train"]["world_size"] == 2 and last["config"]["train"]["seed"] == seed
