"""`mt bench translate|train`: the benchmark commands, a group that mt/cli.py adds to the `mt` command line."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

from mt.options import TrainBench, TranslateBench

bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks: throughput measured the same way on any machine.")


@bench_app.command("translate")
def bench_translate(
    preset: Annotated[Literal["small", "base"], typer.Option(help="Random-weight model: small (256d, 3+3) or "
                                                                  "base (512d, 6+6).")] = TranslateBench.preset,
    checkpoint: Annotated[Path | None,
                          typer.Option(help="Benchmark a trained checkpoint instead (with --input).")] = None,
    input: Annotated[Path | None,
                     typer.Option(help="Real sentences for --checkpoint (their real lengths are used).")] = None,
    beam: Annotated[int, typer.Option(min=1, help="Beam size; 1 is greedy.")] = TranslateBench.beam,
    batch: Annotated[int, typer.Option(min=1, help="Sentences per batch.")] = TranslateBench.batch,
    sentences: Annotated[int, typer.Option(min=0, help="Sentences per timed run [default: "
                                                       "max(batch, 16)].")] = TranslateBench.sentences,
    src_len: Annotated[int, typer.Option(min=1, help="Source tokens per sentence (presets).")] = TranslateBench.src_len,
    tgt_len: Annotated[int, typer.Option(min=1, help="Output tokens per sentence, forced "
                                                     "(presets).")] = TranslateBench.tgt_len,
    precision: Annotated[Literal["fp32", "bf16", "int8"],
                         typer.Option(help="fp32, bf16 (autocast) or int8 (dynamic "
                                           "quantization, CPU).")] = TranslateBench.precision,
    device: Annotated[Literal["auto", "cpu", "cuda"], typer.Option(help="auto, cpu or cuda.")] = TranslateBench.device,
    threads: Annotated[int, typer.Option(min=0, help="CPU threads [default: PyTorch's].")] = TranslateBench.threads,
    runs: Annotated[int, typer.Option(min=1, help="Timed runs; the median is reported.")] = TranslateBench.runs,
    compile: Annotated[bool, typer.Option("--compile", help="Compile the decoding step first, as mt "
                                                            "translate --compile.")] = TranslateBench.compile,
    grid: Annotated[bool, typer.Option(help="Run the standard grid, one process per setting.")] = False,
    readme: Annotated[Path | None, typer.Option(help="With --grid: write the table between its markers in "
                                                     "this markdown file (docs/benchmarks.md).")] = None,
    json_: Annotated[bool, typer.Option("--json", help="One JSON object per setting.")] = False,
    choose_again: Annotated[bool, typer.Option("--choose-again", help="Forget this machine's kernel choices and "
                                               "measure them afresh (docs/performance.md).")] = False,
) -> None:
    """Translation throughput (target tokens/s, sentences/s, median seconds, peak memory), and the kernel choices
    made by measurement."""
    import json

    if choose_again:
        forget_choices()

    from mt.bench import bench_translate, run_grid, summary  # torch: imported when the benchmark runs

    if grid:
        return run_grid("translate", threads, None, readme, json_, echo)
    result = bench_translate(TranslateBench(
        preset=preset, checkpoint=str(checkpoint) if checkpoint else None, input=str(input) if input else None,
        beam=beam, batch=batch, sentences=sentences, src_len=src_len, tgt_len=tgt_len, precision=precision,
        threads=threads, runs=runs, device=device, compile=compile))
    typer.echo(json.dumps(result) if json_ else summary(result))


@bench_app.command("train")
def bench_train(
    preset: Annotated[Literal["small", "base"],
                      typer.Option(help="Architecture: small (256d, 3+3) or base (512d, 6+6).")] = TrainBench.preset,
    data: Annotated[Path | None,
                    typer.Option(help="Prepared data dir: real length-grouped batches of --max-tokens.")] = None,
    batch: Annotated[int, typer.Option(min=1, help="Fixed-shape batches: sentences per batch.")] = TrainBench.batch,
    src_len: Annotated[int, typer.Option(min=1,
                                         help="Fixed-shape batches: source tokens per sentence.")] = TrainBench.src_len,
    tgt_len: Annotated[int, typer.Option(min=1,
                                         help="Fixed-shape batches: target tokens per sentence.")] = TrainBench.tgt_len,
    max_tokens: Annotated[int,
                          typer.Option(min=1, help="With --data: token budget per batch.")] = TrainBench.max_tokens,
    precision: Annotated[Literal["fp32", "bf16"], typer.Option(help="fp32 or bf16 (autocast).")] = TrainBench.precision,
    device: Annotated[Literal["auto", "cpu", "cuda"], typer.Option(help="auto, cpu or cuda.")] = TrainBench.device,
    threads: Annotated[int, typer.Option(min=0, help="CPU threads [default: PyTorch's].")] = TrainBench.threads,
    steps: Annotated[int, typer.Option(min=1, help="Timed training steps (after 3 warm-up steps).")] = TrainBench.steps,
    grid: Annotated[bool, typer.Option(help="Run the standard grid, one process per setting "
                                            "(--data adds a real-batch row).")] = False,
    readme: Annotated[Path | None, typer.Option(help="With --grid: write the table between its markers in "
                                                     "this markdown file (docs/benchmarks.md).")] = None,
    json_: Annotated[bool, typer.Option("--json", help="One JSON object (per setting).")] = False,
    choose_again: Annotated[bool, typer.Option("--choose-again", help="Forget this machine's kernel choices and "
                                               "measure them afresh (docs/performance.md).")] = False,
) -> None:
    """Training throughput: target tokens/s of full steps, FLOPs per token, MFU, padding, memory, and the kernel
    choices made by measurement."""
    import json

    if choose_again:
        forget_choices()

    from mt.bench import bench_train, run_grid, summary  # torch: imported when the benchmark runs

    if grid:
        return run_grid("train", threads, str(data) if data else None, readme, json_, echo)
    result = bench_train(TrainBench(
        preset=preset, data=str(data) if data else None, batch=batch, src_len=src_len, tgt_len=tgt_len,
        max_tokens=max_tokens, precision=precision, threads=threads, steps=steps, device=device))
    typer.echo(json.dumps(result) if json_ else summary(result))


def forget_choices() -> None:
    from mt.fast.choose import forget

    typer.echo(f"forgot this machine's kernel choices ({forget()}): measured afresh as they are used", err=True)


def echo(line: str, err: bool) -> None:
    typer.echo(line, err=err)
