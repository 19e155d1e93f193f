"""Batching across requests: one worker thread per model translates whatever has queued up while it was busy.

A request's lines wait in a bounded queue. When the worker is free it takes the oldest waiting request and every
other waiting request with the same decoding settings, up to a token budget, and translates all their lines in
one call (mt/translate.py sorts them by length and batches them); each request then gets its own lines back, in
order. An idle worker starts on a lone request at once: there is no waiting window. A request whose caller gave up
(timed out, disconnected) before the worker reached it is dropped unread.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from mt.search import Hypothesis

Settings = tuple[int, float, int]  # beam, length penalty, n best: what requests batched together must share
Translate = Callable[[list[str], Settings], list[list[Hypothesis]]]


class QueueFull(Exception):
    """The queue has no room for another request; the caller should come back later."""


@dataclass
class Pending:
    lines: list[str]
    settings: Settings
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    tokens: int = field(init=False)

    def __post_init__(self):
        self.tokens = sum(len(line) for line in self.lines) // 4 + len(self.lines)  # a cheap estimate of pieces


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
    def __init__(self, translate: Translate, max_waiting: int = 64, batch_tokens: int = 4096, name: str = "model"):
        self.translate, self.max_waiting, self.batch_tokens = translate, max_waiting, batch_tokens
        self.waiting: deque[Pending] = deque()
        self.ready = threading.Condition()
        self.stats = Stats()
        self.stopping = False
        self.thread = threading.Thread(target=self.work, name=f"mt-serve-{name}", daemon=True)
        self.thread.start()

    async def submit(self, lines: list[str], settings: Settings) -> list[list[Hypothesis]]:
        """The hypotheses of each line, once the worker has translated them; raises QueueFull at once when full."""
        loop = asyncio.get_running_loop()
        pending = Pending(lines, settings, loop.create_future(), loop)
        with self.ready:
            if len(self.waiting) >= self.max_waiting:
                raise QueueFull(f"{len(self.waiting)} requests are waiting")
            self.waiting.append(pending)
            self.ready.notify()
        return await pending.future

    @property
    def depth(self) -> int:
        return len(self.waiting)

    def stop(self) -> None:
        """Finish what is queued, then end the worker."""
        with self.ready:
            self.stopping = True
            self.ready.notify()
        self.thread.join()

    def work(self) -> None:
        while True:
            with self.ready:
                while not self.waiting and not self.stopping:
                    self.ready.wait()
                if not self.waiting:
                    return
                group = self.take()
            if group:
                self.run(group)

    def take(self) -> list[Pending]:
        """The oldest live request and the waiting ones with its settings, within the token budget (the first
        is taken whatever its size); requests whose callers gave up are dropped."""
        live = [p for p in self.waiting if not p.future.done()]
        self.waiting.clear()
        if not live:
            return []
        settings, group, tokens = live[0].settings, [], 0
        for pending in live:
            if pending.settings == settings and (not group or tokens + pending.tokens <= self.batch_tokens):
                group.append(pending)
                tokens += pending.tokens
            else:
                self.waiting.append(pending)
        return group

    def run(self, group: list[Pending]) -> None:
        lines = [line for pending in group for line in pending.lines]
        try:
            results = self.translate(lines, group[0].settings)
        except Exception as error:  # the callers get the error; the worker lives on for the next requests
            for pending in group:
                pending.loop.call_soon_threadsafe(set_exception, pending.future, error)
            return
        self.stats.record(len(group), len(lines))
        start = 0
        for pending in group:
            part = results[start:start + len(pending.lines)]
            start += len(pending.lines)
            pending.loop.call_soon_threadsafe(set_result, pending.future, part)


def set_result(future: asyncio.Future, value) -> None:
    if not future.done():  # the caller may have timed out meanwhile
        future.set_result(value)


def set_exception(future: asyncio.Future, error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
