"""``/metrics`` during a repeat: the peak co-residency (``vllm:num_requests_running``, polled
from a thread of its own) and whole scrapes on demand (the step histogram before and after)."""

from __future__ import annotations

import threading
import time

import httpx

from bisect_tool.probes.metrics import MetricsFormatError, Scrape, gauge_sum, parse


class MetricsMonitor:
    """Polls GET /metrics every ``interval`` seconds; keeps the peak of the active repeat.

    A thread with its own blocking client, not a task on the probe's event loop: while the loop
    is busy submitting and parsing a 44-request burst, a task would sample late and could miss
    a short-lived batch entirely. ``snapshot`` is a separate scrape on demand (its own client,
    so it never waits on the poller), for the step histogram before and after a repeat.
    """

    def __init__(self, url: str, interval: float) -> None:
        self.url, self.interval = url, interval
        self.active = False
        self.peak: float | None = None
        self.samples = 0
        self.errors = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bisect-metrics", daemon=True)
        self._snapshots = httpx.Client(timeout=5.0, trust_env=False)

    def __enter__(self) -> MetricsMonitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._snapshots.close()

    def snapshot(self) -> Scrape | None:
        """The whole page now, or None when it cannot be had (the step bucket is then unknown)."""
        try:
            resp = self._snapshots.get(self.url + "/metrics")
            return parse(resp.text) if resp.status_code == 200 else None
        except (httpx.HTTPError, MetricsFormatError):
            return None

    def begin(self) -> None:
        with self._lock:
            self.active, self.peak = True, None

    def end(self) -> int | None:
        with self._lock:
            self.active = False
            return None if self.peak is None else int(round(self.peak))

    def _loop(self) -> None:
        with httpx.Client(timeout=5.0, trust_env=False) as client:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    resp = client.get(self.url + "/metrics")
                    value = gauge_sum(resp.text) if resp.status_code == 200 else None
                except httpx.HTTPError:
                    value = None
                with self._lock:
                    if value is None:
                        self.errors += 1
                    elif self.active:
                        self.samples += 1
                        self.peak = value if self.peak is None else max(self.peak, value)
                self._stop.wait(max(0.0, self.interval - (time.monotonic() - started)))
