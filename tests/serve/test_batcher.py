"""Batching across requests without a model: how a steady load of clients is grouped into model calls."""

import asyncio
import threading
import time

import pytest

from mt.decode.search import Hypothesis
from mt.serve.batcher import Batcher, QueueFull


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


def test_a_lone_client_back_before_the_worker_looks_is_served_at_once():
    starts, ends = [], []

    def translate(lines, settings):
        starts.append(time.monotonic())
        time.sleep(0.8)  # the refill's share of this: 0.2 s
        ends.append(time.monotonic())
        return [[Hypothesis([], 0.0, 0.0)] for _ in lines]

    batcher = Batcher(lambda: translate)
    run = batcher.run

    def answer_then_look_late(group):  # the worker, its answers out, is slow to look: the client is back first
        waiting = run(group)
        for _ in range(200):
            if batcher.depth:
                break
            time.sleep(0.01)
        return waiting
    batcher.run = answer_then_look_late

    async def one_client():
        for i in range(2):
            assert await batcher.submit([f"line {i}"], (5, 1.0, 1)) == [[Hypothesis([], 0.0, 0.0)]]
    asyncio.run(one_client())
    batcher.stop()
    # Counting the client both as answered and as waiting, the worker would wait its whole refill (0.2 s) for a
    # second client that does not exist: a lone request 10-15 ms slower in mt serve on every call.
    assert len(starts) == 2 and starts[1] - ends[0] < 0.1, (starts, ends)


def test_a_request_whose_caller_gave_up_makes_room_in_a_full_queue():
    release = threading.Event()

    def translate(lines, settings):
        release.wait(10)
        return [[Hypothesis([len(line)], 0.0, 0.0)] for line in lines]

    batcher = Batcher(lambda: translate, max_waiting=1)

    async def go():
        busy = asyncio.ensure_future(batcher.submit(["a"], (5, 1.0, 1)))
        for _ in range(500):  # until the worker has taken "a": it is then held in its call
            await asyncio.sleep(0.01)
            if not batcher.depth:
                break
        gave_up = asyncio.ensure_future(batcher.submit(["bb"], (5, 1.0, 1)))
        await asyncio.sleep(0.01)
        with pytest.raises(QueueFull):  # the queue's one place is taken
            await batcher.submit(["ccc"], (5, 1.0, 1))
        gave_up.cancel()  # its caller timed out: mt serve withdraws it
        kept = asyncio.ensure_future(batcher.submit(["dddd"], (5, 1.0, 1)))
        await asyncio.sleep(0.01)
        release.set()
        return await busy, await kept

    busy, kept = asyncio.run(go())
    batcher.stop()
    assert busy == [[Hypothesis([1], 0.0, 0.0)]] and kept == [[Hypothesis([4], 0.0, 0.0)]]


def test_a_request_the_model_cannot_translate_fails_alone_and_those_batched_beside_it_are_answered():
    release, calls = threading.Event(), []

    def translate(lines, settings):
        release.wait(10)
        calls.append(list(lines))
        if "bad" in lines:
            raise ValueError("the model cannot take this line")
        return [[Hypothesis([len(line)], 0.0, 0.0)] for line in lines]

    batcher = Batcher(lambda: translate)
    sizes = []
    batcher.stats.on_call = lambda requests, lines: sizes.append((requests, lines))

    async def go():
        first = asyncio.ensure_future(batcher.submit(["a"], (5, 1.0, 1)))
        for _ in range(500):  # until the worker holds "a" in its call: the rest queue up behind it
            await asyncio.sleep(0.01)
            if not batcher.depth:
                break
        rest = [asyncio.ensure_future(batcher.submit(lines, (5, 1.0, 1))) for lines in (["bb"], ["bad"], ["cccc"])]
        for _ in range(500):
            await asyncio.sleep(0.01)
            if batcher.depth == 3:
                break
        release.set()
        return await asyncio.gather(first, *rest, return_exceptions=True)

    first, good, bad, other = asyncio.run(go())
    batcher.stop()
    assert first == [[Hypothesis([1], 0.0, 0.0)]]
    assert good == [[Hypothesis([2], 0.0, 0.0)]] and other == [[Hypothesis([4], 0.0, 0.0)]]
    assert isinstance(bad, ValueError)
    assert calls == [["a"], ["bb", "bad", "cccc"], ["bb"], ["bad"], ["cccc"]]  # the failed call, retried one by one
    assert sizes == [(1, 1), (1, 1), (1, 1)]  # /metrics counts the calls that answered


def test_every_models_pytorch_work_runs_on_one_thread():
    """Each thread running parallel PyTorch ops has an OpenMP team of its own, and teams that outnumber the cores
    slow each other down even idle: two models' loading, translating and jobs all run on the same thread."""
    seen = []

    def setup():
        seen.append(threading.get_ident())

        def translate(lines, settings):
            seen.append(threading.get_ident())
            return [[Hypothesis([], 0.0, 0.0)] for _ in lines]
        return translate

    first, second = Batcher(setup, name="a"), Batcher(setup, name="b")

    async def use_both():
        await asyncio.gather(first.submit(["one"], (1, 1.0, 1)), second.submit(["two"], (1, 1.0, 1)),
                             second.run_alone(lambda: seen.append(threading.get_ident())))
    asyncio.run(use_both())
    first.stop()
    second.stop()
    assert len(seen) == 5 and len(set(seen)) == 1
    assert seen[0] not in (first.thread.ident, second.thread.ident, threading.get_ident())


def test_a_large_request_is_translated_a_slice_a_call_and_one_arriving_meanwhile_goes_first():
    """A request of more lines than the model translates in about a quantum goes in slices, to the back of the
    queue after each: a one-line request sent while it runs is answered long before it ends, and the large one
    still gets every line back, in order."""
    calls = []

    def translate(lines, settings):
        calls.append(list(lines))
        time.sleep(0.002 * len(lines))  # the model at work: 2 ms a line, the same for any batch
        return [[Hypothesis([int(line)], 0.0, 0.0)] for line in lines]

    batcher = Batcher(lambda: translate)
    large = [str(i) for i in range(1000)]  # 2 s of the model's time: some 20 quanta

    async def go():
        big = asyncio.ensure_future(batcher.submit(large, (5, 1.0, 1)))
        for _ in range(1000):  # until the first slices have run: the worker has timed the model
            if len(calls) >= 2:
                break
            await asyncio.sleep(0.01)
        small = await batcher.submit(["7"], (5, 1.0, 1))
        return small, big.done(), await big

    small, big_done_first, big = asyncio.run(go())
    batcher.stop()
    assert small == [[Hypothesis([7], 0.0, 0.0)]] and not big_done_first
    assert [h[0].tokens[0] for h in big] == list(range(1000))
    assert ["7"] in calls and len(calls) > 10  # served between the large request's slices
    assert max(len(c) for c in calls) * 0.002 < 1.0  # no call held the worker for the large request's whole time


def test_a_large_request_whose_caller_gave_up_is_dropped_between_its_slices():
    seen = []

    def translate(lines, settings):
        seen.extend(lines)
        time.sleep(0.002 * len(lines))
        return [[Hypothesis([], 0.0, 0.0)] for _ in lines]

    batcher = Batcher(lambda: translate)

    async def go():
        big = asyncio.ensure_future(batcher.submit([str(i) for i in range(5000)], (5, 1.0, 1)))
        for _ in range(1000):
            if len(seen) >= 100:
                break
            await asyncio.sleep(0.01)
        big.cancel()  # its caller timed out, or went away
        await asyncio.sleep(0.5)
        return len(seen)

    after_cancel = asyncio.run(go())
    batcher.stop()
    assert len(seen) == after_cancel < 5000  # nothing more of it was translated


def test_a_request_that_waited_through_a_long_call_starts_right_after_it():
    """The refill after a call waits for the callers it answered at most MAX_REFILL, not a share of a long call: a
    request queued behind a 2 s call does not wait a further 0.5 s after it."""
    starts, ends = [], []

    def translate(lines, settings):
        starts.append(time.monotonic())
        time.sleep(2.0 if len(starts) == 1 else 0.01)
        ends.append(time.monotonic())
        return [[Hypothesis([], 0.0, 0.0)] for _ in lines]

    batcher = Batcher(lambda: translate)

    async def go():
        first = asyncio.ensure_future(batcher.submit(["a"], (5, 1.0, 1)))
        for _ in range(1000):
            if starts:
                break
            await asyncio.sleep(0.01)
        await batcher.submit(["b"], (5, 1.0, 1))
        await first

    asyncio.run(go())
    batcher.stop()
    assert starts[1] - ends[0] < 0.25, (starts, ends)  # 0.5 s if the refill waited a quarter of the 2 s call
