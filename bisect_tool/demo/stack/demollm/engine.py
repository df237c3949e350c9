"""Continuous batching, shaped like vLLM's V1 scheduler.

Each step schedules one decode token for every running request, then admits waiting requests
(whole prompts: no chunked prefill) while the token budget and ``max_num_seqs`` allow, and runs
the model once over all the step's tokens. So the size of a step, and with it the RMSNorm launch
size, depends on when requests arrive: the same workload forms different steps in different
repeats.

Each step also lasts a modelled time on a modelled device (``DeviceTiming``: a launch overhead
plus a cost per token, like a GPU step), the loop sleeping out whatever the CPU did not use, and
a step admits the requests that arrived before it started on that device's clock. How steps
form then depends on when requests arrive against that clock, not on how fast this CPU is or
what else runs on it.

Two things could still let the machine in, and both are counted and exposed in /metrics:

- a request that reaches the engine after a step that started later than its arrival was
  formed (a late arrival: a client's timer or an HTTP thread waited for a core). A client that
  says when each request was meant to arrive (the probe's X-Bisect-Arrival) gets the device run
  ``admission_lag_ms`` behind real time while its requests are in: a step is formed only once
  its start lies that far in the past, so requests that took up to that long to come in still
  join the step they arrived for. Steps then form from the arrival times alone;
- a step whose compute outlasts its modelled time (an overrun): its answers come late, but the
  device clock does not stretch with it, so the batches still form as modelled.

Three switches a vLLM server has too, each changing the numbers in its own way (``EngineOptions``):

- CUDA graphs (on unless ``--enforce-eager``): the first ``warmup_steps`` steps after start run
  before the graphs are captured, on the JIT path (``DemoModel.forward(warmup=True)``), so the
  first request after start-up answers differently from the same request later (vLLM #33537);
- the FlashInfer sampler (``VLLM_USE_FLASHINFER_SAMPLER=1``): the step's logprob rows are
  renormalised together, and from ``SAMPLER_SPLIT_ROWS`` rows on the kernel tiles the vocabulary
  (``flashinfer_renorm``): a row's last bits depend on how many requests share its step, with
  the invariance switch on too. #51187's reporters saw their divergence go with the flag at 0;
- prefix caching (``--enable-prefix-caching``): a prompt whose leading blocks an earlier
  request computed starts from those blocks' running sums (vLLM #40896, #42019: the first
  request differs from later ones).
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from demollm.model import DemoModel, Segment


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
    # The client said when it meant the request to arrive (the arrival is its time, not ours):
    # the engine then holds its steps behind real time for requests that come in late.
    declared_arrival: bool = False
    outputs: list[TokenOutput] = field(default_factory=list)
    segment: Segment | None = None
    future: Future[Request] = field(default_factory=Future)


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 128
    max_num_batched_tokens: int = 2048


# Steps before "the CUDA graphs are captured": vLLM's first one or two requests after start-up
# differ from later ones (#33537); two steps cover a first request's prefill and first decode.
WARMUP_STEPS = 2
# From this many rows in a step on, the FlashInfer-like sampler tiles the vocabulary.
SAMPLER_SPLIT_ROWS = 8
# Prefix caching keeps the running sums at every multiple of this many tokens (vLLM's block).
PREFIX_BLOCK = 16
# Cached prefixes kept (oldest dropped first): far more than any probe's workload holds.
PREFIX_CACHE_ENTRIES = 4096


@dataclass(frozen=True)
class EngineOptions:
    """The switches of ``LLMEngine`` that vLLM has too (defaults: all off, as the tests and the
    engine's Python API always had it; the server turns CUDA graphs on unless
    ``--enforce-eager``, as vLLM does)."""

    warmup_steps: int = 0  # steps on the JIT path after start (CUDA graphs on: WARMUP_STEPS)
    flashinfer_sampler: bool = False
    prefix_caching: bool = False


def flashinfer_renorm(rows: list[np.ndarray]) -> list[np.ndarray]:
    """The sampler's renormalisation of a step's logprob rows: each row minus its
    log-sum-exp, computed over the whole vocabulary below ``SAMPLER_SPLIT_ROWS`` rows and over
    two tiles of it (a third and the rest) from there on: the same row rounds differently in a
    small step and a large one."""
    if not rows:
        return rows
    tiled = len(rows) >= SAMPLER_SPLIT_ROWS
    out = []
    for lp in rows:
        e = np.exp(lp)
        if tiled:
            cut = len(lp) // 3
            total = np.float32(e[:cut].sum(dtype=np.float32) + e[cut:].sum(dtype=np.float32))
        else:
            total = e.sum(dtype=np.float32)
        out.append((lp - np.log(total)).astype(np.float32))
    return out


@dataclass(frozen=True)
class DeviceTiming:
    """How long one engine step lasts on the modelled device.

    The defaults are GPU-like (a fixed launch overhead dominating small steps, a small cost per
    token) and leave this CPU's compute a wide margin: a 300-token step computes in about 9 ms
    on one core of the 2-core CI machine and lasts 35 ms here. Zero for both: steps last as long
    as the CPU takes (no clock, never an overrun).

    ``admission_lag_ms``: how far behind real time the device runs while requests that declared
    their arrival are in (``EngineLoop``): the longest a request may take from its declared
    arrival to the engine and still join the step it arrived for. It delays answers by that
    much once per busy period, not per step.
    """

    launch_overhead_ms: float = 20.0
    per_token_ms: float = 0.05
    admission_lag_ms: float = 100.0

    def __post_init__(self) -> None:
        if self.launch_overhead_ms < 0 or self.per_token_ms < 0 or self.admission_lag_ms < 0:
            raise ValueError("step times must be >= 0")

    @property
    def enabled(self) -> bool:
        return self.launch_overhead_ms > 0 or self.per_token_ms > 0

    def step_seconds(self, tokens: int) -> float:
        return (self.launch_overhead_ms + self.per_token_ms * tokens) / 1000.0


# Bucket bounds of vllm:iteration_tokens_total (tokens per engine step).
STEP_BUCKETS = (1, 8, 16, 32, 64, 128, 255, 256, 512, 1024, 2048, 4096)


class LLMEngine:
    """The scheduler and the model; ``step()`` runs one engine step (tests drive it directly)."""

    def __init__(
        self, model: DemoModel, config: SchedulerConfig, options: EngineOptions | None = None
    ) -> None:
        self.model = model
        self.config = config
        self.options = options if options is not None else EngineOptions()
        # prefix caching: the first p tokens of a prompt -> their running sums per layer
        self.prefix_cache: dict[tuple[int, ...], list[np.ndarray]] = {}
        self.prefix_hits = 0  # prompt tokens taken from the cache (vllm:prefix_cache_hits)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.steps = 0
        self.step_sizes: list[int] = []  # tokens per step (kept for tests and the metrics)
        self.bucket_counts = [0] * (len(STEP_BUCKETS) + 1)
        self._ids = itertools.count()

    def make_request(
        self,
        prompt: list[int],
        max_tokens: int,
        logprobs: int = 0,
        arrival: float | None = None,
        declared: bool = False,
    ) -> Request:
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
        request = Request(f"cmpl-{next(self._ids)}", list(prompt), max_tokens, logprobs)
        if arrival is not None:
            request.arrival = arrival
        request.declared_arrival = declared
        return request

    def add_request(self, request: Request) -> None:
        self.waiting.append(request)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def step(self, admit_until: float | None = None) -> list[Request]:
        """One engine step; returns the requests that finished in it.

        ``admit_until``: only requests that arrived by then (``time.monotonic()``) may join, the
        start of this step on the device clock (``EngineLoop``); None admits all waiting ones.
        """
        scheduled: list[Request] = list(self.running)
        budget = self.config.max_num_batched_tokens - len(scheduled)
        admitted: list[Request] = []
        while self.waiting and len(scheduled) + len(admitted) < self.config.max_num_seqs:
            request = self.waiting[0]
            cached = self._cached_prefix(request.prompt)
            if len(request.prompt) - cached > budget:
                break
            if admit_until is not None and request.arrival > admit_until:
                break
            self.waiting.popleft()
            budget -= len(request.prompt) - cached
            request.segment = self._new_segment(request.prompt, cached)
            admitted.append(request)
        scheduled += admitted
        if not scheduled:
            return []
        segments = []
        for request in scheduled:
            assert request.segment is not None
            if request in admitted:
                new = request.prompt[request.segment.count:]
            else:
                new = [request.outputs[-1].token_id]
            request.segment.tokens = np.asarray(new, dtype=np.int64)
            segments.append(request.segment)
        warmup = self.steps < self.options.warmup_steps
        logprobs = self.model.forward(segments, warmup=warmup)
        if self.options.flashinfer_sampler:
            logprobs = flashinfer_renorm(logprobs)
        for request in admitted:
            self._keep_prefix(request)
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

    # -- prefix caching -------------------------------------------------------------------------

    def _cached_prefix(self, prompt: list[int]) -> int:
        """How many leading tokens of ``prompt`` the cache holds (whole blocks, never the whole
        prompt: its last token is computed, as vLLM recomputes it); 0 with caching off."""
        if not self.options.prefix_caching:
            return 0
        p = (len(prompt) - 1) // PREFIX_BLOCK * PREFIX_BLOCK
        while p > 0 and tuple(prompt[:p]) not in self.prefix_cache:
            p -= PREFIX_BLOCK
        return p

    def _new_segment(self, prompt: list[int], cached: int) -> Segment:
        if cached:
            self.prefix_hits += cached
            sums = [s.copy() for s in self.prefix_cache[tuple(prompt[:cached])]]
        else:
            sums = self.model.new_sums()
        snap_at: tuple[int, ...] = ()
        if self.options.prefix_caching:
            snap_at = tuple(range(cached + PREFIX_BLOCK, len(prompt) + 1, PREFIX_BLOCK))
        return Segment(np.array([], dtype=np.int64), sums, cached, snap_at)

    def _keep_prefix(self, request: Request) -> None:
        segment = request.segment
        if segment is None or not segment.snapshots:
            return
        for p, sums in segment.snapshots.items():
            self.prefix_cache[tuple(request.prompt[:p])] = sums
        segment.snapshots = {}
        segment.snap_at = ()
        while len(self.prefix_cache) > PREFIX_CACHE_ENTRIES:
            del self.prefix_cache[next(iter(self.prefix_cache))]


def _sample(logprobs: np.ndarray, k: int) -> TokenOutput:
    """Greedy (argmax: ties go to the lowest id); the top k sorted by logprob, then id."""
    token = int(np.argmax(logprobs))
    top: list[tuple[int, float]] = []
    if k > 0:
        ids = np.argpartition(logprobs, -k)[-k:]
        ids = ids[np.lexsort((ids, -logprobs[ids]))]
        top = [(int(t), float(logprobs[t])) for t in ids]
    return TokenOutput(token, float(logprobs[token]), top)
