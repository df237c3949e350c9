"""One server's HTTP endpoints as the determinism probe asks them: completions (sent at a
declared arrival time), /v1/models, /health and the counters of /metrics. A failure that may be
transient invalidates the repeat (``RepeatFailed``); one that says the lifetime cannot answer at
all makes it untestable (``Untestable``)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable

import httpx

from bisect_tool.probes.compare import ResponseFormatError, Sample, parse_completion
from bisect_tool.probes.metrics import (
    ARRIVAL_DELAY_MAX,
    LATE_ARRIVALS,
    STEP_OVERRUNS,
    MetricsFormatError,
    StepBucket,
    parse,
)

#: the request's intended arrival (CLOCK_MONOTONIC seconds, shared by the processes of a host)
ARRIVAL_HEADER = "X-Bisect-Arrival"
#: vLLM's counter of prompt tokens served from the prefix cache (its family name)
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits"


class RepeatFailed(Exception):
    """A request failed in a way that may be transient: the repeat is invalid, not the lifetime."""


class Untestable(Exception):
    """The lifetime cannot answer the probe at all (dead server, rejected or malformed request)."""


async def counter(client: httpx.AsyncClient, url: str, name: str) -> float | None:
    try:
        resp = await client.get(url + "/metrics", timeout=10.0)
        return parse(resp.text).value(name) if resp.status_code == 200 else None
    except (httpx.HTTPError, MetricsFormatError):
        return None


async def device_clock(
    client: httpx.AsyncClient, url: str
) -> dict[str, int | float | None]:
    """What the server says of its modelled device clock (demollm's), as detail fields:
    steps that overran their modelled time, requests that came in too late for their step,
    the longest hand-over of a declared arrival (seconds). None each when it does not say
    (vLLM: its steps take what the GPU takes)."""
    overruns = late = delay = None
    try:
        resp = await client.get(url + "/metrics", timeout=10.0)
        if resp.status_code == 200:
            page = parse(resp.text)
            overruns, late = page.value(STEP_OVERRUNS), page.value(LATE_ARRIVALS)
            delay = page.value(ARRIVAL_DELAY_MAX)
    except (httpx.HTTPError, MetricsFormatError):
        pass
    return {
        "step_overruns": None if overruns is None else int(overruns),
        "late_arrivals": None if late is None else int(late),
        "max_arrival_delay_s": None if delay is None else round(delay, 4),
    }


async def send(
    client: httpx.AsyncClient, url: str, body: bytes, at: float | None
) -> Sample:
    """POST one request at ``at`` (time.monotonic(); None: now). The header says when it
    was meant to arrive: the demo engine admits it by that time on its device clock, so a
    late timer here or a busy HTTP thread there does not change how steps form (issue 12).
    vLLM ignores the header."""
    headers = {"content-type": "application/json"}
    if at is not None:
        wait = at - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        headers[ARRIVAL_HEADER] = f"{at:.6f}"
    try:
        resp = await client.post(url + "/v1/completions", content=body, headers=headers)
    except httpx.TimeoutException as exc:
        raise RepeatFailed(f"request timed out ({type(exc).__name__})") from None
    except httpx.TransportError as exc:
        raise RepeatFailed(f"{type(exc).__name__}: {exc}") from None
    if resp.status_code >= 500:
        raise RepeatFailed(f"HTTP {resp.status_code}: {resp.text[:200]}")
    if resp.status_code >= 400:
        raise Untestable(
            f"the server rejected the probe request (HTTP {resp.status_code}): "
            f"{resp.text[:300]}; check the model name and --max-model-len"
        )
    try:
        return parse_completion(resp.json())
    except (ResponseFormatError, json.JSONDecodeError) as exc:
        raise Untestable(f"unexpected completion response: {exc}") from None


async def resolve_model(
    client: httpx.AsyncClient, url: str, is_alive: Callable[[], bool] | None
) -> str:
    try:
        resp = await client.get(url + "/v1/models", timeout=10.0)
        if resp.status_code != 200:
            raise Untestable(
                f"{url}/v1/models answered HTTP {resp.status_code}: "
                f"{resp.text[:200].strip() or '(empty body)'}"
            )
        data = resp.json()["data"]
        return str(data[0]["id"])
    except httpx.TransportError as exc:
        dead = await why_dead(client, url, is_alive)
        raise Untestable(
            f"cannot reach the server at {url} ({type(exc).__name__})"
            + (f"; {dead}" if dead else "")
        ) from None
    except (KeyError, IndexError, TypeError, ValueError):
        raise Untestable(
            f"{url}/v1/models lists no model; pass the model name (--model)"
        ) from None


async def why_dead(
    client: httpx.AsyncClient, url: str, is_alive: Callable[[], bool] | None
) -> str:
    """Why the server is dead, or "" when it still answers /health."""
    last = ""
    for attempt in range(3):
        if attempt:
            await asyncio.sleep(0.2)  # between the asks; none after the last one
        if is_alive is not None and not is_alive():
            return "the server process exited"
        try:
            resp = await client.get(url + "/health", timeout=5.0)
            if resp.status_code == 200:
                return ""
            last = f"/health answered HTTP {resp.status_code}"
        except httpx.HTTPError as exc:
            last = f"/health unreachable ({type(exc).__name__})"
    return last


def step_detail(bucket: StepBucket | None) -> list[float | str] | None:
    return None if bucket is None else bucket.to_detail()
