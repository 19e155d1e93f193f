"""Shared fixtures: tiny models and the real Multi30k mirror (tests that need it skip where it is absent)."""

import functools
import math
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import typer.testing

if os.environ.get("PYTEST_XDIST_WORKER"):  # make test runs a worker per core: one thread each, not one per core each
    torch.set_num_threads(1)
    # and so do the commands the tests start: two threads on a core the other worker keeps busy wait on each other
    # at every parallel region, ten times slower
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")  # torch.compile's pool of a process per core, alike
# mt's cache of kernel choices and its C library, for the tests alone: choices timed while the tests load every core
# are not the user's to keep
os.environ.setdefault("MT_CACHE", str(Path(tempfile.gettempdir()) / "mt-tests-cache"))
# torch.compile's cache, one for both passes of make test as a user's serves runs under either ATEN_CPU_CAPABILITY
# (the vector width keys the decoding step's kernels: mt/fast/compiled.py): its probes of the CPU's instruction sets,
# a compiler run each, are made once, not once a pass
os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(tempfile.gettempdir()) / "mt-tests-inductor")

import mt.fast.choose
import mt.fast.native_step
from mt.config import ModelConfig
from mt.model.transformer import Transformer


def timed_once(candidates: dict[str, Callable[[], object]]) -> dict[str, float]:
    """The suite's timing of a choice's candidates (mt/fast/choose.py): each called once to warm up, then the
    fastest of three calls (the other worker's load only adds time), not five slices in turn, timed again while the
    cores are busy. The suite asks some 1,000 questions: timed as a user's process times them, they cost a tenth of
    its time on a slow CPU. It needs a choice, not the best one: no test's verdict hangs on which."""
    times = {}
    for name, call in candidates.items():
        call()
        times[name] = math.inf
        for _ in range(3):
            start = time.perf_counter()
            call()
            times[name] = min(times[name], time.perf_counter() - start)
            if times[name] > 5e-3:  # a long call's noise is a small part of it: timed once
                break
    return times


TIMED = mt.fast.choose.measured  # the real timing, for the tests of it (tests/fast/test_choose.py)
mt.fast.choose.measured = timed_once
mt.fast.choose.SLICE_S /= 10  # and those time in slices a tenth of a user's
# and the crossovers of the C code are sought over the rows the tests decode, not a user's batches: the ladders' upper
# rungs, each a product of hundreds of rows, cost seconds a model on a slow CPU
mt.fast.native_step.STEP_ROWS = tuple(n for n in mt.fast.native_step.STEP_ROWS if n <= 64)
mt.fast.native_step.ENCODE_POSITIONS = tuple(n for n in mt.fast.native_step.ENCODE_POSITIONS if n <= 256)

# CliRunner builds the Typer app's command line at every invoke (90 ms on a 2 GHz core), as a process of `mt` does
# once: the suite's 500 invokes share one
typer.testing._get_command = functools.cache(typer.testing._get_command)

MIRROR = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture
def mirror() -> Path:
    if not (MIRROR / "multi30k" / "train.de.gz").is_file():
        pytest.skip(f"Multi30k mirror not found at {MIRROR}")
    return MIRROR


def tiny_model(seed: int = 0, vocab: int = 40, norm: str = "post", **changes) -> Transformer:
    torch.manual_seed(seed)
    settings = dict(d_model=32, n_heads=4, n_enc_layers=2, n_dec_layers=2, d_ff=64, dropout=0.0, max_len=64,
                    src_vocab_size=vocab, tgt_vocab_size=vocab, norm=norm)
    cfg = ModelConfig(**(settings | changes))
    return Transformer(cfg).eval()


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory):
    from mt.data.tokenizer import Tokenizer, train_sentencepiece

    words = "the a cat dog sat ran on under mat tree red blue big small runs jumps".split()
    rng = __import__("random").Random(0)
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(2, 9))) for _ in range(500)]
    path = train_sentencepiece(lines, tmp_path_factory.mktemp("spm") / "spm", vocab_size=60)
    return Tokenizer.load(path)


@pytest.fixture
def loaded(tokenizer):
    """A tiny untrained model with a real tokenizer, as `mt.checkpoint.load_model` would return it."""
    from mt.config import Config
    from mt.decode.load import Loaded

    model = tiny_model(vocab=tokenizer.vocab_size)
    return Loaded(model, Config(model=model.cfg), tokenizer, tokenizer, {})


LEXICON = dict(zip("der die das hund katze baum rot blau sitzt läuft unter auf groß klein".split(),
                   "the the the dog cat tree red blue sits runs under on big small".split(), strict=True))


def write_corpus(root: Path, lexicon: dict[str, str] = LEXICON, seed: int = 0, n_train: int = 400,
                 n_valid: int = 20) -> Path:
    """train.de/.en and valid.de/.en: random word strings and their word-for-word 'translation'."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("valid", n_valid)):
        pairs = [[rng.choice(list(lexicon)) for _ in range(rng.randint(2, 8))] for _ in range(n)]
        (root / f"{split}.de").write_text("".join(" ".join(p) + "\n" for p in pairs), encoding="utf-8")
        (root / f"{split}.en").write_text("".join(" ".join(lexicon[w] for w in p) + "\n" for p in pairs),
                                          encoding="utf-8")
    return root


def prepare_corpus(root: Path, **sizes) -> Path:
    """A small synthetic de→en corpus written by `write_corpus` and prepared by the real `prepare`."""
    from mt.data.prepare import prepare

    write_corpus(root, **sizes)
    prepare(root / "data", "de", "en", train=str(root / "train"), valid=str(root / "valid"), vocab_size=40,
            progress=False)
    return root / "data"


def train_tiny(root: Path, steps: int, joint: bool = True, **model_changes) -> Path:
    """A tiny de→en model trained (one thread, dropout 0) on the synthetic corpus until it ends every output
    on its valid set, greedy and beam 4, as the comparisons with other engines need: its best.pt. The corpus is in
    root/corpus.

    Training goes on in rounds of `steps` steps until that holds (see `train_until`)."""
    from mt.config import Config
    from mt.data.prepare import prepare

    corpus = write_corpus(root / "corpus")
    prepare(root / "data", "de", "en", train=str(corpus / "train"), valid=str(corpus / "valid"), vocab_size=40,
            joint=joint, progress=False)
    cfg = Config(data=str(root / "data"), model=ModelConfig(d_model=32, n_heads=4, n_enc_layers=2, n_dec_layers=2,
                                                            d_ff=64, dropout=0.0, max_len=64, **model_changes))
    cfg.train.max_tokens, cfg.train.warmup, cfg.train.lr = 256, 20, 3e-3
    cfg.train.valid_bleu, cfg.train.threads = False, 1
    sources = valid_sources(root)
    train_until(cfg, root / "run", steps, lambda run: ends_its_outputs(run / "best.pt", sources),
                "end its outputs")
    return root / "run" / "best.pt"


def made_once(tmp_path_factory, name: str, make: Callable[[Path], object],
              still_good: Callable[[Path], bool] = lambda root: True) -> Path:
    """The folder `name` that `make(root)` fills, made once a test run and shared by either pytest-xdist worker;
    and by both passes of `make test`, which names a folder for them in MT_TEST_MODELS: a model trained as one CPU
    computes is then used as the other computes, once `still_good(root)` says it still does what the tests need
    (else it is made again). Tests only read it."""
    from filelock import FileLock

    if os.environ.get("MT_TEST_MODELS"):
        shared = Path(os.environ["MT_TEST_MODELS"])
    else:
        base = tmp_path_factory.getbasetemp()
        shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the workers' common folder
    root = shared / name
    with FileLock(str(shared / f"{name}.lock")):
        done = root / f"done-{torch.backends.cpu.get_cpu_capability()}"  # checked as this pass computes
        if not done.is_file():
            if not (any(root.glob("done-*")) and still_good(root)):
                shutil.rmtree(root, ignore_errors=True)
                make(root)
            done.touch()
    return root


@pytest.fixture(scope="session")
def trained_tiny(tmp_path_factory):
    """`train_tiny`'s models, each trained once (`made_once`) and shared by every file that asks for the same one:
    `trained_tiny(steps, joint, **model_changes)` is its best.pt (run/best.pt beside the corpus/ it learned)."""

    def trained(steps: int, joint: bool = True, **model_changes) -> Path:
        name = "-".join(["tiny", str(steps), "joint" if joint else "separate",
                         *(f"{k}={v}" for k, v in sorted(model_changes.items()))])
        root = made_once(tmp_path_factory, name, lambda root: train_tiny(root, steps, joint, **model_changes),
                         lambda root: ends_its_outputs(root / "run" / "best.pt", valid_sources(root)))
        return root / "run" / "best.pt"

    return trained


def valid_sources(root: Path) -> list[str]:
    return (root / "corpus" / "valid.de").read_text(encoding="utf-8").splitlines()


def train_until(cfg, run: Path, steps: int, done, what: str, rounds: int = 5) -> None:
    """Train `cfg` (fp32, as every CPU computes it alike) into `run` in rounds of `steps` steps until `done(run)`;
    a test gets a model that does what it needs by that condition, not by a step count that suits one CPU."""
    from mt.train.loop import train

    cfg.train.precision, cfg.train.max_steps = "fp32", steps
    threads = torch.get_num_threads()
    for round in range(rounds):
        train(cfg, run, resume=round > 0, progress=False)
        torch.set_num_threads(threads)  # train set one thread for the process
        if done(run):
            return
        cfg.train.max_steps += steps
    raise AssertionError(f"the tiny model did not learn to {what} in {rounds} x {steps} steps")


ENDS_WITHIN = 28  # output tokens, below every limit the tests decode with


def ends_its_outputs(path: Path, sources: list[str]) -> bool:
    """Whether the checkpoint ends its output for every source within ENDS_WITHIN tokens, greedy and beam 4."""
    from mt.data.tokenizer import EOS
    from mt.decode.load import load_model
    from mt.decode.search import beam_search, greedy

    loaded = load_model(path)
    for ids in loaded.src_tok.encode(sources):
        src = torch.tensor([ids + [EOS]])
        best = greedy(loaded.model, src, 0.0, ENDS_WITHIN + 2)[0]
        beamed = beam_search(loaded.model, src, 4, 0.0, 0.0, ENDS_WITHIN + 2)[0][0]
        if max(len(best.tokens), len(beamed.tokens)) > ENDS_WITHIN:
            return False
    return True


def assert_refused(result, *phrases: str) -> None:
    """A CLI result (typer's CliRunner) that is one `error:` line, exit 2, saying each of `phrases`."""
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    for phrase in phrases:
        assert phrase in lines[0], lines[0]


def record_builds(monkeypatch, module) -> list[ModelConfig]:
    """The configs of the Transformers that `module` builds from now on (its `Transformer` replaced by a spy), to
    show that a refused input built none."""
    built = []

    class Recorded(Transformer):
        def __init__(self, cfg: ModelConfig):
            built.append(cfg)
            super().__init__(cfg)

    monkeypatch.setattr(module, "Transformer", Recorded)
    return built


@pytest.fixture(autouse=True)
def keep_torch_threads():
    """`train` sets torch's thread count for the whole process; give the other tests theirs back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
