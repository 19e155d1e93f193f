"""Batching across requests without a model: how a steady load of clients is grouped into model calls."""

import asyncio
import time

from mt.batcher import Batcher
from mt.search import Hypothesis


def test_clients_that_send_again_as_soon_as_answered_fill_each_call_instead_of_alternating_halves():
    calls = []

    def translate(lines, settings):
        calls.append(len(lines))
        time.sleep(0.2)  # the model at work: each answered client is back well within the refill's share of this
        return [[Hypothesis([], 0.0, 0.0)] for _ in lines]

    batcher = Batcher(lambda: translate)

    async def client(k):
        for i in range(4):
            assert await batcher.submit([f"client {k} line {i}"], (5, 1.0, 1)) == [[Hypothesis([], 0.0, 0.0)]]

    async def eight_clients():
        await asyncio.gather(*(client(k) for k in range(8)))
    asyncio.run(eight_clients())
    batcher.stop()
    # The first call takes whoever had arrived (an idle worker starts at once); every later one holds all eight
    # clients. Taking only what waits would alternate calls of those answered last and the others: 5, 3, 5, 3...
    assert sum(calls) == 32
    assert calls[-3:] == [8, 8, 8] and len(calls) <= 5, calls
