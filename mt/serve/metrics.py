"""`GET /metrics` of `mt serve`, in Prometheus' text format: requests by endpoint and status, lines and output
pieces by model, request latency, queue depth, and the size of each model call (how well requests batch)."""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
TRANSLATING = {"/translate", "/translate_file", "/detect", "/v1/translate", "/v1/attention"}


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, models: dict):
        self.registry = registry = CollectorRegistry()  # one per app: tests build many apps in one process
        self.requests = Counter("mt_requests", "Translation and detection requests answered, by endpoint and HTTP "
                                "status", ["endpoint", "code"], registry=registry)
        self.lines = Counter("mt_lines", "Lines translated", ["model"], registry=registry)
        self.tokens = Counter("mt_output_tokens", "Output pieces produced (best hypothesis)", ["model"],
                              registry=registry)
        self.latency = Histogram("mt_request_seconds", "From queueing a request to its translation", ["endpoint"],
                                 registry=registry)
        self.calls = Counter("mt_model_calls", "Model calls, each one batch of requests", ["model"],
                             registry=registry)
        self.batch_lines = Histogram("mt_batch_lines", "Lines per model call", ["model"], buckets=SIZES,
                                     registry=registry)
        self.batch_requests = Histogram("mt_batch_requests", "Requests per model call", ["model"], buckets=SIZES,
                                        registry=registry)
        queue = Gauge("mt_queue_depth", "Requests waiting for their model", ["model"], registry=registry)
        for name, served in models.items():
            queue.labels(name).set_function(lambda batcher=served.batcher: batcher.depth)
            served.batcher.stats.on_call = lambda requests, lines, name=name: self.call(name, requests, lines)

    def call(self, model: str, requests: int, lines: int) -> None:
        self.calls.labels(model).inc()
        self.batch_requests.labels(model).observe(requests)
        self.batch_lines.labels(model).observe(lines)

    def answered(self, path: str, status: int) -> None:
        self.requests.labels(path, str(status)).inc()

    def served(self, endpoint: str, served, lines: int, results: list, seconds: float) -> None:
        self.lines.labels(served.name).inc(lines)
        self.tokens.labels(served.name).inc(sum(len(hyps[0].tokens) for hyps in results if hyps))
        self.latency.labels(endpoint).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class CountAnswers:
    """An ASGI middleware that counts each translation request's answer by endpoint and status (plain ASGI: the
    `@app.middleware` kind runs every request through a task and streams of its own)."""

    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] not in TRANSLATING:
            return await self.app(scope, receive, send)

        async def counted(message):
            if message["type"] == "http.response.start":
                self.metrics.answered(scope["path"], message["status"])
            await send(message)
        await self.app(scope, receive, counted)
