"""`mt serve` under load: one-line requests at several concurrencies, beside offline translation.

For each server (mt serve; mt serve --no-batching; with --ct2 DIR, a FastAPI server that calls CTranslate2 once
per request, as users write today), and each concurrency, the first `--sentences` lines of test2016 are sent
as one-line requests by `concurrency` clients: sentences/s, latency p50/p95/p99, whether every answer equals the
offline translation, and the load generator's own CPU use (it shares the machine; it speaks HTTP/1.1 over raw
keep-alive connections, the leanest client Python has). Offline: the same sentences and settings through
`translate_lines` in this process, the model loaded (with --compile, compiled, as the servers then are); and one
sentence at a time, for the latency of a lone request. Loopback only; bounded in requests.

The machine is shared and noisy, so everything is measured `--rounds` times, each round offline and then every
server and concurrency once (a fresh server each time); the report gives each figure's median over the rounds,
its range, and the medians of the per-round ratios to offline (`vs_offline`).

    python benchmarks/serve_load.py CHECKPOINT [--ct2 EXPORT_DIR] [--sentences 500] [--concurrency 1,8,64]
                                    [--rounds 3] [--compile]
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import resource
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import torch

from mt.decode.load import load_model
from mt.decode.search import SearchOptions
from mt.decode.translate import compiled, translate_lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--ct2", type=Path, help="an `mt export --to ctranslate2` directory of the checkpoint")
    parser.add_argument("--mirror", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data")
    parser.add_argument("--sentences", type=int, default=500)
    parser.add_argument("--concurrency", default="1,8,64")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--compile", action="store_true", help="compile the decoding step, offline and in the servers")
    parser.add_argument("--ct2-server", type=Path, help=argparse.SUPPRESS)  # run the per-request CTranslate2 server
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ct2_server:
        return ct2_server(args.ct2_server, args.port)
    loaded = load_model(args.checkpoint)
    if args.compile:
        compiled(loaded, SearchOptions.from_config(loaded.config.decode), torch.device("cpu"))
    src = loaded.state["langs"]["src"]
    with gzip.open(args.mirror / "multi30k" / f"test_2016_flickr.{src}.gz", "rt", encoding="utf-8") as f:
        sentences = f.read().splitlines()[:args.sentences]
    serve = ["-m", "mt", "serve", str(args.checkpoint), *(["--compile"] if args.compile else [])]
    servers = {"mt serve": serve, "mt serve --no-batching": [*serve, "--no-batching"]}
    if args.ct2:
        servers["CTranslate2, one call per request"] = [__file__, str(args.checkpoint), "--ct2-server", str(args.ct2)]
    rounds = []
    for r in range(1, args.rounds + 1):
        measured = {"offline": offline(loaded, sentences)}
        expected = measured["offline"].pop("texts")
        for name, command in servers.items():
            for concurrency in map(int, args.concurrency.split(",")):
                cell = f"{name}, concurrency {concurrency}"
                measured[cell] = under_load(command, sentences, expected, concurrency)
                print(f"round {r}, {cell}: {measured[cell]}", file=sys.stderr, flush=True)
        rounds.append(measured)
    report = {"sentences": len(sentences), "rounds": len(rounds), "median": medians(rounds), "each_round": rounds}
    json.dump(report, sys.stdout, indent=2)
    print()


def offline(loaded, sentences: list[str]) -> dict:
    """The same sentences translated in this process: all at once (batched), and one at a time."""
    opts = SearchOptions.from_config(loaded.config.decode)
    device = torch.device("cpu")
    translate_lines(loaded, sentences[:32], opts, device)  # warm-up: the first calls set up kernels
    started = time.perf_counter()
    texts = [loaded.tgt_tok.decode([h[0].tokens])[0] if h else "" for h in translate_lines(loaded, sentences, opts,
                                                                                            device)]
    batched = time.perf_counter() - started
    alone = []
    for sentence in sentences[:100]:
        started = time.perf_counter()
        translate_lines(loaded, [sentence], opts, device)
        alone.append(time.perf_counter() - started)
    return {"sentences_per_s": round(len(sentences) / batched, 1),
            "one_sentence_p50_ms": round(1000 * statistics.median(alone), 1), "texts": texts}


def medians(rounds: list[dict]) -> dict:
    """Each figure's median over the rounds and its range; for servers, also the median of the per-round ratios
    of throughput and of p50 latency to offline's (the same round's)."""
    out = {}
    for key in rounds[0]:
        out[key] = {}
        for figure in rounds[0][key]:
            values = [r[key][figure] for r in rounds]
            out[key][figure] = None if None in values else statistics.median(values)
            if len(rounds) > 1 and figure in ("sentences_per_s", "p50_ms", "one_sentence_p50_ms"):
                out[key][figure + "_range"] = [min(values), max(values)]
        if key != "offline":
            out[key]["vs_offline"] = {
                "throughput": round(statistics.median(r[key]["sentences_per_s"] / r["offline"]["sentences_per_s"]
                                                      for r in rounds), 3),
                "p50_vs_one_sentence": round(statistics.median(r[key]["p50_ms"] / r["offline"]["one_sentence_p50_ms"]
                                                               for r in rounds), 3)}
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def under_load(command: list[str], sentences: list[str], expected: list[str], concurrency: int,
               cwd: Path | None = None) -> dict:
    """One server (`command`, started in `cwd`) under one concurrency; see the module's docstring."""
    port = free_port()
    server = subprocess.Popen([sys.executable, *command, "--port", str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, cwd=cwd)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(url, server)
        asyncio.run(send_all(url, sentences[:16], 4))  # warm-up, as offline
        calls = model_calls(url)
        cpu = resource.getrusage(resource.RUSAGE_SELF)
        started = time.perf_counter()
        latencies, texts = asyncio.run(send_all(url, sentences, concurrency))
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_SELF)
        calls = [b - a for a, b in zip(calls, model_calls(url), strict=True)]
    finally:
        server.terminate()
        server.wait(60)
    cpu_seconds = (after.ru_utime - cpu.ru_utime) + (after.ru_stime - cpu.ru_stime)
    ms = sorted(1000 * t for t in latencies)
    return {"sentences_per_s": round(len(sentences) / wall, 1), "p50_ms": round(percentile(ms, 50), 1),
            "p95_ms": round(percentile(ms, 95), 1), "p99_ms": round(percentile(ms, 99), 1),
            "answered": sum(t is not None for t in texts), "correct": sum(a == b for a, b in zip(texts, expected,
                                                                                                  strict=True)),
            "load_generator_cpu_share": round(cpu_seconds / wall, 2),
            "lines_per_model_call": round(calls[1] / calls[0], 1) if calls[0] else None}


def model_calls(url: str) -> tuple[float, float]:
    """Model calls and lines translated so far, from `mt serve`'s /metrics (zeros from a server without them)."""
    metrics = httpx.get(url + "/metrics", timeout=10)
    found = {"count": 0.0, "sum": 0.0}
    for line in metrics.text.splitlines() if metrics.status_code == 200 else []:
        for key in found:
            if line.startswith(f"mt_batch_lines_{key}{{"):
                found[key] += float(line.rsplit(" ", 1)[1])
    return found["count"], found["sum"]


def percentile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def wait_ready(url: str, server: subprocess.Popen) -> None:
    for _ in range(3000):  # a compiling server takes a minute or two
        if server.poll() is not None:
            raise SystemExit(f"the server exited with {server.returncode}")
        try:
            if httpx.get(url + "/ready", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise SystemExit("the server never became ready")


async def send_all(url: str, sentences: list[str], concurrency: int) -> tuple[list[float], list[str | None]]:
    """Each sentence as its own request, `concurrency` in flight at a time, each client on its own keep-alive
    connection; latency and text of each. HTTP/1.1 is written and read by hand: a client library (httpx) spent
    about a third of a core at concurrency 64, taken from the server it measures on the same cores."""
    latencies: list[float] = [0.0] * len(sentences)
    texts: list[str | None] = [None] * len(sentences)
    todo = iter(range(len(sentences)))
    host, port = url.removeprefix("http://").split(":")

    async def client():
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            for i in todo:
                body = json.dumps({"text": [sentences[i]]}).encode()
                started = time.perf_counter()
                writer.write(b"POST /v1/translate HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (host.encode(), len(body), body))
                status, answer = await read_response(reader)
                latencies[i] = time.perf_counter() - started
                if status == 200:
                    texts[i] = json.loads(answer)["translations"][0]["text"]
        finally:
            writer.close()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return latencies, texts


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """The status and body of one HTTP/1.1 response with a Content-Length (as uvicorn sends JSON)."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
    length = next(int(line.split(":", 1)[1]) for line in head if line.lower().startswith("content-length:"))
    return int(head[0].split()[1]), await reader.readexactly(length)


def ct2_server(directory: Path, port: int) -> None:
    """What users write today: FastAPI calling CTranslate2's translate_batch once per request."""
    import ctranslate2
    import sentencepiece
    import uvicorn
    from fastapi import FastAPI

    manifest = json.loads((directory / "mt_export.json").read_text())
    decode = manifest["config"]["decode"]
    translator = ctranslate2.Translator(str(directory), intra_threads=torch.get_num_threads())
    src = sentencepiece.SentencePieceProcessor(model_file=str(directory / "source.spm"))
    tgt = sentencepiece.SentencePieceProcessor(model_file=str(directory / "target.spm"))
    app = FastAPI()

    @app.get("/ready")
    def ready():
        return {"ready": True}

    @app.post("/v1/translate")
    def translate(body: dict):
        pieces = [src.encode(line, out_type=str) for line in body["text"]]
        results = translator.translate_batch(pieces, beam_size=decode["beam"])
        return {"translations": [{"text": tgt.decode(r.hypotheses[0])} for r in results]}

    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
