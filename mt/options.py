"""The options of the commands that run a model, with their defaults, said once: `mt translate`'s request and the
settings of `mt bench` and `mt serve`. Plain dataclasses without torch, so the command line reads its defaults from here
as it starts.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from mt.errors import MtError

DEVICE = "auto"  # the GPU when one is visible, else the CPU (mt.device.pick_device)


@dataclass
class TranslateRequest:
    """What `mt translate` is asked to do: one field per option of the command."""

    checkpoint: Path
    input: Path | None = None  # None: stdin, interactive when it is a terminal and nothing else is asked
    output: Path | None = None  # None: stdout, a line at a time
    beam: int | None = None  # None: the checkpoint's decode config, as for len_penalty and batch_tokens
    len_penalty: float | None = None
    nbest: int = 1
    batch_tokens: int | None = None
    precision: str = "fp32"  # one of mt.fast.paths.PRECISIONS
    device: str = DEVICE
    threads: int = 0  # 0: PyTorch's choice
    encoding_errors: str = "strict"  # or replace: what to do with bytes that are not UTF-8
    attention: Path | None = None  # a directory for heatmaps
    alignments: Path | None = None  # a file for the alignment lines
    layer: int | None = None  # of the attention: None is the mean of all decoder layers
    head: int | None = None  # within `layer`: None is the mean of its heads
    engine: str = "auto"  # mt, ctranslate2 (an `mt export` directory), or auto: which of the two the path is
    to: str | None = None  # the target language: a two-way model's other direction; None: the checkpoint's
    compile: bool = False  # torch.compile the decoding step (mt.fast.compiled.compile_decoding)
    format: str = "lines"  # or a document: text (paragraphs), html, srt (mt/documents/)
    glossary: Path | None = None  # a TSV of terms: source term, tab, target term (mt/decode/glossary.py)
    glossary_method: str | None = None  # constrain or replace; None: the best the model can do

    def check_streams(self) -> None:
        """A closed stdin or stdout (`<&-`, `>&-`), which Python leaves as None, is an error when the request needs
        it; the command line asks before torch loads, so that the error comes at once."""
        if self.input is None and sys.stdin is None:
            raise MtError("stdin is closed: nothing to translate; pipe text in, or give --input FILE")
        if self.output is None and sys.stdout is None:
            raise MtError("stdout is closed: nowhere to write the translations; give --output FILE")


@dataclass
class TranslateBench:
    """One setting of `mt bench translate`."""

    preset: str = "small"
    checkpoint: str | None = None
    input: str | None = None  # with checkpoint: a real source file; its first `sentences` lines are used
    beam: int = 4
    batch: int = 64  # sentences per batch
    sentences: int = 0  # per timed run; 0: max(batch, 16)
    src_len: int = 24
    tgt_len: int = 24
    precision: str = "fp32"
    threads: int = 0
    runs: int = 5
    seed: int = 0
    device: str = DEVICE
    compile: bool = False


@dataclass
class TrainBench:
    """One setting of `mt bench train`."""

    preset: str = "small"
    data: str | None = None  # a prepared data dir: real length-grouped batches of `max_tokens` instead
    batch: int = 64  # fixed-shape batches: sentences per batch ...
    src_len: int = 24  # ... of exactly this many source tokens (EOS included)
    tgt_len: int = 24  # ... and target tokens
    max_tokens: int = 4096
    precision: str = "fp32"
    threads: int = 0
    steps: int = 10  # timed steps, after `warmup` untimed ones
    warmup: int = 3
    dropout: float = 0.1
    device: str = DEVICE


@dataclass
class ServeOptions:
    """What `mt serve` is asked to do, besides which checkpoints."""

    host: str = "127.0.0.1"
    port: int = 8000
    precision: str = "fp32"
    device: str = DEVICE
    api_keys: frozenset[str] = frozenset()  # empty: no key needed
    cors: list[str] = field(default_factory=list)  # origins allowed to call from a browser; none by default
    max_chars: int = 5000  # per line
    max_lines: int = 256  # per request
    max_waiting: int = 64  # requests queued per model
    timeout: float = 60.0  # seconds a request may wait and be translated
    batching: bool = True  # batch concurrent requests together (off: one request per model call)
    threads: int = 0  # CPU threads of the models' PyTorch work; 0: PyTorch's choice
    compile: bool = False  # torch.compile each model's decoding step, at load
    client_timeout: float = 30.0  # seconds a request may take to arrive, head and body (mt/serve/limits.py)
    max_connections: int = 1000  # open connections held at once
    files: bool = True  # /translate_file and /download_file (mt/serve/files.py)
    max_file_bytes: int = 10 * 2 ** 20  # an upload's size
    file_ttl: float = 600.0  # seconds a translated file is kept for its download
    max_files: int = 100  # translated files kept at once
    max_stored_bytes: int = 2 ** 30  # bytes of translated files kept at once
    max_sentences: int = 1024  # parts a request is translated as: its lines, documents' and long lines' sentences
    max_beam: int = 16  # beam size (and n best) a request may ask for
    max_glossary_terms: int = 1000  # terms of a request's glossary
    max_sentence_terms: int = 16  # glossary terms placed in one sentence (the constrained search's cost grows fast)


SERVE = ServeOptions()
