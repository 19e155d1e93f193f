"""Side by side: an `mt` training step against Hugging Face `MarianMTModel` at the same architecture.

Both train on the same fixed-shape batches (random ids, `--batch` pairs of `--src-len` + `--tgt-len` tokens,
dropout 0.1, label smoothing 0.1, the same fused Adam): forward, loss, backward, optimizer step. Steps alternate between
the two systems so machine noise hits both alike; the medians are compared. Needs `pip install -e '.[bench]'`.
`marian` and `marian_step` are also the Marian side of benchmarks/gpu_bench.py.

    python benchmarks/compare_train.py --preset small --precision fp32

Prints one JSON object per system and their ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from contextlib import nullcontext

import torch
import torch.nn.functional as F

from mt.bench import PRESETS, VOCAB
from mt.config import Config, ModelConfig
from mt.data.batches import Batch
from mt.data.tokenizer import EOS, PAD
from mt.memory import keep_freed_memory
from mt.model.transformer import Transformer
from mt.train.loop import train_step
from mt.train.optim import adam


def marian(preset: str):
    from transformers import MarianConfig, MarianMTModel

    p = PRESETS[preset]
    config = MarianConfig(
        vocab_size=VOCAB, d_model=p["d_model"], encoder_layers=p["n_enc_layers"], decoder_layers=p["n_dec_layers"],
        encoder_attention_heads=p["n_heads"], decoder_attention_heads=p["n_heads"], encoder_ffn_dim=p["d_ff"],
        decoder_ffn_dim=p["d_ff"], activation_function="relu", max_position_embeddings=256, scale_embedding=True,
        dropout=0.1, attention_dropout=0.0, activation_dropout=0.0, pad_token_id=0, eos_token_id=EOS,
        decoder_start_token_id=0, share_encoder_decoder_embeddings=True, tie_word_embeddings=True)
    return MarianMTModel(config).train()


def marian_step(hf, optimizer: torch.optim.Optimizer, batch: Batch, amp: torch.dtype | None) -> None:
    """One training step of Hugging Face's model as its users write it: forward under autocast, label-smoothed loss
    per target token, backward, clipping to norm 1, Adam. Padded sources are masked; targets are right-padded, so
    the causal mask alone keeps real positions from seeing padding (as in mt), and no decoder mask is passed."""
    device = batch.src.device
    with torch.autocast(device.type, dtype=amp) if amp else nullcontext():
        logits = hf(input_ids=batch.src, attention_mask=(batch.src != PAD).long(),
                    decoder_input_ids=batch.tgt_in).logits
    loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), batch.tgt_out.reshape(-1), label_smoothing=0.1,
                           ignore_index=PAD, reduction="sum") / batch.n_tgt_tokens
    loss.backward()
    torch.nn.utils.clip_grad_norm_(hf.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small", choices=list(PRESETS))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--src-len", type=int, default=24)
    ap.add_argument("--tgt-len", type=int, default=24)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = ap.parse_args()
    keep_freed_memory()  # as `mt` sets it, for both systems: they share this process
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    amp = torch.bfloat16 if args.precision == "bf16" else None

    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, VOCAB, (args.batch, args.src_len), generator=g)
    src[:, -1] = EOS
    tgt = torch.randint(4, VOCAB, (args.batch, args.tgt_len + 1), generator=g)
    batch = Batch(src, tgt[:, :-1], tgt[:, 1:], args.batch * args.tgt_len)

    cfg = Config(model=ModelConfig(**PRESETS[args.preset], src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, dropout=0.1))
    cfg.train.clip_norm = 1.0  # as the Hugging Face step below
    ours = Transformer(cfg.model).train()
    ours_opt = adam(list(ours.parameters()), cfg.train)
    scaler = torch.amp.GradScaler("cpu", enabled=False)

    hf = marian(args.preset)
    hf_opt = adam(list(hf.parameters()), cfg.train)

    def step_ours() -> None:
        train_step(ours, ours_opt, scaler, [batch], cfg, torch.device("cpu"), amp, 1e-4)

    def step_hf() -> None:
        marian_step(hf, hf_opt, batch, amp)

    times = {"mt": [], "hf": []}
    for i in range(args.steps + 2):  # two warm-up steps each
        for name, step in (("mt", step_ours), ("hf", step_hf)):
            start = time.perf_counter()
            step()
            if i >= 2:
                times[name].append(time.perf_counter() - start)
    tokens = args.batch * args.tgt_len
    results = {}
    for name, ts in times.items():
        median = statistics.median(ts)
        results[name] = {"system": name, "preset": args.preset, "precision": args.precision, "batch": args.batch,
                         "median_step_s": median, "tgt_tok_per_s": tokens / median}
        print(json.dumps(results[name]))
    print(json.dumps({"ratio_mt_over_hf": round(results["mt"]["tgt_tok_per_s"] / results["hf"]["tgt_tok_per_s"], 2)}))


if __name__ == "__main__":
    main()
