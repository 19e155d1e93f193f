"""Translating with an exported CTranslate2 model (`mt export --to ctranslate2`) through mt's own commands.

`load` returns a `Loaded` whose model is a `CTranslate2Model`: mt/decode/translate.py encodes, batches and renders as
for a checkpoint, and hands the search to CTranslate2. Its length penalty is CTranslate2's (log-probability over
length^alpha), not mt's GNMT penalty, so the decoding defaults keep the checkpoint's beam but not its alpha.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor

from mt.config import ModelConfig, from_dict
from mt.data.tokenizer import Tokenizer
from mt.decode.constrained import Constraints
from mt.decode.load import Loaded
from mt.decode.search import Hypothesis, SearchOptions
from mt.errors import MtError

MANIFEST = "mt_export.json"  # written by mt/export/convert.py
LEN_PENALTY = 1.0  # CTranslate2's default


def is_export(path: str | Path) -> bool:
    return (Path(path) / MANIFEST).is_file()


class CTranslate2Model:
    """Stands where mt's Transformer does in mt/decode/translate.py; `search` replaces mt's search."""

    def __init__(self, directory: Path, cfg: ModelConfig, src_tok: Tokenizer, tgt_tok: Tokenizer,
                 device: torch.device):
        import ctranslate2

        self.cfg = cfg
        self.translator = ctranslate2.Translator(str(directory), device=device.type,
                                                 intra_threads=torch.get_num_threads())
        self.src_pieces = src_tok.pieces()
        self.tgt_ids = tgt_tok.sp.piece_to_id

    def search(self, srcs: list[list[int]], opts: SearchOptions, device: torch.device,
               constraints: Constraints | None = None) -> list[list[Hypothesis]]:
        """The `opts.nbest` best translations of each source (piece ids, no EOS): one output limit for all, from the
        longest source (CTranslate2 takes one per call). CTranslate2 runs on the device it was loaded on. It has no
        lexical constraints: a glossary reaches it by replacement (mt/decode/glossary.py), and constraints are
        refused."""
        if constraints:
            raise MtError("a CTranslate2 export cannot constrain its search to glossary terms: use --glossary-method "
                          "replace, or give the checkpoint")
        if not srcs:
            return []
        longest = max(len(src) for src in srcs) + 1
        limit = min(int(opts.max_len_a * longest + opts.max_len_b), self.cfg.max_len - 1)
        results = self.translator.translate_batch(
            [[self.src_pieces[i] for i in src] for src in srcs], beam_size=opts.beam, length_penalty=opts.len_penalty,
            num_hypotheses=opts.nbest, max_decoding_length=limit, return_scores=True,
            max_batch_size=opts.batch_tokens, batch_type="tokens")
        return [[Hypothesis([self.tgt_ids(piece) for piece in pieces], score, score)
                 for pieces, score in zip(result.hypotheses, result.scores, strict=True)] for result in results]

    def cross_attention(self, src: Tensor, tgt: Tensor) -> Tensor:
        raise MtError("attention and alignments need mt's own model; give the checkpoint, not the export")


def load(directory: str | Path, device: torch.device | str = "cpu", precision: str | None = "fp32") -> Loaded:
    directory = Path(directory)
    manifest = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
    if manifest.get("format") != "ctranslate2":
        raise MtError(f"{directory}: a {manifest.get('format')} export; mt translates CTranslate2 exports only "
                      f"(load this one with its own library: see its README.md)")
    if precision not in (None, "fp32"):
        raise MtError(f"--precision {precision}: an exported model runs in the type it was exported with "
                      f"({manifest['quantization']}); export again with --quantization to change it")
    cfg = from_dict(manifest["config"])
    cfg.decode.len_penalty = LEN_PENALTY
    src_tok, tgt_tok = Tokenizer.load(directory / "source.spm"), Tokenizer.load(directory / "target.spm")
    try:
        model = CTranslate2Model(directory, cfg.model, src_tok, tgt_tok, torch.device(device))
    except ImportError:
        raise MtError(f"{directory}: a CTranslate2 model needs the ctranslate2 package: pip install 'mt[export]'"
                      ) from None
    return Loaded(model, cfg, src_tok, tgt_tok, {"config": manifest["config"], "export": manifest})
