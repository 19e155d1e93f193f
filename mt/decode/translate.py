"""Text in, text out, one way down: lines → source pieces → length-sorted batches → search → text, in input order.

`mt translate` calls `run`; the other commands call the functions below it (`translate_stream` for evaluate and
report, `translate_lines` for tune and bench; training's validation searches with mt/decode/search.py's
`translate_ids`). Input is read and translated `CHUNK_LINES` lines at a time, so memory stays bounded on endless
input. Exactly one output line per input line: an empty or blank input line gives an empty output line, a line
longer than the model allows is cut (with a warning on stderr), and control characters pass to SentencePiece,
which maps what it does not know to <unk>. The attention option of the same stream decodes each chunk's best
translations once more, teacher-forced, for alignments and heatmaps (see mt/decode/alignments.py). A glossary
(mt/decode/glossary.py) prepares each chunk's lines for the search, and each best translation is checked for its
terms: a warning on stderr names a line that misses one. With --format, the input is a document, read whole: cut
into sentences by mt/documents/, translated together by the same path (`translate_documents`), and put
back together.
"""

from __future__ import annotations

import codecs
import gc
import io
import sys
from collections.abc import Iterable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TextIO

import torch

from mt.checkpoint import towards
from mt.data.lines import (
    check_input,
    check_not_input,
    check_output,
    check_output_dir,
    read_lines,
    read_text,
    write_file,
    write_lines,
)
from mt.decode.alignments import alignments, heatmap, pair_attention, pharaoh, to_pieces
from mt.decode.ctranslate2 import is_export
from mt.decode.ctranslate2 import load as load_exported
from mt.decode.glossary import Glossary, apply, check_method, default_method, missed, read_glossary, warn_missed
from mt.decode.load import Loaded, load_model
from mt.decode.search import Hypothesis, SearchOptions, search_lines, translate_ids
from mt.device import pick_device
from mt.documents.formats import FILE_FORMATS, read_document, read_file
from mt.documents.safe import MAX_FILE_BYTES
from mt.documents.sentences import Document, Plan, finish, plan, splitter
from mt.errors import MtError
from mt.fast.compiled import compile_decoding
from mt.fast.frozen import quantized
from mt.fast.paths import PRECISIONS
from mt.options import TranslateRequest

CHUNK_LINES = 10_000  # lines read ahead and sorted together; bounds memory on endless input
PROMPT = "> "  # interactive mode's, on stderr, so that stdout holds translations only


@dataclass
class Attention:
    """The stream's attention option: an alignment line per input line and, with `heatmap_dir`, a heatmap per
    translated line (DIR/000001.png for line 1), of one decoder `layer` (and `head`) or the mean of all."""

    heatmap_dir: Path | None = None
    layer: int | None = None
    head: int | None = None


@dataclass
class Translated:
    """One input line's result: its output lines (one, or `nbest` as `i ||| text ||| score`) and, with the
    attention option, its alignment line (Pharaoh format; empty for a blank line)."""

    lines: list[str]
    alignment: str = ""


def run(request: TranslateRequest) -> None:
    """`mt translate`: the input's translations to stdout or the output file, the alignments to their file.

    With stdin a terminal and no file or attention asked for, translate interactively: a prompt on stderr,
    one line at a time, until Ctrl-D or Ctrl-C.
    """
    glossary = glossary_option(request)  # before the model loads: a bad file is refused at once
    loaded, opts, device = load(request)
    name = str(request.input or "stdin")
    if request.format in FILE_FORMATS:
        data = read_document_bytes(request.input, name)
        [out] = translate_documents(loaded, [read_file(request.format, data, name)], opts, device, glossary)
        if request.output is None:
            sys.stdout.buffer.write(out)
            sys.stdout.flush()
        else:
            write_file(request.output, out)
        return
    if request.format != "lines":
        lines = document_lines(read_document_bytes(request.input, name), request.encoding_errors, name)
        [text] = translate_documents(loaded, [read_document(request.format, lines, name)], opts, device, glossary)
        write_output([Translated(text.split("\n") if lines else [])], request.output, None, sys.stdout)
        return
    attention = attention_option(request, loaded, opts.nbest)
    if request.input is None and request.output is None and attention is None and sys.stdin.isatty():
        interactive(loaded, opts, device, sys.stdin.buffer, sys.stdout, sys.stderr, request.encoding_errors,
                    glossary)
        return
    lines = read_lines(request.input or sys.stdin.buffer, request.encoding_errors, empty_ok=True)
    write_output(translations(loaded, lines, opts, device, attention, glossary), request.output, request.alignments,
                 sys.stdout)


def glossary_option(request: TranslateRequest) -> Glossary | None:
    """The glossary of --glossary, to be placed by --glossary-method (default: the best the model can do)."""
    exported = is_export(request.checkpoint)
    if request.glossary is None:
        if request.glossary_method is not None:
            raise MtError("--glossary-method says how to place a glossary's terms: give --glossary FILE too")
        return None
    return read_glossary(request.glossary, check_method(request.glossary_method or default_method(exported), exported))


def load(request: TranslateRequest) -> tuple[Loaded, SearchOptions, torch.device]:
    """The checkpoint's model, made ready to decode in the precision asked for, and the decode options: the
    checkpoint's, changed by the request. Raises MtError for what cannot run."""
    request.check_streams()
    if request.precision not in PRECISIONS:
        raise MtError(f"--precision {request.precision}: must be one of {', '.join(PRECISIONS)}")
    if request.format != "lines":
        splitter()  # installed, or say how, before the model loads
        if request.nbest > 1 or request.attention is not None or request.alignments is not None:
            raise MtError(f"--format {request.format} writes the document back translated; --nbest, --attention and "
                          "--alignments go with line-by-line input: drop --format for them")
    if request.threads:
        torch.set_num_threads(request.threads)
    device = pick_device(request.device)
    if request.precision == "int8" and device.type != "cpu":
        raise MtError("--precision int8 runs on CPU; use --device cpu, or bf16 on a GPU")
    loaded = load_any(request.checkpoint, device, request.precision, request.engine, request.to)
    opts = SearchOptions.from_config(loaded.config.decode, beam=request.beam, len_penalty=request.len_penalty,
                               nbest=request.nbest, batch_tokens=request.batch_tokens, precision=request.precision)
    opts.beam = max(opts.beam, opts.nbest)  # the n best need a beam at least n wide
    if request.input is not None:
        check_input(request.input, "--input")
    # --output may be --input: the input is read to its end before the output is renamed over it
    for option, path, inputs in (("--output", request.output, [request.checkpoint]),
                                 ("--alignments", request.alignments, [request.checkpoint, request.input])):
        if path is not None:
            check_not_input(path, option, [p for p in inputs if p is not None])
            check_output(path, option)
    if request.attention is not None:
        check_output_dir(request.attention, "--attention")
    return (compiled(loaded, opts, device) if request.compile else loaded), opts, device


def load_any(path: Path, device: torch.device, precision: str | None = "fp32", engine: str = "auto",
             to: str | None = None) -> Loaded:
    """A checkpoint, or a model exported for CTranslate2 (mt/decode/ctranslate2.py); `engine` "mt" or "ctranslate2"
    insists on one of them; `to` turns a two-way checkpoint (`mt.checkpoint.towards`)."""
    exported = is_export(path)
    if engine == "ctranslate2" and not exported:
        raise MtError(f"--engine ctranslate2: {path} is not a CTranslate2 export; make one with `mt export {path} "
                      f"--to ctranslate2 --out DIR`")
    if engine == "mt" and exported:
        raise MtError(f"--engine mt: {path} is a CTranslate2 export; give the checkpoint it came from")
    if exported:
        loaded = load_exported(path, device, precision)
        towards({"config": {}, "langs": loaded.state["export"].get("langs")}, to, path)  # one direction only
        return loaded
    return load_model(path, device, precision, to)


def attention_option(request: TranslateRequest, loaded: Loaded, nbest: int) -> Attention | None:
    """The attention option, if --attention or --alignments asks for it, checked against the model."""
    if request.attention is None and request.alignments is None:
        return None
    if "export" in loaded.state:
        raise MtError("--attention and --alignments need mt's own model; give the checkpoint, not the export")
    layer, head = request.layer, request.head
    n_layers, n_heads = loaded.model.cfg.n_dec_layers, loaded.model.cfg.n_heads
    if nbest > 1:
        raise MtError("--attention and --alignments show the best translation only; drop --nbest")
    if loaded.model.cfg.right_to_left:
        raise MtError("--attention and --alignments need a left-to-right model; this one reads its output last "
                      "piece first (model.right_to_left)")
    if head is not None and layer is None:
        raise MtError("--head picks a head within a layer: give --layer too")
    if layer is not None and not 0 <= layer < n_layers:
        raise MtError(f"--layer {layer}: the model has decoder layers 0 to {n_layers - 1}")
    if head is not None and not 0 <= head < n_heads:
        raise MtError(f"--head {head}: the model has heads 0 to {n_heads - 1}")
    return Attention(request.attention, layer, head)


def interactive(loaded: Loaded, opts: SearchOptions, device: torch.device, stdin: BinaryIO, stdout: TextIO,
                stderr: TextIO, encoding_errors: str = "strict", glossary: Glossary | None = None) -> None:
    """Translate each line as it is typed, until Ctrl-D or Ctrl-C; each line is a stream of its own (so that
    --nbest numbers every sentence 0), translated before the next prompt."""
    def ask() -> None:
        stderr.write(PROMPT)
        stderr.flush()

    try:
        for line in read_lines(stdin, encoding_errors, empty_ok=True, ask=ask):
            write_output(translations(loaded, [line], opts, device, glossary=glossary), None, None, stdout)
    except KeyboardInterrupt:  # Ctrl-C quits as quietly as Ctrl-D
        pass
    stderr.write("\n")  # leave the shell's prompt on a line of its own
    stderr.flush()


def write_output(translated: Iterable[Translated], output: Path | None, alignments: Path | None,
                 stdout: TextIO) -> None:
    """Output lines to stdout as they come (flushed, so that a pipe or a terminal sees each at once), or to
    `output`, renamed into place when complete; then, with `alignments`, the alignment lines to that file."""
    aligned: list[str] = []
    lines = output_lines(translated, aligned)
    if output is None:
        for line in lines:
            stdout.write(line + "\n")
            stdout.flush()
    else:
        write_lines(output, lines)
    if alignments is not None:
        write_lines(alignments, aligned)


def output_lines(translated: Iterable[Translated], aligned: list[str]) -> Iterator[str]:
    """The output lines of each translation in turn, keeping its alignment line in `aligned`."""
    for result in translated:
        aligned.append(result.alignment)
        yield from result.lines


def read_document_bytes(path: Path | None, name: str) -> bytes:
    """A document's bytes, whole, from `path` or stdin: read no further than a document may be (MAX_FILE_BYTES);
    MtError for one larger, or that cannot be read."""
    try:
        with open(path, "rb") if path is not None else nullcontext(sys.stdin.buffer) as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise MtError(f"{name}: cannot read ({e.strerror or e})") from None
    if len(data) > MAX_FILE_BYTES:
        raise MtError(f"{name}: more than the {MAX_FILE_BYTES:,} bytes a document may have; split it")
    return data


def document_lines(data: bytes, encoding_errors: str, name: str) -> list[str]:
    """The lines of a text document (--format text, html, srt), as `read_lines` reads a file's, but bound by the
    document's size rather than a line's (a minified page is one line) and with its byte-order mark kept."""
    lines = list(read_lines(io.BytesIO(data), encoding_errors, empty_ok=True, name=name, limit=max(len(data), 1)))
    if data.startswith(codecs.BOM_UTF8):
        lines[0] = "\ufeff" + lines[0]
    return lines


def translate_file(checkpoint: Path, src: Path, beam: int | None, device: str, len_penalty: float | None = None
                   ) -> list[str]:
    """The translation of each line of `src` by `checkpoint` (or a CTranslate2 export), with its decode config
    (and `beam` and `len_penalty`, if given)."""
    dev = pick_device(device)
    loaded = load_any(checkpoint, dev)
    opts = SearchOptions.from_config(loaded.config.decode, beam=beam, len_penalty=len_penalty)
    return list(translate_stream(loaded, read_text(src), opts, dev))


def translate_stream(loaded: Loaded, lines: Iterable[str], opts: SearchOptions, device: torch.device) -> Iterator[str]:
    """Output lines for input lines, chunk by chunk, in order. With nbest > 1: `i ||| text ||| score` lines."""
    for result in translations(loaded, lines, opts, device):
        yield from result.lines


def translations(loaded: Loaded, lines: Iterable[str], opts: SearchOptions, device: torch.device,
                 attention: Attention | None = None, glossary: Glossary | None = None) -> Iterator[Translated]:
    """The one stream: each input line's `Translated`, in input order; CHUNK_LINES lines are read, sorted by
    length and searched together at a time. With a glossary, a warning on stderr for each line whose best
    translation misses a term of it."""
    if attention is not None and attention.heatmap_dir is not None:
        attention.heatmap_dir.mkdir(parents=True, exist_ok=True)
    for offset, chunk in chunks(lines, CHUNK_LINES):
        glossed = apply(glossary, chunk, loaded.tgt_tok)
        srcs = encode_lines(loaded, glossed.lines, offset)
        results = search_lines(loaded.model, srcs, opts, device, glossed.constraints)
        aligned = [""] * len(chunk)
        if attention is not None:
            aligned = attend(loaded, srcs, results, offset, attention, opts.batch_tokens)
        for i, (hyps, alignment) in enumerate(zip(results, aligned, strict=True)):
            if glossed.terms:
                warn_missed(offset + i + 1, glossed.missed(i, best_text(loaded, hyps)))
            yield Translated(render(loaded, offset + i, hyps, opts.nbest), alignment)


def chunks(lines: Iterable[str], size: int) -> Iterator[tuple[int, list[str]]]:
    """(index of the first line, up to `size` lines without their line ends), in order."""
    chunk: list[str] = []
    offset = 0
    for line in lines:
        chunk.append(line.rstrip("\r\n"))
        if len(chunk) == size:
            yield offset, chunk
            offset += len(chunk)
            chunk = []
    if chunk:
        yield offset, chunk


def translate_lines(loaded: Loaded, lines: list[str], opts: SearchOptions, device: torch.device,
                    warn: TextIO | None = None, glossary: Glossary | None = None) -> list[list[Hypothesis]]:
    """Hypotheses for each line (an empty list for a blank line), with `glossary`'s terms placed if given."""
    glossed = apply(glossary, lines, loaded.tgt_tok)
    return search_lines(loaded.model, encode_lines(loaded, glossed.lines, 0, warn), opts, device, glossed.constraints)


def translate_documents(loaded: Loaded, documents: list[Document], opts: SearchOptions, device: torch.device,
                        glossary: Glossary | None = None) -> list[str | bytes]:
    """Each document translated: its sentences all searched together (with `glossary`'s terms placed in each),
    each put back in its place. With a glossary, a warning names each sentence whose translation misses a term."""
    todo = plan_documents(loaded, documents)
    results = translate_lines(loaded, todo.parts, opts, device, glossary=glossary)
    texts = [render(loaded, i, hyps, 1)[0] for i, hyps in enumerate(results)]
    if glossary is not None:
        for i, (part, text) in enumerate(zip(todo.parts, texts, strict=True)):
            warn_missed(i + 1, missed(glossary, part, text), unit="sentence")
    return finish(todo, texts)


def plan_documents(loaded: Loaded, documents: list[Document]) -> Plan:
    """The sentences of `documents` to translate (mt/documents/sentences.py), cut by the rules of the model's source
    language to what it takes whole."""
    langs = loaded.state.get("langs") or (loaded.state.get("export") or {}).get("langs") or {}
    return plan(documents, langs.get("src") or "en", lambda texts: [len(ids) for ids in loaded.src_tok.encode(texts)],
                source_limit(loaded))


def source_limit(loaded: Loaded) -> int:
    """The most source pieces the model takes in a line: room is left for EOS and a two-way model's tag."""
    return loaded.model.cfg.max_len - 1 - len(loaded.lead)


def encode_lines(loaded: Loaded, lines: list[str], offset: int = 0,
                 warn: TextIO | None = None) -> list[list[int] | None]:
    """The source pieces of each line (None for a blank line), cut to what the model takes, with a warning
    on `warn` (stderr) that names the line, counting from `offset` + 1."""
    limit = source_limit(loaded)
    todo = [i for i, line in enumerate(lines) if line.strip()]
    srcs: list[list[int] | None] = [None] * len(lines)
    for i, src in zip(todo, loaded.src_tok.encode([lines[i].strip() for i in todo]), strict=True):
        if len(src) > limit:
            print(f"warning: input line {offset + i + 1} has {len(src)} pieces; cut to the model's {limit}",
                  file=warn or sys.stderr)
        srcs[i] = loaded.lead + src[:limit]
    return srcs


def compiled(loaded: Loaded, opts: SearchOptions, device: torch.device) -> Loaded:
    """`loaded` with its decoding step compiled (`mt.fast.compiled.compile_decoding`), and compiled now, at load,
    for the kinds of shape decoding meets: a lone sentence, a batch, and a lone sentence of another length (after which
    the compiled steps take any length), so that the first lines translated do not wait for the compiler. A
    CTranslate2 export is returned as it is."""
    if "export" in loaded.state:
        return loaded
    if quantized(loaded.model):
        print("mt: --compile: an int8 model decodes uncompiled (its quantized layers break the compiled graph, "
              "and compiled it ran slower)", file=sys.stderr)
        return loaded
    compile_decoding(loaded.model)
    for srcs in ([[5, 6, 7]], [[5, 6, 7], [5, 6, 7, 8, 9, 10]], [[8, 9]]):  # any ids: only the shapes matter
        translate_ids(loaded.model, srcs, opts, device)
    # Compiling leaves some 500,000 objects that live as long as the model: kept out of the garbage collector's full
    # passes, each of which would otherwise walk them all (0.5 s on 2 cores) in the middle of translating.
    gc.freeze()
    return loaded


def best_text(loaded: Loaded, hyps: list[Hypothesis]) -> str:
    return loaded.tgt_tok.decode([hyps[0].tokens])[0] if hyps else ""


def render(loaded: Loaded, index: int, hyps: list[Hypothesis], nbest: int) -> list[str]:
    """The output lines of input line `index` (0-based): the best text, or the `nbest` as `i ||| text ||| score`."""
    texts = loaded.tgt_tok.decode([h.tokens for h in hyps]) if hyps else [""]
    if nbest == 1:
        return texts[:1]
    return [f"{index} ||| {text} ||| {h.score:.4f}"
            for text, h in zip(texts, hyps or [Hypothesis([], 0.0, 0.0)], strict=True)]


def attend(loaded: Loaded, srcs: list[list[int] | None], results: list[list[Hypothesis]], offset: int,
           attention: Attention, batch_tokens: int) -> list[str]:
    """The alignment line of each line of a chunk ("" for a blank one), from the attention of its best
    translation, decoded once more teacher-forced; draws each translated line's heatmap when asked."""
    todo = [i for i, hyps in enumerate(results) if hyps]
    tgts = [results[i][0].tokens for i in todo]
    weights = pair_attention(loaded.model, [srcs[i] for i in todo], tgts, batch_tokens)
    aligned = [""] * len(results)
    for i, tgt, attn in zip(todo, tgts, weights, strict=True):
        if attention.heatmap_dir is not None:
            heatmap(attn, to_pieces(loaded.src_tok.sp, srcs[i]), to_pieces(loaded.tgt_tok.sp, tgt),
                    attention.heatmap_dir / f"{offset + i + 1:06d}.png", attention.layer, attention.head)
        aligned[i] = pharaoh(alignments(attn, attention.layer, attention.head))
    return aligned
