"""One client cannot hurt another: on a real server, the heaviest request its limits allow (every text a document
of as many sentences as --max-sentences lets through, the widest beam, a glossary of --max-glossary-terms terms with
--max-sentence-terms to place in each sentence) runs while ordinary clients translate a line and ask /health. The
heavy request's slices take the model about a quantum each (mt/serve/batcher.py), so a line waits about one slice,
not the whole request: its median latency stays within the idle server's (measured first in the same test) and two
quanta, on any CPU; /health, which needs no model, within a small multiple of its idle median."""

import random
import statistics
import threading
import time

import httpx
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("sentencex")

from mt.serve.batcher import QUANTUM  # noqa: E402

from ..conftest import LEXICON  # noqa: E402
from .test_app import start_server  # noqa: E402

# Sentences enough that the heaviest request lasts many quanta, on the fastest CPU met too: unsliced, a line
# would wait half of it
LIMITS = {"max-lines": 4, "max-chars": 4000, "max-sentences": 384, "max-beam": 8, "max-glossary-terms": 200,
          "max-sentence-terms": 3, "timeout": 300}
PLACED = ["hund", "katze", "baum"]  # the words of the heavy request's sentences: 3 terms each to place
MULTIPLE = 10  # of /health's idle median: generous, for a shared 2-core machine
ROUNDS = 20  # requests of each kind that each ordinary client sends, idle and beside the heavy one


@pytest.fixture(scope="module")
def server(checkpoint):
    url, process = start_server(checkpoint, *(f"--{k}={v}" for k, v in LIMITS.items()))
    yield url
    process.kill()
    process.wait(30)


def heaviest(extra_sentence: bool = False) -> dict:
    """max-lines HTML documents of max-sentences sentences in all, each document within max-chars."""
    rng = random.Random(0)
    per_doc = LIMITS["max-sentences"] // LIMITS["max-lines"]
    docs = []
    for d in range(LIMITS["max-lines"]):
        count = per_doc + (extra_sentence and d == 0)
        sentences = [" ".join([*PLACED, *(rng.choice(PLACED) for _ in range(3))]).capitalize() + "."
                     for _ in range(count)]
        docs.append("<p>" + " ".join(sentences) + "</p>")
        assert len(docs[-1]) <= LIMITS["max-chars"]
    glossary = {word: LEXICON[word] for word in PLACED} | {f"wort{i}": f"word{i}" for i in range(
        LIMITS["max-glossary-terms"] - len(PLACED))}
    return {"text": docs, "format": "html", "beam": LIMITS["max-beam"], "glossary": glossary}


def ordinary(url: str, latencies: dict[str, list[float]], rounds: int) -> None:
    """A client that translates one line, then asks /health, `rounds` times; each latency kept."""
    with httpx.Client(base_url=url, timeout=120) as client:
        for _ in range(rounds):
            for what, send in (("translate", lambda: client.post("/translate", json={
                    "q": "der hund sitzt unter dem baum", "source": "de", "target": "en"})),
                               ("health", lambda: client.get("/health"))):
                started = time.perf_counter()
                assert send().status_code == 200
                latencies[what].append(time.perf_counter() - started)


def clients(url: str, rounds: int) -> dict[str, list[float]]:
    """The latencies of two ordinary clients, side by side."""
    latencies: dict[str, list[float]] = {"translate": [], "health": []}
    threads = [threading.Thread(target=ordinary, args=(url, latencies, rounds)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    return latencies


def test_ordinary_clients_keep_their_latency_while_the_heaviest_allowed_request_runs(server):
    over = httpx.post(f"{server}/v1/translate", json=heaviest(extra_sentence=True), timeout=60)
    assert over.status_code == 413 and "--max-sentences" in over.json()["error"]  # one sentence more: refused
    httpx.post(f"{server}/translate", json={"q": "der hund", "source": "de", "target": "en"}, timeout=60)  # warm
    idle = clients(server, ROUNDS)

    answers, done = [], threading.Event()

    def heavy_client():  # the heaviest request, again as soon as answered, while the others measure
        while not done.is_set():
            answers.append(httpx.post(f"{server}/v1/translate", json=heaviest(), timeout=300))
    heavy = threading.Thread(target=heavy_client)
    heavy.start()
    time.sleep(0.5)  # its first request planned and under way
    busy = clients(server, ROUNDS)
    done.set()
    heavy.join(300)
    assert answers and all(a.status_code == 200 for a in answers), answers[-1].text
    assert len(answers[0].json()["translations"]) == LIMITS["max-lines"]
    calm, loaded = statistics.median(idle["translate"]), statistics.median(busy["translate"])
    assert loaded <= calm + 2 * QUANTUM, ("translate", calm, loaded)
    calm, loaded = statistics.median(idle["health"]), statistics.median(busy["health"])
    assert loaded <= MULTIPLE * calm, ("health", calm, loaded)
