"""The `mt` command line. Each command parses its options and calls one library function."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from mt import __version__

app = typer.Typer(add_completion=True, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Train and use Transformer machine-translation models.")


def fail(message: str, code: int = 2) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def user_errors():
    """The exception types whose message is written for the user: print it, exit 2, no traceback."""
    from mt.checkpoint import CheckpointError
    from mt.config import ConfigError
    from mt.corpus import CorpusError
    from mt.evaluate import EvaluateError
    from mt.train import TrainError

    return (CheckpointError, ConfigError, CorpusError, EvaluateError, TrainError, FileNotFoundError)


def version_callback(value: bool) -> None:
    if value:
        typer.echo(f"mt {__version__}")
        raise typer.Exit()


@app.callback()
def main(version: Annotated[bool, typer.Option("--version", callback=version_callback, is_eager=True,
                                                help="Print the version and exit.")] = False) -> None:
    pass


@app.command()
def prepare(
    corpus: Annotated[str | None, typer.Argument(help="A named corpus (multi30k), or omit and give --train.")] = None,
    src: Annotated[str, typer.Option(help="Source language code.")] = "de",
    tgt: Annotated[str, typer.Option(help="Target language code.")] = "en",
    out: Annotated[Path | None, typer.Option(help="Output directory [default: data/prepared/CORPUS_SRC_TGT].")] = None,
    train: Annotated[str | None, typer.Option(help="Training data: PREFIX (PREFIX.SRC/.TGT, .gz ok), a .tsv or .jsonl file, or hf:NAME:CONFIG.")] = None,
    valid: Annotated[str | None, typer.Option(help="Validation data, same forms as --train.")] = None,
    test: Annotated[str | None, typer.Option(help="Test data, same forms as --train.")] = None,
    mirror: Annotated[Path | None, typer.Option(help="Local mirror of named corpora [default: $MT_MIRROR].")] = None,
    vocab_size: Annotated[int, typer.Option(help="SentencePiece vocabulary size.")] = 8000,
    separate_vocab: Annotated[bool, typer.Option(help="One SentencePiece model per language instead of a joint one.")] = False,
    model_type: Annotated[str, typer.Option(help="SentencePiece model type: unigram or bpe.")] = "unigram",
    max_words: Annotated[int, typer.Option(help="Drop training pairs with more words on either side.")] = 250,
    max_ratio: Annotated[float, typer.Option(help="Drop training pairs whose length ratio exceeds this.")] = 9.0,
    max_tokens: Annotated[int, typer.Option(help="Drop training pairs with more pieces on either side.")] = 254,
    dedup: Annotated[bool, typer.Option(help="Drop exact duplicate training pairs.")] = False,
    encoding_errors: Annotated[str, typer.Option(help="On bytes that are not UTF-8: strict (stop) or replace.")] = "strict",
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.")] = False,
) -> None:
    """Clean a parallel corpus, train SentencePiece, and write token ids to disk."""
    from mt.prepare import prepare as run
    from mt.prepare import summary

    if corpus is None and train is None:
        fail("name a corpus (e.g. `mt prepare multi30k`) or give --train")
    out = out or Path("data/prepared") / f"{corpus or Path(train).stem}_{src}_{tgt}"
    try:
        meta = run(out, src, tgt, corpus=corpus, train=train, valid=valid, test=test, mirror=mirror,
                   vocab_size=vocab_size, joint=not separate_vocab, model_type=model_type, max_words=max_words,
                   max_ratio=max_ratio, max_tokens=max_tokens, dedup=dedup, encoding_errors=encoding_errors,
                   progress=not quiet)
    except user_errors() as e:
        fail(str(e))
    typer.echo(summary(meta))
    typer.echo(f"wrote {out}")


@app.command()
def train(
    config: Annotated[Path | None, typer.Argument(help="YAML config (see configs/) for a new run; none with --resume.")] = None,
    out: Annotated[Path | None, typer.Option(help="Run directory [default: runs/CONFIG_NAME].")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Override a config value: --set train.lr=1e-3 (repeatable).")] = None,
    resume: Annotated[bool, typer.Option(help="Continue the run in --out from its last.pt (--set may change train.* and decode.*).")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar or log lines.")] = False,
) -> None:
    """Train a Transformer on data written by `mt prepare`."""
    from mt.config import load_config
    from mt.train import TrainInterrupted, resume_config
    from mt.train import train as run

    if (config is None) != resume:
        fail("give a config file (e.g. configs/demo.yaml) to start a run, or --resume --out RUN_DIR to continue one")
    if out is None:
        if config is None:
            fail("--resume needs --out RUN_DIR")
        out = Path("runs") / config.stem
    try:
        cfg = resume_config(out, set_ or []) if resume else load_config(config, set_ or [])
        metrics = run(cfg, out, resume=resume, progress=not quiet)
    except TrainInterrupted as e:
        fail(str(e), code=130)
    except user_errors() as e:
        fail(str(e))
    typer.echo(f"done: {out}/best.pt" + (f" (valid BLEU {metrics['valid_bleu']:.2f})" if "valid_bleu" in metrics else ""))


@app.command()
def translate(
    checkpoint: Annotated[Path, typer.Option("--checkpoint", "-c", help="A checkpoint written by `mt train`.")],
    input: Annotated[Path | None, typer.Option("--input", "-i", help="Input file [default: stdin].")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Output file [default: stdout].")] = None,
    beam: Annotated[int | None, typer.Option(help="Beam size; 1 is greedy [default: the checkpoint's].")] = None,
    len_penalty: Annotated[float | None, typer.Option(help="GNMT length penalty alpha [default: the checkpoint's].")] = None,
    nbest: Annotated[int, typer.Option(help="Output the N best translations as `line ||| text ||| score`.")] = 1,
    batch_tokens: Annotated[int | None, typer.Option(help="Source tokens per batch.")] = None,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    encoding_errors: Annotated[str, typer.Option(help="On bytes that are not UTF-8: strict or replace.")] = "strict",
) -> None:
    """Translate lines from stdin or a file: one output line per input line, in order."""
    from mt.checkpoint import load_model
    from mt.train import pick_device
    from mt.translate import Options, translate_stream

    try:
        dev = pick_device(device)
        loaded = load_model(checkpoint, dev)
    except user_errors() as e:
        fail(str(e))
    opts = Options.from_config(loaded.config.decode, beam=beam, len_penalty=len_penalty, nbest=nbest,
                               batch_tokens=batch_tokens)
    if opts.nbest > opts.beam:
        opts.beam = opts.nbest
    if input is not None and not input.is_file():
        fail(f"{input}: input file not found")
    source = open(input, encoding="utf-8-sig", errors=encoding_errors, newline="\n") if input else \
        io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8-sig", errors=encoding_errors, newline="\n")
    try:
        if output is None:
            for line in translate_stream(loaded, source, opts, dev):
                sys.stdout.write(line + "\n")
                sys.stdout.flush()
        else:
            write_atomic(output, translate_stream(loaded, source, opts, dev))
    except UnicodeDecodeError as e:
        fail(f"{input or 'stdin'}: not valid UTF-8 ({e.reason}); fix the input or pass --encoding-errors replace")
    finally:
        source.close()


@app.command()
def evaluate(
    ref: Annotated[Path, typer.Option("--ref", "-r", help="Reference translations, one per line.")],
    hyp: Annotated[Path | None, typer.Option("--hyp", help="Existing translations to score.")] = None,
    checkpoint: Annotated[Path | None, typer.Option("--checkpoint", "-c", help="Translate --src with this checkpoint, then score.")] = None,
    src: Annotated[Path | None, typer.Option("--src", "-s", help="Source sentences (with --checkpoint).")] = None,
    beam: Annotated[int | None, typer.Option(help="Beam size [default: the checkpoint's].")] = None,
    lowercase: Annotated[bool, typer.Option("--lowercase", "-lc", help="Case-insensitive scores.")] = False,
    json_: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
) -> None:
    """BLEU, chrF and TER with sacreBLEU signatures, of --hyp, or of --checkpoint's translation of --src."""
    from mt.evaluate import read_text, render, score

    if (hyp is None) == (checkpoint is None):
        fail("give either --hyp FILE, or --checkpoint C with --src FILE")
    try:
        refs = read_text(ref)
        if hyp is not None:
            hyps = read_text(hyp)
        else:
            if src is None:
                fail("--checkpoint needs --src FILE (the sentences to translate)")
            hyps = translate_file(checkpoint, src, beam, device)
        if len(hyps) != len(refs):
            fail(f"{hyp or src} has {len(hyps)} lines but {ref} has {len(refs)}; they must be line-aligned")
        report = score(hyps, refs, lowercase)
    except user_errors() as e:
        fail(str(e))
    typer.echo(render(report, json_))


def translate_file(checkpoint: Path, src: Path, beam: int | None, device: str) -> list[str]:
    from mt.checkpoint import load_model
    from mt.evaluate import read_text
    from mt.train import pick_device
    from mt.translate import Options, translate_stream

    dev = pick_device(device)
    loaded = load_model(checkpoint, dev)
    opts = Options.from_config(loaded.config.decode, beam=beam)
    return list(translate_stream(loaded, read_text(src), opts, dev))


def write_atomic(path: Path, lines) -> None:
    """Write lines to a temporary file beside `path` and rename it into place when complete."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            for line in lines:
                f.write(line + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
