"""Continuous batching, shaped like vLLM's V1 scheduler.

Each step schedules one decode token for every running request, then admits waiting requests
(whole prompts: no chunked prefill) while the token budget and ``max_num_seqs`` allow, and runs
the model once over all the step's tokens. So the size of a step, and with it the RMSNorm launch
size, depends on when requests arrive: the same workload forms different steps in different
repeats.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from demollm.model import DemoModel, Segment

logger = logging.getLogger("demollm")


class RequestError(ValueError):
    """A request the engine refuses (HTTP 400)."""


@dataclass
class TokenOutput:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # (token id, logprob), best first


@dataclass(eq=False)  # identity: a request is one submission, hashable for the pending set
class Request:
    request_id: str
    prompt: list[int]
    max_tokens: int
    logprobs: int  # top-k alternatives to report (0: none)
    arrival: float = field(default_factory=time.monotonic)
    outputs: list[TokenOutput] = field(default_factory=list)
    segment: Segment | None = None
    future: Future[Request] = field(default_factory=Future)


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048


# Bucket bounds of vllm:iteration_tokens_total (tokens per engine step).
STEP_BUCKETS = (1, 8, 16, 32, 64, 128, 255, 256, 512, 1024, 2048, 4096)


class LLMEngine:
    """The scheduler and the model; ``step()`` runs one engine step (tests drive it directly)."""

    def __init__(self, model: DemoModel, config: SchedulerConfig) -> None:
        self.model = model
        self.config = config
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.steps = 0
        self.step_sizes: list[int] = []  # tokens per step (kept for tests and the metrics)
        self.bucket_counts = [0] * (len(STEP_BUCKETS) + 1)
        self._ids = itertools.count()

    def make_request(self, prompt: list[int], max_tokens: int, logprobs: int = 0) -> Request:
        vocab = self.model.config.vocab_size
        if not prompt:
            raise RequestError("prompt must be a non-empty list of token ids")
        bad = [
            t for t in prompt if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab
        ]
        if bad:
            raise RequestError(f"token id {bad[0]!r} out of vocabulary [0, {vocab})")
        if max_tokens < 1:
            raise RequestError("max_tokens must be at least 1")
        limit = self.model.config.max_model_len
        if len(prompt) + max_tokens > limit:
            raise RequestError(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{len(prompt) + max_tokens} tokens ({len(prompt)} in the messages, "
                f"{max_tokens} in the completion)."
            )
        if len(prompt) > self.config.max_num_batched_tokens:
            raise RequestError(
                f"prompt of {len(prompt)} tokens exceeds max_num_batched_tokens "
                f"({self.config.max_num_batched_tokens}); chunked prefill is not supported"
            )
        if not 0 <= logprobs <= 20:
            raise RequestError("logprobs must be between 0 and 20")
        return Request(f"cmpl-{next(self._ids)}", list(prompt), max_tokens, logprobs)

    def add_request(self, request: Request) -> None:
        self.waiting.append(request)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def step(self) -> list[Request]:
        """One engine step; returns the requests that finished in it."""
        scheduled: list[Request] = list(self.running)
        budget = self.config.max_num_batched_tokens - len(scheduled)
        admitted: list[Request] = []
        while self.waiting and len(scheduled) + len(admitted) < self.config.max_num_seqs:
            request = self.waiting[0]
            if len(request.prompt) > budget:
                break
            self.waiting.popleft()
            budget -= len(request.prompt)
            request.segment = Segment(np.array([], dtype=np.int64), self.model.new_sums(), 0)
            admitted.append(request)
        scheduled += admitted
        if not scheduled:
            return []
        segments = []
        for request in scheduled:
            assert request.segment is not None
            new = request.prompt if request in admitted else [request.outputs[-1].token_id]
            request.segment.tokens = np.asarray(new, dtype=np.int64)
            segments.append(request.segment)
        logprobs = self.model.forward(segments)
        size = sum(len(s.tokens) for s in segments)
        self.steps += 1
        self.step_sizes.append(size)
        self.bucket_counts[next((i for i, b in enumerate(STEP_BUCKETS) if size <= b), -1)] += 1
        finished, still = [], []
        for request, lp in zip(scheduled, logprobs, strict=True):
            request.outputs.append(_sample(lp, request.logprobs))
            if len(request.outputs) >= request.max_tokens:
                request.segment = None
                finished.append(request)
            else:
                still.append(request)
        self.running = still  # one assignment: the metrics thread never sees a half-built list
        return finished


def _sample(logprobs: np.ndarray, k: int) -> TokenOutput:
    """Greedy (argmax: ties go to the lowest id); the top k sorted by logprob, then id."""
    token = int(np.argmax(logprobs))
    top: list[tuple[int, float]] = []
    if k > 0:
        ids = np.argpartition(logprobs, -k)[-k:]
        ids = ids[np.lexsort((ids, -logprobs[ids]))]
        top = [(int(t), float(logprobs[t])) for t in ids]
    return TokenOutput(token, float(logprobs[token]), top)


class EngineLoop:
    """The engine on its own thread: HTTP threads submit, the loop steps while there is work."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._cond = threading.Condition()
        self._incoming: list[Request] = []
        self._pending: set[Request] = set()  # submitted, not finished (failed if the engine dies)
        self._stop = False
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout=10)

    @property
    def alive(self) -> bool:
        return self.error is None and self._thread.is_alive()

    def submit(self, request: Request) -> Future[Request]:
        with self._cond:
            if self.error is not None:
                raise RuntimeError(f"engine is dead: {self.error}")
            self._incoming.append(request)
            self._pending.add(request)
            self._cond.notify_all()
        return request.future

    def counts(self) -> tuple[int, int]:
        """(running, waiting), like vllm:num_requests_running / _waiting."""
        with self._cond:
            return len(self.engine.running), len(self.engine.waiting) + len(self._incoming)

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._stop and not self._incoming and not self.engine.has_work():
                        self._cond.wait()
                    if self._stop:
                        return
                    for request in self._incoming:
                        self.engine.add_request(request)
                    self._incoming.clear()
                for request in self.engine.step():
                    with self._cond:
                        self._pending.discard(request)
                    request.future.set_result(request)
        except Exception as exc:  # the engine died: fail everything, /health turns 503
            logger.exception("engine step failed; the engine is dead")
            with self._cond:
                self.error = exc
                pending = list(self._pending)
                self._pending.clear()
            for request in pending:
                if not request.future.done():
                    request.future.set_exception(RuntimeError(f"engine is dead: {exc!r}"))
