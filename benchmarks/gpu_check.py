"""`make gpu-check`: the whole pipeline on this machine's GPU, through the real CLI, in one JSON report.

Each step is a subprocess of `mt` as a user would run it (prepare, train in bf16 and fp16, resume, torchrun,
translate, evaluate, bench), timed and checked; the report is printed even when a step fails (with the tail of its
stderr), and the exit code is then 1. It uses the Python and torch it runs under and installs nothing: the repo is
put on PYTHONPATH, so it need not be pip-installed. Multi30k comes from --mirror DIR or $MT_MIRROR (a directory
holding multi30k/*.gz). Without CUDA it says so and exits 0, unless --device cpu runs the same steps on the CPU at
tiny sizes (how the tests prove the pipeline and its checks).

    python benchmarks/gpu_check.py --mirror /data/mirror            # on a GPU machine
    python benchmarks/gpu_check.py --device cpu --work /tmp/check   # the same steps, tiny, on a CPU
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Each halving of the fp16 loss scale follows one skipped step: 16 take GradScaler's initial 2**16 down to 1.
MAX_CALIBRATION_SKIPS = 16
CALIBRATION_STEPS = 50  # fp16 skips are the scaler's calibration only within the run's first steps
LOSS_FALL = 0.8  # the last logged training loss must be at most this fraction of the first
MODULES = ("numpy", "sentencepiece", "sacrebleu", "typer", "yaml", "tqdm", "matplotlib")  # what mt imports


@dataclass
class Plan:
    """How much each step does: a few hundred steps on a GPU, a handful on a CPU."""

    device: str
    steps: int  # steps of each precision's training run
    more_steps: int  # steps the resumed run adds
    torchrun_steps: int
    precisions: tuple[str, ...]  # trained in this order; the first run is resumed and translated
    bench_presets: tuple[str, ...]
    bench_precision: str  # of `mt bench train`
    overrides: list[str] = field(default_factory=list)  # --set for every training run
    bench_options: dict[str, str] = field(default_factory=dict)  # offered ones are passed to both benches
    timeout: int = 300  # seconds a step may take


def make_plan(device: str, steps: int | None, quick: bool, bf16: bool) -> Plan:
    """The GPU plan (bf16 and fp16, small and base presets), or a tiny one for CPUs (fp32 and bf16, small only)."""
    if device == "cpu":
        tiny = ["model.d_model=64", "model.n_heads=4", "model.d_ff=128", "model.n_enc_layers=1",
                "model.n_dec_layers=1", "train.max_tokens=1024", "train.lr=3e-3", "train.warmup=5", "train.log_every=4",
                "train.valid_bleu=false", "decode.beam=1"]
        return Plan("cpu", steps or 24, 8, 4, ("fp32", "bf16"), ("small",), "fp32", tiny,
                    {"--runs": "1", "--steps": "2", "--batch": "8", "--sentences": "8", "--beam": "1"})
    steps = steps or (200 if quick else 400)
    precisions = ("bf16", "fp16") if bf16 else ("fp16",)
    presets = ("small",) if quick else ("small", "base")
    return Plan("cuda", steps, 50 if quick else 100, 20 if quick else 50, precisions, presets,
                "bf16" if bf16 else "fp32", ["train.log_every=25"], {"--device": "cuda"})


def environment() -> dict:
    """The Python, torch, CUDA and GPU this check runs with."""
    import torch

    env = {"python": platform.python_version(), "python_executable": sys.executable, "torch": torch.__version__,
           "torch_cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(), "mt_commit": git_commit()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env |= {"gpu": props.name, "gpu_count": torch.cuda.device_count(),
                "gpu_memory_gib": round(props.total_memory / 2**30, 1),
                "compute_capability": f"{props.major}.{props.minor}", "bf16": torch.cuda.is_bf16_supported()}
    missing = [name for name in MODULES if importlib.util.find_spec(name) is None]
    if missing:  # mt's steps will fail on them: carry their wheels, as nothing is installed here
        env["missing_modules"] = missing
    return env


def git_commit() -> str | None:
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


def read_log(path: Path) -> list[dict]:
    """The interval reports of a run's log.jsonl (entries with a training loss), in order."""
    if not path.is_file():
        return []
    entries = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [e for e in entries if "loss" in e]


def check_training(entries: list[dict], precision: str, steps: int, learns: bool = True) -> dict:
    """Whether a run's log shows it training: it reached `steps`, no step was skipped except, in fp16, the scaler's
    first few, and (if it `learns`, long enough to) the loss fell. Returns the figures and a list of problems
    (empty: passed)."""
    problems = []
    missing = sorted({"step", "loss", "skipped_steps", "tgt_tok_per_s"} - set().union(*entries)) if entries else []
    if not entries or missing:
        problems.append("no interval reports in log.jsonl" if not entries else f"log.jsonl lacks {missing}")
        return {"problems": problems}
    first, last = entries[0]["loss"], entries[-1]["loss"]
    skipped = sum(e["skipped_steps"] for e in entries)
    late_skips = sum(e["skipped_steps"] for e in entries if e["step"] > CALIBRATION_STEPS)
    if learns and not last <= LOSS_FALL * first:
        problems.append(f"loss did not fall: first {first:.3f}, last {last:.3f} (want <= {LOSS_FALL} x first)")
    if entries[-1]["step"] != steps:
        problems.append(f"stopped at step {entries[-1]['step']}, not {steps}")
    if precision != "fp16" and skipped:
        problems.append(f"{skipped} skipped (non-finite) steps in {precision}; want none")
    if precision == "fp16" and (late_skips or skipped > MAX_CALIBRATION_SKIPS):
        problems.append(f"{skipped} skipped steps, {late_skips} after step {CALIBRATION_STEPS}: more than the "
                        f"scaler's calibration at the start")
    return {"steps": entries[-1]["step"], "first_loss": round(first, 3), "last_loss": round(last, 3),
            "skipped_steps": skipped, "tgt_tok_per_s": round(statistics.median(e["tgt_tok_per_s"] for e in entries)),
            "problems": problems}


def check_resume(entries: list[dict], before: int, start: int, steps: int) -> dict:
    """Whether the reports a resumed run appended (after the first `before`) continue from step `start` to
    `steps` instead of starting over."""
    added = [e["step"] for e in entries[before:]]
    problems = []
    if not added:
        problems.append("the resumed run logged nothing")
    elif added[0] <= start or added != sorted(added):
        problems.append(f"steps after resuming at {start} do not continue it: {added[:5]}...")
    elif added[-1] != steps:
        problems.append(f"the resumed run stopped at step {added[-1]}, not {steps}")
    return {"from_step": start, "logged_steps": added[:1] + added[-1:], "problems": problems}


def count_lines(path: Path) -> int:
    with open(path, encoding="utf-8", newline="\n") as lines:
        return sum(1 for _ in lines)


def check_lines(hyp: Path, src: Path) -> dict:
    """One output line per input line."""
    n_src = count_lines(src)
    n_hyp = count_lines(hyp) if hyp.is_file() else 0
    problems = [] if n_hyp == n_src else [f"{n_hyp} output lines for {n_src} input lines"]
    return {"lines": n_hyp, "problems": problems}


class Check:
    """Runs the steps, each a subprocess of the real CLI, and collects the report."""

    def __init__(self, plan: Plan, work: Path, mirror: Path | None, budget: float = 540):
        self.plan, self.work = plan, work
        self.deadline = time.monotonic() + budget
        self.data = work / "data"
        self.env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        if mirror is not None:
            self.env["MT_MIRROR"] = str(mirror)
        if plan.device == "cpu":
            self.env["CUDA_VISIBLE_DEVICES"] = ""  # `auto` devices are then the CPU, as this check says
        self.steps: list[dict] = []

    def mt(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "mt", *args]

    def run(self, name: str, argv: list[str], needs: tuple[str, ...] = ()) -> tuple[dict, str]:
        """Run one step (unless a step it needs failed), recorded with its time and exit code, and the tail of its
        stderr if it failed. Returns the record and the step's stdout."""
        step: dict = {"name": name, "command": shlex.join(argv)}
        self.steps.append(step)
        failed = [n for n in needs if not self.passed(n)]
        timeout = min(self.plan.timeout, self.deadline - time.monotonic())
        if failed or timeout < 1:
            step |= {"ok": None, "skipped": f"needs {', '.join(failed)}" if failed else "out of time (--budget)"}
            return step, ""
        print(f"gpu-check: {name}", file=sys.stderr, flush=True)
        started = time.perf_counter()
        # A session of its own, so that a step out of time is stopped with its children (torchrun's workers).
        with subprocess.Popen(argv, cwd=self.work, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, start_new_session=True) as process:
            try:
                out, err = process.communicate(timeout=timeout)
                code = process.returncode
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                out, err = process.communicate()
                code, err = None, err + f"\ntimed out after {timeout:.0f} s"
        step |= {"seconds": round(time.perf_counter() - started, 1), "exit_code": code, "ok": code == 0}
        if code != 0:
            step["stderr_tail"] = err[-2000:]
        return step, out

    def passed(self, name: str) -> bool:
        """Whether step `name` ran to exit code 0 (what the steps after it need, whatever its checks found)."""
        return any(s["name"] == name and s.get("exit_code") == 0 for s in self.steps)

    def judge(self, step: dict, checks: dict) -> None:
        """Add a check's figures to its step; the step passes only if the check found no problems."""
        step |= checks
        step["ok"] = bool(step.get("ok")) and not checks.get("problems")

    def offered(self, *command: str) -> set[str]:
        """The options a command offers, read from its --help (options may be renamed while mt changes)."""
        done = subprocess.run(self.mt(*command, "--help"), env=self.env, capture_output=True, text=True, timeout=60)
        return set(re.findall(r"--[a-z][a-z0-9-]*", done.stdout))

    def pipeline(self) -> None:
        """prepare → train in each precision → resume → torchrun → translate → evaluate → bench."""
        self.run("prepare", self.mt("prepare", "multi30k", "--src", "de", "--tgt", "en", "--out", str(self.data),
                                    "-q"))
        for precision in self.plan.precisions:
            self.train(precision)
        self.resume()
        self.torchrun()
        self.translate_and_evaluate()
        for kind in ("train", "translate"):
            offered = self.offered("bench", kind)
            for preset in self.plan.bench_presets:
                self.bench(kind, preset, offered)

    def training_options(self, precision: str, steps: int) -> list[str]:
        sets = [*self.plan.overrides, f"data={self.data}", f"train.device={self.plan.device}",
                f"train.precision={precision}", f"train.max_steps={steps}", "train.max_minutes=0",
                f"train.valid_every={steps}"]
        return [str(ROOT / "configs" / "demo.yaml"), "-q", *(arg for s in sets for arg in ("--set", s))]

    def train(self, precision: str) -> None:
        run_dir = self.work / f"run-{precision}"
        step, _ = self.run(f"train {precision}",
                           self.mt("train", "--out", str(run_dir), *self.training_options(precision, self.plan.steps)),
                           needs=("prepare",))
        if step["ok"]:
            self.judge(step, check_training(read_log(run_dir / "log.jsonl"), precision, self.plan.steps)
                       | last_validation(run_dir / "log.jsonl"))

    def resume(self) -> None:
        first = self.plan.precisions[0]
        run_dir, steps = self.work / f"run-{first}", self.plan.steps + self.plan.more_steps
        before = len(read_log(run_dir / "log.jsonl"))
        step, _ = self.run("resume", self.mt("train", "--resume", "--out", str(run_dir), "-q",
                                             "--set", f"train.max_steps={steps}"), needs=(f"train {first}",))
        if step["ok"]:
            self.judge(step, check_resume(read_log(run_dir / "log.jsonl"), before, self.plan.steps, steps))

    def torchrun(self) -> None:
        run_dir, steps = self.work / "run-torchrun", self.plan.torchrun_steps
        argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1", "-m", "mt",
                "train", "--out", str(run_dir), *self.training_options(self.plan.precisions[0], steps)]
        step, _ = self.run("torchrun", argv, needs=("prepare",))
        if step["ok"]:
            checks = check_training(read_log(run_dir / "log.jsonl"), self.plan.precisions[0], steps, learns=False)
            self.judge(step, checks)

    def translate_and_evaluate(self) -> None:
        first = self.plan.precisions[0]
        src, ref, hyp = self.data / "test.src.txt", self.data / "test.tgt.txt", self.work / "test.hyp.txt"
        step, _ = self.run("translate", self.mt("translate", "--checkpoint",
                                                str(self.work / f"run-{first}" / "best.pt"), "--input", str(src),
                                                "--output", str(hyp)), needs=(f"train {first}",))
        if step["ok"]:
            self.judge(step, check_lines(hyp, src))
        step, out = self.run("evaluate", self.mt("evaluate", "--hyp", str(hyp), "--ref", str(ref), "--json"),
                             needs=("translate",))
        if step["ok"]:
            scores = parse_json(out)
            self.judge(step, {"bleu": scores["bleu"]["score"], "chrf": scores["chrf"]["score"], "problems": []}
                       if scores else {"problems": ["mt evaluate --json printed no JSON"]})

    def bench(self, kind: str, preset: str, offered: set[str]) -> None:
        args = ["bench", kind, "--preset", preset, "--json"]
        if kind == "train":
            args += ["--precision", self.plan.bench_precision]
        args += [arg for option, value in self.plan.bench_options.items() if option in offered
                 for arg in (option, value)]
        step, out = self.run(f"bench {kind} {preset}", self.mt(*args))
        if step["ok"]:
            asked = self.plan.bench_options.get("--device") if "--device" in offered else None
            self.judge(step, check_bench(parse_json(out), self.plan.device, asked))


def parse_json(out: str) -> dict | None:
    """A command's output as JSON (all of it, or else its last line), or None."""
    for candidate in (out, out.strip().splitlines()[-1] if out.strip() else ""):
        try:
            return json.loads(candidate)
        except ValueError:
            continue
    return None


def last_validation(path: Path) -> dict:
    """The validation scores a run logged last."""
    entries = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if "valid_" in line]
    return {k: round(v, 3) for k, v in entries[-1].items() if k.startswith("valid_")} if entries else {}


def check_bench(result: dict | None, device: str, asked: str | None = None) -> dict:
    """A benchmark's result, and whether it measured the device this check is about: the one the result names, else
    the one its --device option was `asked` for, else the CPU (mt bench without --device runs there)."""
    if result is None:
        return {"problems": ["printed no JSON"]}
    ran_on = str(result.get("device") or asked or "cpu").split(":")[0]
    problems = [] if ran_on == device else [f"measured the {ran_on}, not {device} (mt bench offers no --device?)"]
    return {"result": result, "problems": problems}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mirror", type=Path, help="directory holding multi30k/*.gz [default: $MT_MIRROR]")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: the same steps at tiny sizes, to test this check without a GPU")
    parser.add_argument("--steps", type=int, help="training steps per precision [default: 400; 200 with --quick]")
    parser.add_argument("--quick", action="store_true", help="fewer steps, small bench presets only")
    parser.add_argument("--work", type=Path, help="keep the data and runs here [default: a temporary directory]")
    parser.add_argument("--budget", type=float, default=540,
                        help="seconds for all steps; those left when it runs out are skipped [default: %(default)s, "
                             "within a lent GPU machine's 10 minutes a command]")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"gpu_check": "skipped", "reason": "no CUDA device (torch.cuda.is_available() is False); "
                          "nothing was run", "python": platform.python_version(), "torch": torch.__version__}))
        return 0
    env = environment()
    plan = make_plan(args.device, args.steps, args.quick, env.get("bf16", False))
    work = (args.work or Path(tempfile.mkdtemp(prefix="gpu-check-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    check = Check(plan, work, args.mirror.resolve() if args.mirror else None, args.budget)
    started, error = time.perf_counter(), None
    try:
        check.pipeline()
    except Exception as e:  # a fault of this script: still print what was found so far
        error = f"{type(e).__name__}: {e}"
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    failed = [s["name"] for s in check.steps if s.get("ok") is False]
    report = {"gpu_check": "fail" if failed or error else "pass", "device": plan.device, "environment": env,
              "plan": {"steps": plan.steps, "resumed_to": plan.steps + plan.more_steps,
                       "torchrun_steps": plan.torchrun_steps, "precisions": plan.precisions},
              "steps": check.steps, "failed": failed, "seconds": round(time.perf_counter() - started, 1)}
    if error:
        report["error"] = error
    print(json.dumps(report, indent=2))
    return 1 if failed or error else 0


if __name__ == "__main__":
    sys.exit(main())
