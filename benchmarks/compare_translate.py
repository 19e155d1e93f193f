"""Side by side: `mt` against Hugging Face `generate` and CTranslate2 on the same architecture and workload.

Each system gets the preset architecture (random weights, vocabulary 8000, tied embeddings), the same random
source sentences and a fixed output length, then translates them in batches; throughput counts the output
tokens each system really produced. In one process the systems run one after another, mt first: once CTranslate2
has run in a process, PyTorch's parallel work there runs slower for good, and CTranslate2 itself is slowed at
random beside PyTorch (docs/benchmarks.md). `--processes N` therefore times each system in a fresh process of its
own, the systems in turn, N rounds, and reports each one's median: the comparison to trust.
Needs the optional extra: `pip install -e '.[bench]'`.

    python benchmarks/compare_translate.py --preset small --beam 4 --batch 64 [--int8] [--bf16] [--compile] \
        [--processes 3]

Prints one JSON object per system (per round with --processes) and a ratio line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from mt.bench import PRESETS, VOCAB, preset_model
from mt.data.batches import pad
from mt.data.tokenizer import EOS
from mt.decode.search import autocast, beam_search, greedy
from mt.fast.compiled import compile_decoding
from mt.fast.paths import for_inference
from mt.memory import keep_freed_memory


def timed(run, runs: int) -> float:
    run()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


HF_EOS, HF_PAD = 1, VOCAB  # Marian's layout: <pad> is the last token, which CTranslate2 drops when converting


def marian_generator(preset: str):
    """A random-weight MarianMTModel of the preset's architecture, in eval mode. Its vocabulary is VOCAB tokens plus
    Marian's trailing <pad> (HF_PAD; HF_EOS ends a source); benchmarks/gpu_bench.py decodes with it too."""
    from transformers import MarianConfig, MarianMTModel

    p = PRESETS[preset]
    config = MarianConfig(
        vocab_size=VOCAB + 1, d_model=p["d_model"], encoder_layers=p["n_enc_layers"], decoder_layers=p["n_dec_layers"],
        encoder_attention_heads=p["n_heads"], decoder_attention_heads=p["n_heads"], encoder_ffn_dim=p["d_ff"],
        decoder_ffn_dim=p["d_ff"], activation_function="relu", max_position_embeddings=256, scale_embedding=True,
        pad_token_id=HF_PAD, eos_token_id=HF_EOS, decoder_start_token_id=HF_PAD, forced_eos_token_id=None,
        share_encoder_decoder_embeddings=True, tie_word_embeddings=True)
    torch.manual_seed(0)
    return MarianMTModel(config).eval()


def marian_model(preset: str, model_dir: Path):
    """`marian_generator`'s model, saved with the vocabulary files CTranslate2's converter reads: after conversion
    CTranslate2 has exactly VOCAB output classes, as mt has."""
    import sentencepiece as spm

    model = marian_generator(preset)
    model.save_pretrained(model_dir)
    tokens = ["<unk>", "</s>"] + [f"w{i}" for i in range(2, VOCAB)] + ["<pad>"]
    (model_dir / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}), encoding="utf-8")
    # MarianTokenizer insists on SentencePiece files; they are never used, since ids go in directly.
    spm.SentencePieceTrainer.train(sentence_iterator=iter(["a b c d e f g h"] * 10),
                                   model_prefix=str(model_dir / "spm"), vocab_size=12, model_type="char",
                                   minloglevel=2)
    for name in ("source.spm", "target.spm"):
        (model_dir / name).write_bytes((model_dir / "spm.model").read_bytes())
    (model_dir / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "MarianTokenizer",
                                                                  "model_max_length": 256}), encoding="utf-8")
    return model, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small", choices=list(PRESETS))
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--sentences", type=int, default=0, help="per timed run [default: the batch]")
    ap.add_argument("--src-len", type=int, default=24)
    ap.add_argument("--tgt-len", type=int, default=24)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--int8", action="store_true", help="also time int8: mt dynamic quantization vs CT2 int8")
    ap.add_argument("--bf16", action="store_true", help="also time mt bf16 (weights in bf16, under autocast)")
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--compile", action="store_true", help="mt's decoding step compiled, as mt translate --compile")
    ap.add_argument("--only", choices=SYSTEMS, help="time this system alone")
    ap.add_argument("--processes", type=int, default=0,
                    help="time each system in a fresh process of its own, in turn, this many rounds; medians")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="with --processes: the systems timed, in turn")
    args = ap.parse_args()
    if args.processes:
        return in_processes(args.processes, args.systems.split(","))
    keep_freed_memory()  # as `mt` sets it, for all systems: they share this process
    torch.set_num_threads(args.threads)
    n = args.sentences or args.batch
    g = torch.Generator().manual_seed(0)
    srcs = [torch.randint(4, VOCAB, (args.src_len,), generator=g).tolist() for _ in range(n)]
    batches = [pad(srcs[i:i + args.batch], [], [EOS]) for i in range(0, n, args.batch)]
    results = {}

    def report(name: str, seconds: float, tokens: int) -> None:
        results[name] = {"system": name, "preset": args.preset, "beam": args.beam, "batch": args.batch,
                         "median_s": seconds, "tgt_tokens": tokens, "tgt_tok_per_s": tokens / seconds}
        print(json.dumps(results[name]), flush=True)

    mt_precisions = ["fp32"] + ["int8"] * args.int8 + ["bf16"] * args.bf16
    for precision in mt_precisions if args.only in (None, "mt") else ():
        model = for_inference(preset_model(args.preset), precision)
        if args.compile:
            compile_decoding(model)  # compiled in `timed`'s untimed first run
        produced = []

        def run_mt(model=model, produced=produced, precision=precision) -> None:
            produced.clear()
            for src in batches:
                with autocast(precision, torch.device("cpu")):  # bf16 decodes under autocast, as mt translate does
                    if args.beam == 1:
                        hyps = [h.tokens for h in greedy(model, src, 0.0, args.tgt_len + 1, min_len=args.tgt_len)]
                    else:
                        hyps = [h[0].tokens for h in beam_search(model, src, args.beam, 0.6, 0.0, args.tgt_len + 1,
                                                                 min_len=args.tgt_len)]
                produced.append(sum(len(h) for h in hyps))

        seconds = timed(run_mt, args.runs)
        report(f"mt-{precision}", seconds, sum(produced))

    if args.only == "mt":
        return
    import ctranslate2

    with tempfile.TemporaryDirectory() as tmp:
        hf, pieces = marian_model(args.preset, Path(tmp) / "hf")
        hf_batches = [torch.tensor([s + [HF_EOS] for s in srcs[i:i + args.batch]]) for i in range(0, n, args.batch)]
        produced = []

        @torch.inference_mode()
        def run_hf() -> None:
            produced.clear()
            for src in hf_batches:
                out = hf.generate(input_ids=src, attention_mask=torch.ones_like(src), num_beams=args.beam,
                                  do_sample=False, min_new_tokens=args.tgt_len, max_new_tokens=args.tgt_len)
                produced.append(int(((out[:, 1:] != HF_PAD) & (out[:, 1:] != HF_EOS)).sum()))

        if args.only in (None, "hf"):
            report("hf-generate-fp32", timed(run_hf, args.runs), sum(produced))
        if args.only == "hf":
            return

        ct2_dir = Path(tmp) / "ct2"
        for compute_type in ("float32", "int8") if args.int8 else ("float32",):
            out_dir = ct2_dir / compute_type
            ctranslate2.converters.TransformersConverter(str(Path(tmp) / "hf")).convert(
                str(out_dir), quantization=compute_type)
            translator = ctranslate2.Translator(str(out_dir), device="cpu", inter_threads=1, intra_threads=args.threads,
                                                compute_type=compute_type)
            tokens = [[pieces[i] for i in s] + ["</s>"] for s in srcs]

            def run_ct2(translator=translator, tokens=tokens) -> None:
                produced.clear()
                for i in range(0, n, args.batch):
                    res = translator.translate_batch(tokens[i:i + args.batch], beam_size=args.beam,
                                                     max_batch_size=args.batch, min_decoding_length=args.tgt_len,
                                                     max_decoding_length=args.tgt_len, length_penalty=0.6)
                    produced.append(sum(len(r.hypotheses[0]) for r in res))

            report(f"ct2-{compute_type}", timed(run_ct2, args.runs), sum(produced))

    if args.only is None:
        print(json.dumps(ratios({name: r["tgt_tok_per_s"] for name, r in results.items()})))


SYSTEMS = ("mt", "ct2", "hf")


def ratios(speed: dict[str, float]) -> dict:
    """mt fp32's speed over each other system's, and mt int8's and bf16's over CTranslate2 int8's."""
    out = {"ratios_mt_fp32_over": {name: round(speed["mt-fp32"] / s, 2) for name, s in speed.items()
                                   if name != "mt-fp32"}}
    for reduced in ("mt-int8", "mt-bf16"):
        if reduced in speed and "ct2-int8" in speed:
            out["ratios_mt_fp32_over"][f"{reduced} / ct2-int8"] = round(speed[reduced] / speed["ct2-int8"], 2)
    return out


def in_processes(rounds: int, systems: list[str]) -> None:
    """This command's comparison with each system in a fresh process of its own, the systems in turn, `rounds`
    times: each result per round, then the medians and their ratios."""
    argv = sys.argv[1:]
    for option in ("--processes", "--systems"):
        if option in argv:
            at = argv.index(option)
            del argv[at:at + 2]
    speeds: dict[str, list[float]] = {}
    for round_ in range(rounds):
        for system in systems:
            out = subprocess.run([sys.executable, __file__, *argv, "--only", system], capture_output=True, text=True,
                                 check=True).stdout
            for line in out.splitlines():
                result = json.loads(line)
                speeds.setdefault(result["system"], []).append(result["tgt_tok_per_s"])
                print(json.dumps({**result, "round": round_ + 1}), flush=True)
    medians = {name: statistics.median(s) for name, s in speeds.items()}
    print(json.dumps({"median_tgt_tok_per_s": {k: round(v, 1) for k, v in medians.items()}, **ratios(medians)}))


if __name__ == "__main__":
    main()
