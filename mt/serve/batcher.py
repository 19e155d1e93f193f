"""Batching across requests: one worker thread per model batches whatever has queued up while it was busy.

A request's lines wait in a bounded queue. When the worker is free it takes the oldest waiting request and every
other waiting request with the same decoding settings, up to a token budget, and translates all their lines in
one call (mt/decode/translate.py sorts them by length and batches them); each request then gets its own lines back, in
order. An idle worker starts on a lone request at once: there is no waiting window. A request whose caller gave up
(timed out, disconnected) before the worker reached it is dropped unread. When a call fails, each of its requests
is tried again alone, so a request the model cannot translate fails itself only.

A request too large for a share of the worker's time (more pieces than `slice_tokens`: what the model translates in
about `QUANTUM` seconds, as the recent slices ran) is translated a slice a call, in calls of its own, and goes to the
back of the queue after each: the requests that arrived meanwhile go first, so that one client's heaviest request
delays another's by about a quantum, not by its whole length. A caller that gives up between two slices has the rest
of its request dropped.

Just after a call, the callers it answered are often about to send their next request. Taking only what waits
then splits a steady load of N clients into calls of about N/2, alternating, while a call's time grows far more
slowly than its lines. So after a call the worker gives those callers up to `REFILL` of the call's own time to
come back (never more than `MAX_REFILL`: those already waiting are not kept long for them), and starts as soon as
as many requests wait as were waiting when the answers went out plus those answered, or the token budget is full.
A lone client loses nothing: its next request meets the count on arrival, even when it is back before the worker
starts waiting.

All PyTorch work, every model's, loading included, runs on one thread (`on_torch_thread`), which each worker
hands its calls to and waits for: each thread that runs parallel PyTorch ops has an OpenMP team of its own, and once
the teams' threads outnumber the cores every parallel region pays a wake-up (single-sentence translation ran 2.5x
slower on 2 cores when the model was loaded on one thread and run on another; beside a second model's idle worker,
a batch translated at half the speed). Models served together take turns on the cores.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from mt.decode.glossary import Glossary
from mt.decode.search import Hypothesis

Settings = tuple[int, float, int, Glossary | None]  # beam, length penalty, n best, glossary: what a batch shares
Translate = Callable[[list[str], Settings], list[list[Hypothesis]]]
Outcome = tuple[Any, Exception | None]  # a request's result, or the error that is its answer instead
REFILL = 0.25  # after a model call, how long to wait for its callers' next requests, as a share of the call's time
MAX_REFILL = 0.05  # seconds: at most that long, a client's round trip on a network near the server
QUANTUM = 0.1  # seconds of the model's time that a large request gets a call, before the others take their turn
MIN_SLICE = 16  # pieces: a slice holds a sentence or so however slow the model
FIRST_SLICE = 256  # pieces: a large request's slice before any call has been timed


TORCH_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mt-serve-torch")  # see the module's docstring


def on_torch_thread(call: Callable[[], Any]) -> Any:
    """`call()` run on the one thread of all PyTorch work, its result or its error, once it has run."""
    return TORCH_THREAD.submit(call).result()


class QueueFull(Exception):
    """The queue has no room for another request; the caller should come back later."""


@dataclass
class Pending:
    lines: list[str]
    settings: Settings | None  # None: `call` is a job of its own (alignments, attention), run alone
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    call: Callable[[], Any] | None = None
    done: list = field(default_factory=list)  # the hypotheses of the lines translated so far, slice by slice
    part: list[str] = field(default_factory=list)  # the lines of the call it is in
    sliced: bool = False  # whether that call is a slice of it, alone

    @property
    def tokens(self) -> int:
        """The pieces of the lines still to translate."""
        return sum(estimate(line) for line in self.lines[len(self.done):])

    def slice(self, tokens: int) -> list[str]:
        """The next lines to translate, as many as `tokens` pieces hold (one at least)."""
        out, total = [], 0
        for line in self.lines[len(self.done):]:
            if out and total + estimate(line) > tokens:
                break
            out.append(line)
            total += estimate(line)
        return out


def estimate(line: str) -> int:
    return len(line) // 4 + 1  # a cheap estimate of a line's pieces


@dataclass
class Stats:
    """What the worker did, for /metrics: how many model calls, and the requests and lines of each."""

    calls: int = 0
    on_call: Callable[[int, int], None] | None = None  # (requests, lines) of each call

    def record(self, requests: int, lines: int) -> None:
        self.calls += 1
        if self.on_call is not None:
            self.on_call(requests, lines)


class Batcher:
    """`setup` runs on the thread of all PyTorch work and returns the function that translates (see the module's
    docstring); its error, if any, is raised here."""

    def __init__(self, setup: Callable[[], Translate], max_waiting: int = 64, batch_tokens: int = 4096,
                 name: str = "model"):
        self.max_waiting, self.batch_tokens = max_waiting, batch_tokens
        self.waiting: deque[Pending] = deque()
        self.ready = threading.Condition()
        self.stats = Stats()
        self.stopping = False
        self.seconds_per_token: float | None = None  # as the recent slices ran, for `slice_tokens`
        self.started, self.setup_error = threading.Event(), None
        self.thread = threading.Thread(target=self.work, args=(setup,), name=f"mt-serve-{name}", daemon=True)
        self.thread.start()
        self.started.wait()
        if self.setup_error is not None:
            raise self.setup_error

    async def submit(self, lines: list[str], settings: Settings) -> list[list[Hypothesis]]:
        """The hypotheses of each line, once the worker has translated them; raises QueueFull at once when full."""
        return await self.queue(Pending(lines, settings, *self.future()))

    async def run_alone(self, call: Callable[[], Any]) -> Any:
        """`call()` between batches, on the thread of all PyTorch work (work that uses the model beside translating)."""
        return await self.queue(Pending([], None, *self.future(), call=call))

    @staticmethod
    def future() -> tuple[asyncio.Future, asyncio.AbstractEventLoop]:
        loop = asyncio.get_running_loop()
        return loop.create_future(), loop

    async def queue(self, pending: Pending) -> Any:
        with self.ready:
            if len(self.waiting) >= self.max_waiting:  # those whose callers gave up make room first
                self.waiting = deque(p for p in self.waiting if not p.future.done())
            if len(self.waiting) >= self.max_waiting:
                raise QueueFull(f"{len(self.waiting)} requests are waiting")
            self.waiting.append(pending)
            self.ready.notify()
        return await pending.future

    @property
    def slice_tokens(self) -> int:
        """The most pieces of a request's lines that one call of its own takes: about QUANTUM seconds of the
        model's time, as the recent slices ran (timed on slices alone: a small call's time is mostly its
        overhead, which a slice sized on it would pay again and again)."""
        if self.seconds_per_token is None:
            return FIRST_SLICE
        return max(MIN_SLICE, int(QUANTUM / self.seconds_per_token))

    def timed(self, tokens: int, seconds: float) -> None:
        rate = seconds / max(tokens, 1)
        self.seconds_per_token = rate if self.seconds_per_token is None else (self.seconds_per_token + rate) / 2

    @property
    def depth(self) -> int:
        return len(self.waiting)

    def stop(self) -> None:
        """Finish what is queued, then end the worker."""
        with self.ready:
            self.stopping = True
            self.ready.notify()
        self.thread.join()

    def work(self, setup: Callable[[], Translate]) -> None:
        try:
            translate = on_torch_thread(setup)
            self.translate = lambda lines, settings: on_torch_thread(lambda: translate(lines, settings))
        except Exception as error:
            self.setup_error = error
            return
        finally:
            self.started.set()
        answered, took, before = 0, 0.0, 0  # the last call's requests and seconds, and how many waited beside it
        while True:
            with self.ready:
                self.refill(before + answered, took)
                while not self.waiting and not self.stopping:
                    self.ready.wait()
                if not self.waiting:
                    return
                group = self.take()
            if group:
                started = time.monotonic()
                before = self.run(group)
                answered, took = len(group), time.monotonic() - started

    def refill(self, expected: int, took: float) -> None:
        """With `ready` held: wait until `expected` requests wait (those that waited as the last call's answers went
        out, and its callers, back), for at most REFILL of the last call's time (see the module's docstring)."""
        want = min(expected, self.max_waiting) if self.batch_tokens else 0  # 0: a request a call
        until = time.monotonic() + min(REFILL * took, MAX_REFILL)
        while len(self.waiting) < want and sum(p.tokens for p in self.waiting) < self.batch_tokens \
                and not self.stopping and (left := until - time.monotonic()) > 0:
            self.ready.wait(left)

    def take(self) -> list[Pending]:
        """The oldest live request and the waiting ones with its settings that fit a slice, within the token
        budget (the first is taken whatever its size); a request larger than a slice goes alone, its next slice.
        Requests whose callers gave up are dropped."""
        live = [p for p in self.waiting if not p.future.done()]
        self.waiting.clear()
        if not live:
            return []
        slice_tokens = self.slice_tokens
        if live[0].call is not None or live[0].tokens > slice_tokens:
            self.waiting.extend(live[1:])
            live[0].part, live[0].sliced = live[0].slice(slice_tokens), live[0].call is None
            return live[:1]
        settings, group, tokens = live[0].settings, [], 0
        for pending in live:
            if pending.settings == settings and pending.tokens <= slice_tokens \
                    and (not group or tokens + pending.tokens <= self.batch_tokens):
                pending.part, pending.sliced = pending.lines[len(pending.done):], False
                group.append(pending)
                tokens += pending.tokens
            else:
                self.waiting.append(pending)
        return group

    def run(self, group: list[Pending]) -> int:
        """Translate the group and hand each request its lines; returns how many requests waited as the answers
        went out (a caller answered may be back before the worker next looks: it is not one of these)."""
        calls: list[tuple[int, int]] = []  # (requests, lines) of each model call that answered
        call = group[0].call
        started, tokens = time.monotonic(), sum(estimate(line) for pending in group for line in pending.part)
        outcomes = [attempt(lambda: on_torch_thread(call))] if call is not None else self.translate_each(group, calls)
        if group[0].sliced and calls:
            self.timed(tokens, time.monotonic() - started)
        for requests, lines in calls:  # counted before anyone is answered: a caller's next look at /metrics sees it
            self.stats.record(requests, lines)
        answers = []
        for pending, (part, error) in zip(group, outcomes, strict=True):
            if error is None and call is None and len(pending.done) + len(part) < len(pending.lines):
                pending.done.extend(part)  # a slice: the request goes to the back of the queue for its next
                with self.ready:
                    self.waiting.append(pending)
            else:
                answers.append((pending, pending.done + part if error is None and call is None else part, error))
        waiting = len(self.waiting)
        for pending, part, error in answers:
            if error is None:
                pending.loop.call_soon_threadsafe(set_result, pending.future, part)
            else:
                pending.loop.call_soon_threadsafe(set_exception, pending.future, error)
        return waiting

    def translate_each(self, group: list[Pending], calls: list[tuple[int, int]]) -> list[Outcome]:
        """Each request's lines, or its error. When the call for the whole group fails, each request is retried
        alone, so that one request the model cannot translate fails only itself, not those batched beside it."""
        lines = [line for pending in group for line in pending.part]
        results, error = attempt(lambda: self.translate(lines, group[0].settings))
        if error is None:
            calls.append((len(group), len(lines)))
            outcomes, start = [], 0
            for pending in group:
                outcomes.append((results[start:start + len(pending.part)], None))
                start += len(pending.part)
            return outcomes
        if len(group) == 1:
            return [(None, error)]
        outcomes = []
        for pending in group:
            if pending.future.done():  # its caller gave up meanwhile: no second try
                outcomes.append((None, error))
                continue
            outcomes.append(attempt(lambda p=pending: self.translate(p.part, p.settings)))
            if outcomes[-1][1] is None:
                calls.append((1, len(pending.part)))
        return outcomes


def attempt(call: Callable[[], Any]) -> Outcome:
    """`call()`'s result, or the error it raised: the callers get the error; the worker lives on."""
    try:
        return call(), None
    except Exception as error:
        return None, error


def set_result(future: asyncio.Future, value) -> None:
    if not future.done():  # the caller may have timed out meanwhile
        future.set_result(value)


def set_exception(future: asyncio.Future, error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
