"""The server determinism probe: does one lifetime answer a byte-identical workload identically?

What a careful human did by hand in vLLM issue 51187, unattended: M requests sharing a prefix
plus F unrelated fillers, all in flight at once, a discarded priming pass, then R repeats in the
same order, every pair of repeats compared bitwise (see ``compare``), while ``/metrics`` is
polled to show the batch the bug needs (~44 co-resident sequences there) actually formed, and
scraped before and after each repeat for the largest engine step it took (the histogram
``vllm:iteration_tokens_total``: the seed bug needs a step of >= 256 tokens).

Verdicts (the policy is ``server_verdict``, the ``/metrics`` poller ``monitor``): a differing
pair -> DIVERGENT; none, and every repeat reached the target co-residency -> CLEAN; none but the
target was missed -> INCONCLUSIVE (a lifetime that never formed the batch says nothing about the
bug); the server died or rejected the probe -> UNTESTABLE (never DIVERGENT). A request that
fails mid-repeat (dropped connection, 5xx, timeout) on a live server invalidates that repeat
only: it is run again, up to ``max_attempts`` times.
"""

from __future__ import annotations

import asyncio
import copy
import random
import secrets
import ssl
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from bisect_tool.interfaces import ProbeResult, ServerHandle
from bisect_tool.probes.apart import notes, pairs_apart
from bisect_tool.probes.compare import (
    Sample,
    compare_repeats,
)
from bisect_tool.probes.metrics import StepBucket, largest_step
from bisect_tool.probes.monitor import MetricsMonitor
from bisect_tool.probes.server_http import (
    PREFIX_CACHE_HITS,
    RepeatFailed,
    Untestable,
    counter,
    device_clock,
    resolve_model,
    send,
    step_detail,
    why_dead,
)
from bisect_tool.probes.server_verdict import decide, target_coresidency, validate_settings
from bisect_tool.probes.workload import Workload, build_workload, fresh_prompt, request_body
from bisect_tool.recipes.recipe import ProbeSettings
from bisect_tool.values import Verdict


class ServerDeterminismProbe:
    """Runs the workload against one lifetime and returns its verdict (``ServerProbe``).

    ``http_client`` is used for the completions when given (its connection limit must allow
    M+F connections, or the batch cannot form); by default a client sized to the workload is
    made per run. ``sequential`` submits one request at a time: the negative control.
    ``rng_seed`` seeds the arrival jitter; by default each run draws a fresh one (kept in the
    detail as ``jitter_seed``), so lifetimes are independent draws of the workload, which is
    what the search's per-lifetime rate p assumes. One seed for every lifetime would leave only
    the machine's timing noise to tell lifetimes apart, and p would be the machine's.
    """

    def __init__(
        self,
        settings: ProbeSettings,
        http_client: httpx.AsyncClient | None = None,
        model: str | None = None,
        rng_seed: int | None = None,
        sequential: bool = False,
        max_attempts: int = 3,
        poll_interval_s: float = 0.02,
    ) -> None:
        validate_settings(settings)
        self.settings = settings
        self.http_client = http_client
        self.model = model
        self.rng_seed = rng_seed
        self._jitter_seed = 0 if rng_seed is None else rng_seed
        self.sequential = sequential
        self.max_attempts = max_attempts
        self.poll_interval_s = poll_interval_s
        s = settings
        self.part: tuple[int, int] | None = None  # (index, of how many): ``split``
        self.workload: Workload = build_workload(
            s.requests, s.fillers, s.prefix_tokens, s.prompt_tokens, s.filler_tokens,
            s.vocab_size, s.seed,
        )

    @property
    def target(self) -> int:
        return target_coresidency(self.settings, self.sequential)

    def split(self, parts: int) -> list[ServerDeterminismProbe]:
        """The workload's requests dealt in turn over ``parts`` probes, for as many servers of
        one candidate (the negative control spread over servers: ``probes.controls``). Each
        request is still sent alone, after its own priming pass, and compared with itself over
        the same repeats on one server: the comparisons are the ones one probe makes, in
        ``parts`` times less time (on the H100 the sequential pass took 119 s, the longest
        thing in the run: issue 39)."""
        out = []
        for part in range(max(1, min(parts, self.workload.size))):
            probe = copy.copy(self)
            prompts = self.workload.prompts[part::parts]
            shared = len(range(part, self.workload.shared, parts))
            probe.workload = Workload(prompts=prompts, shared=shared)
            probe.part = (part, parts)
            out.append(probe)
        return out

    def run(self, server: ServerHandle, is_alive: Callable[[], bool] | None = None) -> ProbeResult:
        return asyncio.run(self.run_async(server, is_alive))

    async def run_async(
        self, server: ServerHandle, is_alive: Callable[[], bool] | None = None
    ) -> ProbeResult:
        started = time.monotonic()
        url = server.url.rstrip("/")
        s = self.settings
        self._jitter_seed = secrets.randbits(32) if self.rng_seed is None else self.rng_seed
        detail: dict[str, Any] = {
            "url": url,
            "lifetime_id": server.lifetime_id,
            "mode": "sequential" if self.sequential else "concurrent",
            "requests": s.requests,
            "fillers": s.fillers,
            "prompt_tokens_total": self.workload.prompt_tokens,
            **({"part": list(self.part), "requests_sent": self.workload.size}
               if self.part else {}),
            "max_tokens": s.max_tokens,
            "logprobs": s.logprobs,
            "jitter_ms": 0.0 if self.sequential else s.jitter_ms,
            "jitter_seed": self._jitter_seed,
            "target_coresidency": self.target,
            "redone_repeats": 0,
            "redo_reasons": [],
        }
        n = self.workload.size
        timeout = httpx.Timeout(s.request_timeout_s, connect=10.0)
        owned: list[httpx.AsyncClient] = []
        if self.http_client is not None:
            control, slots = self.http_client, [self.http_client] * n
        else:
            # One client (one keep-alive connection) per request slot: a single client's
            # httpcore pool rescans every connection on each request event, O(n^2) CPU per
            # pass (~10 ms per request at 44 in flight on 2 cores, bench/probe_bench.py), which
            # spread the submissions so far apart that the batch never formed.
            # trust_env=False: the probe talks only to the server under test; a proxy from the
            # environment must never sit between it and a loopback server.
            tls = ssl.create_default_context()  # shared: one per client costs ~10 ms each

            def make(k: int) -> httpx.AsyncClient:
                return httpx.AsyncClient(
                    timeout=timeout, trust_env=False, verify=tls,
                    limits=httpx.Limits(max_connections=k, max_keepalive_connections=k),
                )

            control, slots = make(4), [make(1) for _ in range(n)]
            owned = [control, *slots]
        try:
            verdict, message = await self._run(control, slots, url, is_alive, detail)
        except Untestable as exc:
            verdict, message = Verdict.UNTESTABLE, str(exc)
        finally:
            for c in owned:
                await c.aclose()
        detail["duration_s"] = round(time.monotonic() - started, 3)
        return ProbeResult(verdict=verdict, detail=detail, message=message)

    async def _run(
        self,
        client: httpx.AsyncClient,
        slots: Sequence[httpx.AsyncClient],
        url: str,
        is_alive: Callable[[], bool] | None,
        detail: dict[str, Any],
    ) -> tuple[Verdict, str]:
        s = self.settings
        model = self.model or await resolve_model(client, url, is_alive)
        detail["model"] = model
        detail["comparison"] = "repeats"
        bodies = [request_body(p, model, s.max_tokens, s.logprobs) for p in self.workload.prompts]
        repeats: list[list[Sample]] = []
        peaks: list[int | None] = []
        steps: list[StepBucket | None] = []
        first = await self._first_after_start(client, slots, url, bodies, is_alive, detail)
        with MetricsMonitor(url, self.poll_interval_s) as monitor:
            # The priming pass is byte-identical traffic whose output is discarded: in the seed
            # it removed a separate first-batch effect, so repeat 0 is not the server's first
            # sight of this workload.
            for label in ["priming", *range(s.repeats)]:
                samples, peak, step = await self._attempts(
                    client, slots, url, bodies, label, monitor, is_alive, detail
                )
                if label == "priming":
                    detail["priming_coresidency"] = peak
                    detail["priming_step_tokens"] = step_detail(step)
                    continue
                repeats.append(samples)
                peaks.append(peak)
                steps.append(step)
        await self._apart(client, slots, url, bodies, first, is_alive, detail)
        comparison = compare_repeats(repeats)
        detail.update(comparison.to_detail())
        detail["coresidency_per_repeat"] = peaks
        known = [p for p in peaks if p is not None]
        detail["max_coresidency"] = max(known, default=None)
        detail["target_reached_repeats"] = sum(1 for p in known if p >= self.target)
        detail["step_tokens_per_repeat"] = [step_detail(b) for b in steps]
        seen = [b for b in steps if b is not None]
        detail["max_step_tokens"] = step_detail(max(seen, key=lambda b: b.at_most, default=None))
        detail["metrics_samples"] = monitor.samples
        detail.update(await device_clock(client, url))
        verdict, message = decide(comparison, peaks, self.target)
        return verdict, message + self._notes(detail)

    def _notes(self, detail: dict[str, Any]) -> str:
        return notes(detail)

    # -- reported apart: the first requests after start-up, prefix caching cold and warm ------

    async def _one_by_one(
        self,
        client: httpx.AsyncClient,
        slots: Sequence[httpx.AsyncClient],
        url: str,
        bodies: Sequence[bytes],
        label: str,
        is_alive: Callable[[], bool] | None,
        detail: dict[str, Any],
    ) -> list[Sample]:
        """``bodies`` sent one at a time, each once the previous one answered (batch size 1);
        a transient failure sends them again, up to ``max_attempts`` times."""
        reason = ""
        for _ in range(self.max_attempts):
            if is_alive is not None and not is_alive():
                raise Untestable(f"server process exited before {label}")
            try:
                return [await send(slots[i % len(slots)], url, body, None)
                        for i, body in enumerate(bodies)]
            except RepeatFailed as exc:
                reason = str(exc)
                detail["redone_repeats"] += 1
                detail["redo_reasons"].append(f"{label}: {reason}")
                dead = await why_dead(client, url, is_alive)
                if dead:
                    raise Untestable(f"server failed during {label} ({reason}); {dead}") from None
        raise Untestable(
            f"{label} failed {self.max_attempts} times on a live server; last: {reason}"
        )

    async def _first_after_start(
        self,
        client: httpx.AsyncClient,
        slots: Sequence[httpx.AsyncClient],
        url: str,
        bodies: Sequence[bytes],
        is_alive: Callable[[], bool] | None,
        detail: dict[str, Any],
    ) -> list[Sample]:
        """The first ``warmup_requests`` prompts alone, before anything else reaches the
        server: what a compiled server answers while it warms up (vLLM #33537)."""
        n = min(self.settings.warmup_requests, len(bodies))
        if n == 0:
            return []
        return await self._one_by_one(client, slots, url, bodies[:n], "the warm-up requests",
                                      is_alive, detail)

    async def _apart(
        self,
        client: httpx.AsyncClient,
        slots: Sequence[httpx.AsyncClient],
        url: str,
        bodies: Sequence[bytes],
        first: Sequence[Sample],
        is_alive: Callable[[], bool] | None,
        detail: dict[str, Any],
    ) -> None:
        """After the workload: the warm-up requests alone again, compared with their first
        answers (``detail["warmup"]``); and, where the recipe asks, a prompt never sent before,
        alone twice: prefix caching cold, then warm (``detail["prefix_cache"]``). Neither
        changes the verdict: they are what a maintainer must not mistake for the bug."""
        if first:
            later = await self._one_by_one(client, slots, url, bodies[: len(first)],
                                           "the warm-up requests again", is_alive, detail)
            detail["warmup"] = pairs_apart(first, later, "requests")
        if not self.settings.prefix_cache_check:
            return
        s = self.settings
        prompt = fresh_prompt(s.prefix_tokens + s.prompt_tokens, s.vocab_size, s.seed)
        body = request_body(prompt, str(detail.get("model") or ""), s.max_tokens, s.logprobs)
        before = await counter(client, url, PREFIX_CACHE_HITS)
        cold, warm = await self._one_by_one(client, slots, url, [body, body],
                                            "the prefix-cache check", is_alive, detail)
        after = await counter(client, url, PREFIX_CACHE_HITS)
        found = pairs_apart([cold], [warm], "prompts")
        detail["prefix_cache"] = {
            "prompt_tokens": len(prompt),
            "differs": bool(found["differing"]),
            "max_abs_logprob_delta": found["max_abs_logprob_delta"],
            "tokens_moved": found["tokens_moved"],
            # None: the server does not count them; 0: prefix caching is off there, so cold
            # and warm were the same computation
            "hit_tokens": None if before is None or after is None else int(after - before),
        }

    async def _attempts(
        self,
        client: httpx.AsyncClient,
        slots: Sequence[httpx.AsyncClient],
        url: str,
        bodies: Sequence[bytes],
        label: str | int,
        monitor: MetricsMonitor,
        is_alive: Callable[[], bool] | None,
        detail: dict[str, Any],
    ) -> tuple[list[Sample], int | None, StepBucket | None]:
        if is_alive is not None and not is_alive():
            raise Untestable(f"server process exited before {_name(label)}")
        reason = ""
        for attempt in range(self.max_attempts):
            # The server is idle here (the previous pass was awaited whole), so the histogram's
            # growth between these two scrapes is this attempt's steps and nothing else.
            before = await asyncio.to_thread(monitor.snapshot)
            monitor.begin()
            try:
                delays = self._delays(label, attempt)[: len(bodies)]
                samples = await self._pass(slots, url, bodies, delays)
            except RepeatFailed as exc:
                monitor.end()
                reason = str(exc)
                detail["redone_repeats"] += 1
                detail["redo_reasons"].append(f"{_name(label)}: {reason}")
                dead = await why_dead(client, url, is_alive)
                if dead:
                    # A live process whose /health answers 5xx did not die: say what it did.
                    how = "failed" if dead.startswith("/health answered") else "died"
                    raise Untestable(
                        f"server {how} during {_name(label)} ({reason}); {dead}"
                    ) from None
                continue
            peak = monitor.end()
            after = await asyncio.to_thread(monitor.snapshot)
            return samples, peak, largest_step(before, after)
        raise Untestable(
            f"{_name(label)} failed {self.max_attempts} times on a live server; last: {reason}"
        )

    def _delays(self, label: str | int, attempt: int) -> list[float]:
        if self.sequential or self.settings.jitter_ms <= 0:
            return [0.0] * self.workload.size
        # Seeded, and different per repeat and attempt: the jitter varies how engine steps
        # form, which is what exposes the bug on a fast GPU that would otherwise admit the
        # whole burst in one step every time.
        seed = f"bisect-jitter:{self.settings.seed}:{self._jitter_seed}:{label}:{attempt}"
        rng = random.Random(seed)
        high = self.settings.jitter_ms / 1000.0
        return [rng.uniform(0.0, high) for _ in range(self.workload.size)]

    async def _pass(
        self,
        slots: Sequence[httpx.AsyncClient],
        url: str,
        bodies: Sequence[bytes],
        delays: Sequence[float],
    ) -> list[Sample]:
        if self.sequential:
            return [await send(c, url, b, None) for c, b in zip(slots, bodies, strict=True)]
        start = time.monotonic()
        tasks = [
            asyncio.create_task(send(c, url, body, start + delay))
            for c, body, delay in zip(slots, bodies, delays, strict=True)
        ]
        # Every request is awaited even when one fails, so the server is idle again before the
        # repeat is redone (leftover requests would distort the next attempt's batches).
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for r in results:
            if isinstance(r, Untestable):
                raise r
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return [r for r in results if isinstance(r, Sample)]


def _name(label: str | int) -> str:
    if label == "priming":
        return "the priming pass"
    return f"repeat {label}" if isinstance(label, int) else label

