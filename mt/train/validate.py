"""Validation during training: loss per target token and BLEU against the raw references."""

from __future__ import annotations

import math

import sacrebleu
import torch
import torch.nn.functional as F

from mt.config import Config
from mt.data.batches import batch_by_tokens, collate
from mt.data.ids import Split
from mt.data.tokenizer import PAD, Tokenizer
from mt.decode.search import SearchOptions, translate_ids
from mt.device import autocast
from mt.model.transformer import Transformer


@torch.inference_mode()
def validation_metrics(model: Transformer, split: Split, refs: list[str], tgt_tok: Tokenizer, cfg: Config,
                       device: torch.device, amp_dtype: torch.dtype | None) -> dict:
    """Validation loss (per target token, label smoothing off) and BLEU (of greedy decoding, or beam search with
    `train.valid_beam` > 1) against the raw references."""
    model.eval()
    lengths = [max(s, t) + 1 for s, t in zip(split.src_lens, split.tgt_lens, strict=True)]
    loss, tokens = 0.0, 0
    for idx in batch_by_tokens(lengths, cfg.train.max_tokens):
        batch = collate(split, idx, cfg.model.max_len).to(device)
        with autocast(amp_dtype, device):
            logits = model(batch.src, batch.tgt_in)
        loss += F.cross_entropy(logits.flatten(0, 1).float(), batch.tgt_out.flatten(), ignore_index=PAD,
                                reduction="sum").item()
        tokens += batch.n_tgt_tokens
    metrics = {"valid_loss": loss / tokens, "valid_ppl": math.exp(min(loss / tokens, 50.0))}
    if cfg.train.valid_bleu:
        srcs = [split.src(i)[:cfg.model.max_len - 1].tolist() for i in range(len(split))]
        opts = SearchOptions.from_config(cfg.decode, beam=cfg.train.valid_beam)
        hyps = translate_ids(model, srcs, opts, device)
        texts = tgt_tok.decode([h[0].tokens for h in hyps])
        metrics["valid_bleu"] = sacrebleu.corpus_bleu(texts, [refs]).score
    return metrics
