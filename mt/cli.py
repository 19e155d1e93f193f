"""The `mt` command line. Each command parses its options and calls one library function, which holds the
defaults; an `MtError` from any command is printed as one `error:` line and exits with its code.

Each command imports its library inside its function: torch and the model load for the command that runs, so
`mt --help` and the commands that need neither start at once."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

import click
import typer
from typer._click.exceptions import NoArgsIsHelpError, UsageError  # typer's own click
from typer.core import TyperGroup

import mt.data.prepare
import mt.decode.tune
from mt import __version__
from mt.cli_bench import bench_app
from mt.documents.formats import FORMATS
from mt.errors import MtError
from mt.options import DEVICE, SERVE, TranslateRequest

PREPARE = mt.data.prepare.PrepareOptions()


def fail(message: str, code: int = 2) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


class Commands(TyperGroup):
    """The command group: a user's mistake (`MtError`) is caught here once for every command."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except MtError as e:
            fail(str(e), e.exit_code)
        except UsageError as e:  # an option out of its range, a missing one: one line too, not the usage text
            if isinstance(e, NoArgsIsHelpError):
                raise
            fail(f"{e.format_message()} (see `{e.ctx.command_path if e.ctx else 'mt'} --help`)")


# rich_markup_mode=None: plain help text. Rich markup would swallow every "[default: ...]" we write by hand.
app = typer.Typer(cls=Commands, add_completion=True, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None, help="Train and use Transformer machine-translation models.")
app.add_typer(bench_app, name="bench")


def version_callback(value: bool) -> None:
    if value:
        typer.echo(f"mt {__version__}")
        raise typer.Exit()


@app.callback()
def main(version: Annotated[bool, typer.Option("--version", callback=version_callback, is_eager=True,
                                                help="Print the version and exit.")] = False) -> None:
    from mt.memory import keep_freed_memory

    keep_freed_memory()


@app.command()
def prepare(
    corpus: Annotated[str | None, typer.Argument(help="A named corpus (multi30k), or omit and give --train.")] = None,
    src: Annotated[str, typer.Option(help="Source language code.")] = "de",
    tgt: Annotated[str, typer.Option(help="Target language code.")] = "en",
    out: Annotated[Path | None, typer.Option(help="Output directory [default: data/prepared/CORPUS_SRC_TGT].")] = None,
    train: Annotated[str | None, typer.Option(help="Training data: PREFIX (PREFIX.SRC/.TGT, .gz ok), a .tsv, "
                                                   ".jsonl, .csv or .parquet file, or hf:NAME:CONFIG.")] = None,
    valid: Annotated[str | None, typer.Option(help="Validation data, same forms as --train.")] = None,
    test: Annotated[str | None, typer.Option(help="Test data, same forms as --train.")] = None,
    mirror: Annotated[Path | None, typer.Option(help="Local mirror of named corpora [default: $MT_MIRROR].")] = None,
    vocab_size: Annotated[int, typer.Option(min=8, help="SentencePiece vocabulary size.")] = PREPARE.vocab_size,
    separate_vocab: Annotated[bool, typer.Option(help="One SentencePiece model per language instead "
                                                      "of a joint one.")] = not PREPARE.joint,
    model_type: Annotated[Literal["unigram", "bpe"],
                          typer.Option(help="SentencePiece model type: unigram or bpe.")] = PREPARE.model_type,
    spm_sentences: Annotated[int, typer.Option(min=1,
                                               help="Train SentencePiece on a random sample of at most this many lines "
                                                    "(bounds its memory on big corpora).")] = PREPARE.spm_sentences,
    max_words: Annotated[int, typer.Option(min=1, help="Drop training pairs with more words "
                                                       "on either side.")] = PREPARE.max_words,
    max_ratio: Annotated[float, typer.Option(min=1.0, help="Drop training pairs whose length ratio "
                                                           "exceeds this.")] = PREPARE.max_ratio,
    max_pieces: Annotated[int, typer.Option(min=1, help="Drop training pairs with more SentencePiece "
                                                        "pieces on either side.")] = PREPARE.max_pieces,
    dedup: Annotated[bool, typer.Option(help="Drop exact duplicate training pairs.")] = PREPARE.dedup,
    encoding_errors: Annotated[Literal["strict", "replace", "ignore"],
                               typer.Option(help="On bytes that are not UTF-8: strict (stop) "
                                                 "or replace.")] = PREPARE.encoding_errors,
    subword_samples: Annotated[int,
                               typer.Option(min=0, help="Subword regularization: also write N copies of the training "
                                                        "data, each segmented by sampling; training takes one per "
                                                        "epoch in turn. Pays off only with long training; the one-hour "
                                                        "recipes leave it off. 0: off.")] = PREPARE.subword_samples,
    subword_alpha: Annotated[float, typer.Option(min=0.01, max=1.0, help="Sampling smoothness for --subword-samples, "
                                                                         "in (0, 1]: lower gives more varied, longer "
                                                                         "segmentations.")] = PREPARE.subword_alpha,
    tokenizer: Annotated[Path | None,
                         typer.Option(help="Encode with the vocabulary of this mt checkpoint (or SentencePiece .model) "
                                           "instead of training one: data to fine-tune that model on.")] = None,
    two_way: Annotated[bool, typer.Option(help="Add a tag per language (>>de<<, >>en<<) to the vocabulary, for "
                                               "one model of both directions (train.two_way).")] = PREPARE.two_way,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bars.")] = False,
) -> None:
    """Clean a parallel corpus, train SentencePiece, and write token ids to disk."""
    out = out or mt.data.prepare.default_out(corpus, train, src, tgt)
    meta = mt.data.prepare.prepare(
        out, src, tgt, corpus=corpus, train=train, valid=valid, test=test, mirror=mirror, vocab_size=vocab_size,
        joint=not separate_vocab, model_type=model_type, spm_sentences=spm_sentences, max_words=max_words,
        max_ratio=max_ratio, max_pieces=max_pieces, dedup=dedup, encoding_errors=encoding_errors,
        subword_samples=subword_samples, subword_alpha=subword_alpha, tokenizer=tokenizer, two_way=two_way,
        progress=not quiet)
    typer.echo(mt.data.prepare.summary(meta))
    typer.echo(f"wrote {out}")


@app.command()
def train(
    config: Annotated[Path | None,
                      typer.Argument(help="YAML config (see configs/) for a new run; none with --resume.")] = None,
    out: Annotated[Path | None, typer.Option(help="Run directory [default: runs/CONFIG_NAME].")] = None,
    set_: Annotated[list[str] | None,
                    typer.Option("--set", help="Override a config value: --set train.lr=1e-3 (repeatable).")] = None,
    resume: Annotated[bool, typer.Option(help="Continue the run in --out from its last.pt (--set "
                                              "may change train.* and decode.*).")] = False,
    init: Annotated[Path | None,
                    typer.Option(help="Fine-tune: start a new run from this checkpoint's weights (its architecture "
                                      "and vocabulary; fresh optimizer, schedule and step count).")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar or log lines.")] = False,
) -> None:
    """Train a Transformer on data written by `mt prepare`."""
    from mt.config import load_config
    from mt.train.finetune import NOT_WITH_RESUME
    from mt.train.loop import train as run
    from mt.train.resume import resume_config

    if init is not None and resume:
        fail(NOT_WITH_RESUME)
    if (config is None) != resume:
        fail("give a config file (e.g. configs/demo.yaml) to start a run, or --resume --out RUN_DIR to continue one")
    if out is None and config is None:
        fail("--resume needs --out RUN_DIR")
    out = out or Path("runs") / config.stem
    cfg = resume_config(out, set_ or []) if resume else load_config(config, set_ or [])
    metrics = run(cfg, out, resume=resume, progress=not quiet, init=init)
    if os.environ.get("RANK", "0") == "0":  # under torchrun, one summary line, not one per process
        best = f"{out}/member-*/best.pt" if cfg.train.members > 1 else f"{out}/best.pt"
        typer.echo(f"done: {best}" + (f" (valid BLEU {metrics['valid_bleu']:.2f})" if "valid_bleu" in metrics else ""))


@app.command()
def translate(
    checkpoint: Annotated[Path,
                          typer.Option("--checkpoint", "-c", help="A checkpoint written by `mt train`, or a directory "
                                                                  "written by `mt export --to ctranslate2`.")],
    input: Annotated[Path | None, typer.Option("--input", "-i", help="Input file [default: stdin].")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Output file [default: stdout].")] = None,
    beam: Annotated[int | None, typer.Option(min=1, help="Beam size; 1 is greedy [default: the checkpoint's].")] = None,
    len_penalty: Annotated[float | None, typer.Option(min=0.0, max=10.0, help="GNMT length penalty alpha [default: "
                                                                              "the checkpoint's].")] = None,
    nbest: Annotated[int, typer.Option(min=1, help="Output the N best translations as "
                                                   "`line ||| text ||| score`.")] = TranslateRequest.nbest,
    batch_tokens: Annotated[int | None, typer.Option(min=1, help="Source tokens per batch.")] = None,
    precision: Annotated[Literal["fp32", "bf16", "int8"],
                         typer.Option(help="fp32, bf16 (autocast) or int8 (dynamically quantized "
                                           "linear layers, CPU).")] = TranslateRequest.precision,
    device: Annotated[Literal["auto", "cpu", "cuda"],
                      typer.Option(help="auto, cpu or cuda.")] = TranslateRequest.device,
    threads: Annotated[int, typer.Option(min=0, help="CPU threads [default: PyTorch's].")] = TranslateRequest.threads,
    encoding_errors: Annotated[Literal["strict", "replace", "ignore"],
                               typer.Option(help="On bytes that are not UTF-8: strict or "
                                                 "replace.")] = TranslateRequest.encoding_errors,
    attention: Annotated[Path | None, typer.Option(help="Write a cross-attention heatmap per input line "
                                                        "into this directory: DIR/000001.png, ...")] = None,
    alignments: Annotated[Path | None,
                          typer.Option(help="Write source-target alignments from the attention to this file, one "
                                            "line per input line, Pharaoh format (`0-0 1-2`, 0-based).")] = None,
    layer: Annotated[int | None, typer.Option(min=0, help="With --attention/--alignments: this decoder layer, "
                                                          "0-based [default: the mean of all layers].")] = None,
    head: Annotated[int | None, typer.Option(min=0, help="With --layer: this attention head, 0-based "
                                                         "[default: the mean of all heads].")] = None,
    engine: Annotated[Literal["auto", "mt", "ctranslate2"],
                      typer.Option(help="mt (a checkpoint), ctranslate2 (an exported directory), or "
                                        "auto: whichever --checkpoint is.")] = TranslateRequest.engine,
    to: Annotated[str | None, typer.Option(help="Target language: a two-way model's (train.two_way) other "
                                                "direction, e.g. --to en [default: the checkpoint's].")] = None,
    compile: Annotated[bool,
                       typer.Option("--compile", help="Compile the decoding step (torch.compile) at load, about a "
                                                      "minute on 2 cores: then faster on small batches, a third less "
                                                      "time for a lone sentence on CPU.")] = TranslateRequest.compile,
    format: Annotated[Literal[FORMATS],
                      typer.Option("--format", help="lines: one sentence a line. A document, read whole, cut into "
                                                    "sentences (the documents extra) and written back translated: "
                                                    "text (paragraphs between blank lines), html (tags kept), srt "
                                                    "(SubRip subtitles, timings kept); docx, pptx, odt, odp, epub "
                                                    "(Word, PowerPoint, OpenDocument, EPUB: all but the text "
                                                    "kept); po, xliff (only untranslated entries translated, "
                                                    "marked for review).")] = TranslateRequest.format,
    glossary: Annotated[Path | None,
                        typer.Option(help="Terminology: a TSV file of `source term<TAB>target term` lines (# comments "
                                          "and blank lines allowed); a line's translation holds the target term of "
                                          "each source term in it, or a warning on stderr names the line and term "
                                          "(docs/glossaries.md).")] = None,
    glossary_method: Annotated[Literal["constrain", "replace"] | None,
                               typer.Option(help="How --glossary's terms are placed: constrain (the search must place "
                                                 "them) or replace (the source term replaced by the target term) "
                                                 "[default: constrain; replace for a CTranslate2 export].")] = None,
) -> None:
    """Translate lines from stdin or a file: one output line per input line, in order; or, with --format, a
    document: paragraphs, HTML, subtitles, a Word, PowerPoint, OpenDocument or EPUB file, or a PO or XLIFF file.

    With stdin a terminal and no --input/--output, translate interactively: a prompt, one sentence at a time,
    Ctrl-D to quit.
    """
    request = TranslateRequest(checkpoint, input=input, output=output, beam=beam, len_penalty=len_penalty,
                               nbest=nbest, batch_tokens=batch_tokens, precision=precision, device=device,
                               threads=threads, encoding_errors=encoding_errors, attention=attention,
                               alignments=alignments, layer=layer, head=head, engine=engine, to=to, compile=compile,
                               format=format, glossary=glossary, glossary_method=glossary_method)
    request.check_streams()
    from mt.decode.translate import run

    run(request)


@app.command()
def evaluate(
    ref: Annotated[Path, typer.Option("--ref", "-r", help="Reference translations, one per line.")],
    hyp: Annotated[Path | None, typer.Option("--hyp", help="Existing translations to score.")] = None,
    checkpoint: Annotated[Path | None, typer.Option("--checkpoint", "-c", help="Translate --src with this checkpoint "
                                                                               "(or `mt export --to ctranslate2` "
                                                                               "directory), then score.")] = None,
    src: Annotated[Path | None, typer.Option("--src", "-s", help="Source sentences (with --checkpoint).")] = None,
    beam: Annotated[int | None, typer.Option(min=1, help="Beam size [default: the checkpoint's].")] = None,
    len_penalty: Annotated[float | None,
                           typer.Option(min=0.0, max=10.0, help="Length penalty alpha (the engine's own) [default: "
                                                                "the checkpoint's; 1.0 for CTranslate2].")] = None,
    lowercase: Annotated[bool, typer.Option("--lowercase", "-lc", help="Case-insensitive scores.")] = False,
    json_: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    device: Annotated[Literal["auto", "cpu", "cuda"], typer.Option(help="auto, cpu or cuda.")] = DEVICE,
) -> None:
    """BLEU, chrF and TER with sacreBLEU signatures, of --hyp, or of --checkpoint's translation of --src."""
    from mt.decode.evaluate import evaluate as run
    from mt.decode.evaluate import render

    typer.echo(render(run(ref, hyp, checkpoint, src, beam, lowercase, device, len_penalty), json_))


@app.command()
def average(
    run_dir: Annotated[Path,
                       typer.Argument(help="A run directory with checkpoint-STEP.pt files (train.keep_checkpoints).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="The averaged checkpoint to write.")],
    last: Annotated[str, typer.Option(help="Average the N newest checkpoints; several counts "
                                           "(2,4,8): keep the one with the best valid BLEU.")] = "0",
    best: Annotated[int, typer.Option(min=0, help="Average the N with the best validation BLEU.")] = 0,
    device: Annotated[Literal["auto", "cpu", "cuda"],
                      typer.Option(help="auto, cpu or cuda (to translate valid when choosing among counts).")] = DEVICE,
) -> None:
    """Average the weights of a run's last N (or best N) checkpoints into one translation checkpoint."""
    from mt.train.average import average_checkpoints, summary

    state, results = average_checkpoints(run_dir, out, last, best, device)
    typer.echo(summary(state, results, out))


@app.command()
def ensemble(
    checkpoints: Annotated[list[Path],
                           typer.Argument(help="Two or more checkpoints of one vocabulary and architecture (e.g. "
                                               "averaged runs of different seeds), at most one of them right to "
                                               "left; and at most one of the first one's direction reversed, any "
                                               "vocabulary (a channel model, e.g. de-en beside en-de).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="The ensemble checkpoint to write.")],
) -> None:
    """Combine checkpoints into one ensemble checkpoint: translate, tune, report, score and serve average their
    predictions; a right-to-left model (model.right_to_left) or one of the reverse direction among them reranks the
    others' beam instead."""
    from mt.checkpoint import joined
    from mt.decode.ensemble import write_ensemble

    state = write_ensemble(checkpoints, out)
    typer.echo(f"{out}: {joined(state)} ({', '.join(str(c) for c in checkpoints)})")


@app.command()
def export(
    checkpoint: Annotated[Path, typer.Argument(help="A checkpoint written by `mt train` or `mt average`.")],
    to: Annotated[Literal["ctranslate2", "huggingface"],
                  typer.Option(help="ctranslate2 (a CTranslate2 model directory) "
                                    "or huggingface (a MarianMTModel directory).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="The model directory to write.")],
    quantization: Annotated[Literal["float32", "int8", "int8_float32", "int8_bfloat16", "float16", "bfloat16"],
                            typer.Option(help="Weight type, for ctranslate2 (huggingface: float32).")] = "float32",
    force: Annotated[bool, typer.Option(help="Replace a non-empty --out.")] = False,
) -> None:
    """Export a checkpoint for CTranslate2 or Hugging Face transformers, with its SentencePiece models and a README."""
    from mt.export.convert import export as run

    typer.echo(f"wrote {run(checkpoint, to, out, quantization, force)}")


@app.command("import")
def import_(
    directory: Annotated[Path, typer.Argument(
        help="A Hugging Face MarianMTModel directory, e.g. an OPUS-MT model: config.json, model.safetensors (or "
             "pytorch_model.bin), source.spm, target.spm, vocab.json (and target_vocab.json with separate "
             "vocabularies), tokenizer_config.json.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="The mt checkpoint to write, outside the directory.")],
    src: Annotated[str | None, typer.Option(
        help="Source language code [default: tokenizer_config.json's source_lang].")] = None,
    tgt: Annotated[str | None, typer.Option(
        help="Target language code [default: tokenizer_config.json's target_lang].")] = None,
) -> None:
    """Import a Hugging Face MarianMTModel (an OPUS-MT model) as an mt checkpoint: the same model and pieces, which
    every command takes, fine-tuning included (docs/finetune.md)."""
    from mt.export.from_marian import import_marian, summary

    typer.echo(summary(import_marian(directory, out, src, tgt), out))


@app.command()
def serve(
    checkpoints: Annotated[list[Path],
                           typer.Argument(help="Checkpoints (or CTranslate2 exports) to serve, each loaded once.")],
    host: Annotated[str, typer.Option(help="Address to bind; the default answers this machine only.")] = SERVE.host,
    port: Annotated[int, typer.Option(min=0, max=65535, help="TCP port.")] = SERVE.port,
    name: Annotated[list[str] | None, typer.Option(help="A model's name in the APIs, one per checkpoint "
                                                        "[default: its languages, e.g. de-en].")] = None,
    precision: Annotated[Literal["fp32", "bf16", "int8"], typer.Option(help="As for mt translate.")] = SERVE.precision,
    device: Annotated[Literal["auto", "cpu", "cuda"], typer.Option(help="auto, cpu or cuda.")] = DEVICE,
    api_key: Annotated[list[str] | None,
                       typer.Option(help="Require this key on every translation request (repeatable).")] = None,
    api_keys_file: Annotated[Path | None,
                             typer.Option(help="Require one of the keys in this file, one per line.")] = None,
    cors: Annotated[list[str] | None,
                    typer.Option(help="Let pages from this origin call the API (repeatable).")] = None,
    max_chars: Annotated[int, typer.Option(min=1, help="Characters per line (longer: 413).")] = SERVE.max_chars,
    max_lines: Annotated[int, typer.Option(min=1, help="Lines per request (more: 413).")] = SERVE.max_lines,
    max_sentences: Annotated[int, typer.Option(min=1, help="Sentences a request is translated as: its lines, the "
                                                           "sentences of its documents and of lines longer than the "
                                                           "model takes (more: 413).")] = SERVE.max_sentences,
    max_beam: Annotated[int, typer.Option(min=1, help="Beam size and n best a request may ask for (more: "
                                                      "413).")] = SERVE.max_beam,
    max_glossary_terms: Annotated[int, typer.Option(min=1, help="Terms of a request's glossary, each side at most "
                                                                "200 characters, and their number times the text's "
                                                                "characters at most 100,000,000 (more: 413).")
                                  ] = SERVE.max_glossary_terms,
    max_sentence_terms: Annotated[int, typer.Option(min=1, help="Glossary terms placed in one sentence by the "
                                                                "constrained search (more: 413).")
                                  ] = SERVE.max_sentence_terms,
    max_waiting: Annotated[int, typer.Option(min=1, help="Requests queued per model (more: 503, "
                                                         "Retry-After).")] = SERVE.max_waiting,
    timeout: Annotated[float, typer.Option(min=0.001, help="Seconds a request may wait and be "
                                                           "translated (longer: 504).")] = SERVE.timeout,
    batching: Annotated[bool, typer.Option(help="Translate concurrent requests together.")] = SERVE.batching,
    threads: Annotated[int,
                       typer.Option(min=0, help="CPU threads for translating [default: PyTorch's].")] = SERVE.threads,
    compile: Annotated[bool, typer.Option("--compile", help="As for mt translate: each model compiled "
                                                            "before the server is ready.")] = SERVE.compile,
    client_timeout: Annotated[float,
                              typer.Option(min=0.001,
                                           help="Seconds a client may take to send a request, head and body, from its "
                                                "first byte (or from connecting); slower: dropped, with 408 if its "
                                                "head is incomplete. Besides: idle keep-alive connections close after "
                                                "5 s, a request's head may hold 16 KiB.")] = SERVE.client_timeout,
    max_connections: Annotated[int, typer.Option(min=1, help="Open connections held at once (more: 503 at "
                                                             "once, Retry-After).")] = SERVE.max_connections,
    files: Annotated[bool, typer.Option(help="Translate uploaded files (LibreTranslate's /translate_file), kept "
                                             "for download in a private temporary folder.")] = SERVE.files,
    max_file_bytes: Annotated[int, typer.Option(min=1, help="Bytes an uploaded file may hold (more: "
                                                            "413).")] = SERVE.max_file_bytes,
    file_ttl: Annotated[float, typer.Option(min=0.001, help="Seconds a translated file is kept for its "
                                                            "download, then removed.")] = SERVE.file_ttl,
    max_files: Annotated[int, typer.Option(min=1, help="Translated files kept at once (more: 503, "
                                                       "Retry-After).")] = SERVE.max_files,
    max_stored_bytes: Annotated[int, typer.Option(min=1, help="Bytes of translated files kept at once (more: 503, "
                                                              "Retry-After).")] = SERVE.max_stored_bytes,
) -> None:
    """Serve checkpoints over HTTP: LibreTranslate's API, mt's own, metrics and a page to try them at /. Before
    exposing it to a network, read docs/serving.md."""
    from mt.options import ServeOptions
    from mt.serve.app import run
    from mt.serve.checks import api_keys

    options = ServeOptions(
        host=host, port=port, precision=precision, device=device, api_keys=api_keys(api_key or [], api_keys_file),
        cors=cors or [], max_chars=max_chars, max_lines=max_lines, max_waiting=max_waiting, timeout=timeout,
        batching=batching, threads=threads, compile=compile, client_timeout=client_timeout,
        max_connections=max_connections, files=files, max_file_bytes=max_file_bytes, file_ttl=file_ttl,
        max_files=max_files, max_stored_bytes=max_stored_bytes, max_sentences=max_sentences, max_beam=max_beam,
        max_glossary_terms=max_glossary_terms, max_sentence_terms=max_sentence_terms)
    run(checkpoints, name or [], options)


@app.command()
def tune(
    checkpoint: Annotated[Path, typer.Option("--checkpoint", "-c", help="The checkpoint to tune.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Where to write it with the chosen decode "
                                                          "defaults (may be --checkpoint itself).")],
    src: Annotated[Path | None, typer.Option("--src", "-s", help="Held-out source sentences [default: "
                                                                 "the prepared valid split].")] = None,
    ref: Annotated[Path | None,
                   typer.Option("--ref", "-r", help="Their references [default: the prepared valid split].")] = None,
    beams: Annotated[str | None,
                     typer.Option(help="Beam sizes to try, comma-separated [default: "
                                       f"{','.join(map(str, mt.decode.tune.DEFAULT_BEAMS))}; "
                                       f"{','.join(map(str, mt.decode.tune.RERANK_BEAMS))} "
                                       "for a checkpoint with a reranker or channel].")] = None,
    len_penalties: Annotated[str, typer.Option(help="Length penalties to try, comma-separated.")] = ",".join(
        map(str, mt.decode.tune.DEFAULT_PENALTIES)),
    rerank_weights: Annotated[str, typer.Option(help="With a right-to-left reranker in the checkpoint: its weights "
                                                     "to try, comma-separated.")] = ",".join(
        map(str, mt.decode.tune.DEFAULT_WEIGHTS)),
    channel_weights: Annotated[str, typer.Option(help="With a channel model (the reverse direction) in the "
                                                      "checkpoint: its weights to try, comma-separated; "
                                                      "0 leaves it out.")] = ",".join(
        map(str, mt.decode.tune.CHANNEL_WEIGHTS)),
    finish_all: Annotated[str,
                          typer.Option(help="Without a reranker or channel: whether beam search stops at its best "
                                            "finished hypothesis (no) or once the beam's width of them have finished "
                                            "(yes, decode.finish_all); each tried, comma-separated.")] = "no,yes",
    device: Annotated[Literal["auto", "cpu", "cuda"], typer.Option(help="auto, cpu or cuda.")] = DEVICE,
    to: Annotated[str | None, typer.Option(help="Tune a two-way model's (train.two_way) other direction, "
                                                "e.g. --to en: --out then translates into it.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Choose beam size and length penalty by BLEU on validation data; save them as the checkpoint's defaults."""
    results = mt.decode.tune.tune_checkpoint(checkpoint, out, src, ref, beams, len_penalties, device,
                                             progress=not quiet, to=to, weights=rerank_weights,
                                             channel_weights=channel_weights, finish=finish_all)
    typer.echo(mt.decode.tune.summary(results, out))


@app.command()
def report(
    run_dir: Annotated[Path, typer.Argument(help="The run directory (for its training time and steps).")],
    checkpoint: Annotated[Path | None, typer.Option("--checkpoint", "-c", help="The checkpoint to score [default: "
                                                                               "RUN_DIR/final.pt].")] = None,
    device: Annotated[Literal["auto", "cpu", "cuda"], typer.Option(help="auto, cpu or cuda.")] = DEVICE,
) -> None:
    """Score a run's final checkpoint on its test split (BLEU cased and lowercased, chrF, TER, signatures) and
    write RUN_DIR/report.json."""
    import json

    from mt.report import report_run

    typer.echo(json.dumps(report_run(run_dir, checkpoint, device), indent=2, ensure_ascii=False))


@app.command()
def plot(
    run_dirs: Annotated[list[Path], typer.Argument(help="Run directories written by `mt train` (or their "
                                                        "log.jsonl files); several are drawn on one chart.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="The PNG file to write.")] = Path("curves.png"),
    x: Annotated[Literal["step", "minutes"],
                 typer.Option(help="Against steps, or minutes of training (runs at equal time).")] = "step",
) -> None:
    """Training and validation curves (loss, BLEU, learning rate, tokens/s) as a PNG."""
    from mt.plot import plot_runs

    typer.echo(f"wrote {plot_runs(run_dirs, out, x=x)}")


@app.command()
def info(
    checkpoint: Annotated[Path, typer.Argument(help="A checkpoint (best.pt or last.pt) written by `mt train`.")],
    json_: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Architecture, parameter count, vocabulary, languages, training step, validation scores and config."""
    from mt.info import describe, render

    typer.echo(render(describe(checkpoint), json_))


@app.command()
def score(
    checkpoint: Annotated[Path,
                          typer.Option("--checkpoint", "-c", help="A checkpoint written by `mt train`, or a directory "
                                                                  "written by `mt export --to ctranslate2`.")],
    src: Annotated[Path, typer.Option("--src", "-s", help="Source sentences, one per line.")],
    tgt: Annotated[Path, typer.Option("--tgt", "-t", help="Their translations to score, line-aligned with --src.")],
    batch_tokens: Annotated[int | None, typer.Option(min=1, help="Tokens per batch [default: the checkpoint's "
                                                                 "decode.batch_tokens].")] = None,
    device: Annotated[Literal["auto", "cpu", "cuda"], typer.Option(help="auto, cpu or cuda.")] = DEVICE,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Log-probability (natural log, EOS included) of each --tgt line given its --src line: one per line."""
    from mt.decode.forced import score_files

    for value in score_files(checkpoint, src, tgt, batch_tokens, device, progress=not quiet):
        typer.echo(f"{value:.4f}")
