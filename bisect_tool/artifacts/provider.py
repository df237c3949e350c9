"""The ArtifactProvider: cache first, then the recipe's sources in order; a bounded lookahead in
the background (mozregression's habit: fetch the next candidates while one is being probed).

What the run needs now is a *demand* (``get``): it is fetched in the caller's thread, ahead of
any lookahead. The *lookahead* (``prefetch``) is at most ``lookahead`` commits, fetched one at a
time by one worker (one build machine), and only once the demand it follows has its artifact:
it overlaps the probe, never the demanded build. Each ``prefetch`` replaces the last: a queued
fetch it drops is cancelled; a running one it drops is stopped at the next demand for another
commit (a demand for that commit adopts it), or at ``close``. A lookahead *build* starts only
while builds <= demands + lookahead, so a run builds at most K more than it runs (issue 31):
a guess the search moved away from costs at most that.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path

from bisect_tool.artifacts.build import Cancelled, SourceBuild, Ticket
from bisect_tool.artifacts.cache import ArtifactCache
from bisect_tool.artifacts.download import Downloader
from bisect_tool.artifacts.sources import CommitFacts, Source, WheelIndexSource, swap_files_in
from bisect_tool.errors import AbortError, ArtifactUnavailable, BuildFailed, UsageError
from bisect_tool.interfaces import SwapSet
from bisect_tool.values import short

#: the lookahead when a recipe leaves ``[artifacts] prefetch`` to the run: both outcomes of the
#: candidate under test (the run picks fewer by its costs: bisect_tool.strategy.lookahead)
DEFAULT_LOOKAHEAD = 2


@dataclasses.dataclass
class _Job:
    """One lookahead fetch: queued until the worker starts it, then running, then finished."""

    commit: str
    tags: tuple[str, ...]
    ticket: Ticket
    result: Future[SwapSet] = dataclasses.field(default_factory=Future)
    started: bool = False


@dataclasses.dataclass(frozen=True)
class Counts:
    """What this provider did: demands (``get`` calls: one per run of a candidate), source
    builds started (demanded or lookahead), lookahead fetches cancelled, and lookahead builds
    the budget deferred (each then built on demand, if the demand came)."""

    demands: int
    builds: int
    cancelled: int
    deferred: int


class CachingProvider:
    """Implements ``bisect_tool.interfaces.ArtifactProvider``. Use as a context manager (or call
    ``close``): it owns the lookahead's worker thread and, unless one was injected, an HTTP
    client. ``close`` stops every fetch still running (a build's process group is killed)."""

    def __init__(
        self,
        cache: ArtifactCache,
        swap_set: Sequence[str],
        sources: Sequence[Source],
        *,
        downloader: Downloader | None = None,
        progress: Callable[[str], None] | None = None,
        on_close: Callable[[], None] | None = None,
        package: str = "",
        lookahead: int = DEFAULT_LOOKAHEAD,
        facts: Callable[[str], CommitFacts] | None = None,
    ) -> None:
        if not swap_set:
            raise UsageError("the recipe's [artifacts] swap_set is empty; list the files to swap")
        self.cache = cache
        self.swap_set = tuple(swap_set)
        self.sources = list(sources)
        self.downloader = downloader
        self.progress = progress or (lambda _msg: None)
        self._on_close = on_close
        self.package = package  # release tags of a commit also find the release's cached files
        self.lookahead = max(0, lookahead)
        # what the range knows of a commit (on the main line? when committed?): the wheel
        # index says why it has no wheel with it
        self.facts = facts or (lambda _commit: CommitFacts())
        self._cond = threading.Condition()
        self._jobs: dict[str, _Job] = {}  # the lookahead: commit -> its fetch, in order
        self._orphans: list[_Job] = []  # running fetches the last prefetch dropped
        self._failed: dict[str, _Job] = {}  # lookahead fetches that failed: the demand's answer
        self._live: set[Ticket] = set()  # every fetch under way, demanded ones too
        self._armed = False  # a demand completed since the last prefetch
        self._demanding = 0
        self._closed = False
        self._worker: threading.Thread | None = None
        self._busy: _Job | None = None  # the lookahead fetch the worker runs now
        self._demands = 0
        self._builds = 0
        self._cancelled = 0
        self._deferred = 0

    @property
    def bytes_downloaded(self) -> int:
        return self.downloader.bytes_received if self.downloader else 0

    @property
    def counts(self) -> Counts:
        with self._cond:
            return Counts(self._demands, self._builds, self._cancelled, self._deferred)

    # --- ArtifactProvider ------------------------------------------------------------------
    def get(self, commit: str, tags: Sequence[str] = ()) -> SwapSet:
        with self._cond:
            self._demands += 1
            self._demanding += 1
            job = self._jobs.pop(commit, None) or self._failed.pop(commit, None)
            if job is not None and not job.started:
                self._cancel(job)  # not begun: it is fetched here, now, ahead of the rest
                job = None
            adopted = [o for o in self._orphans if o.commit == commit]
            if job is None and adopted:
                job = adopted[0]
            # a guess the search moved away from must not build beside what it needs now
            for orphan in self._orphans:
                if orphan is not job:
                    self._cancel(orphan)
            self._orphans = []
        try:
            if job is not None:
                try:
                    # A lookahead failure surfaces here, for the commit it concerns, and
                    # nowhere else.
                    return job.result.result()
                except Cancelled:
                    pass  # stopped or deferred: fetched here instead
            ticket = Ticket(self._count_build)
            with self._cond:
                self._live.add(ticket)
            try:
                return self._get(commit, tuple(tags), ticket)
            except Cancelled:
                # only ``close`` stops a demanded fetch: the run is ending
                raise AbortError(f"the fetch of {short(commit)} was stopped: the run is ending") \
                    from None
            finally:
                with self._cond:
                    self._live.discard(ticket)
        finally:
            with self._cond:
                self._demanding -= 1
                self._armed = True
                self._cond.notify_all()

    def prefetch(self, commits: Sequence[str], tags: Mapping[str, Sequence[str]]) -> None:
        """The lookahead after the next demand: the first ``lookahead`` of ``commits`` not at
        hand, fetched once that demand has its artifact. Replaces the last call's."""
        with self._cond:
            if self._closed:
                return
            wanted: list[str] = []
            for commit in commits:
                if len(wanted) >= self.lookahead:
                    break
                if commit in wanted:
                    continue
                if commit in self._jobs or self._cached(commit, tuple(tags.get(commit, ()))) \
                        is None:
                    wanted.append(commit)
            for commit, job in list(self._jobs.items()):
                if commit in wanted:
                    continue
                del self._jobs[commit]
                if job.started and not job.result.done():
                    self._orphans.append(job)  # stopped at the next demand, unless adopted
                elif not job.started:
                    self._cancel(job)
            for commit in wanted:
                if commit not in self._jobs:
                    self._failed.pop(commit, None)  # asked again: the new answer counts
                    job = _Job(commit, tuple(tags.get(commit, ())), Ticket(self._lookahead_build))
                    self._jobs[commit] = job
            self._armed = False
            if self._jobs and self._worker is None:
                self._worker = threading.Thread(
                    target=self._work, name="bisect-lookahead", daemon=True
                )
                self._worker.start()
            self._cond.notify_all()

    # --- Python sides (``bisect locate``) ---------------------------------------------------
    def python_side(
        self,
        commit: str,
        tags: Sequence[str],
        *,
        key: str,
        package: str,
        clone: Path | None = None,
        index_url: str = "",
    ) -> Path:
        """The package of ``commit`` with its own swap set in place, as a folder the runtime can
        pin (``artifacts.stacks``): cached under ``key``; else from the clone (``git archive``
        of ``package/``), or, without one, from the commit's release wheel on ``index_url``
        (pip's index when "")."""
        from bisect_tool.artifacts import stacks

        swap = self.get(commit, tags)  # its own compiled files (cache first)
        found = stacks.cached_side(self.cache, key)
        if found is not None:
            return found
        if clone is not None:
            return stacks.side_from_git(self.cache, key, clone, commit, package, swap)
        wheel = self.release_wheel(commit, tags, package=package, index_url=index_url)
        return stacks.side_from_wheel(self.cache, key, wheel, swap, self.swap_set)

    def release_wheel(
        self, commit: str, tags: Sequence[str], *, package: str, index_url: str = ""
    ) -> Path:
        """The whole release wheel of the release ``tags`` name (the cache keeps only its swap
        set), downloaded into this provider's scratch folder."""
        from bisect_tool.artifacts.pipindex import pip_index_url
        from bisect_tool.artifacts.release_source import ReleaseSource

        if self.downloader is None:
            raise UsageError("this artifact provider has no downloader to fetch a release wheel")
        source = ReleaseSource(index_url or pip_index_url(), package, self.downloader,
                               self.cache.dirs["downloads"])
        work = Path(tempfile.mkdtemp(dir=self.cache.dirs["tmp"]))
        return source.fetch(commit, tags, work).path

    def settle(self) -> None:
        """Wait until the lookahead has done what it may for now: nothing running, and nothing
        queued that could start (each started one finished, was deferred or cancelled)."""
        with self._cond:
            self._cond.wait_for(lambda: self._closed or (
                self._busy is None and not (self._armed and not self._demanding and any(
                    not j.started and not j.ticket.cancelled for j in self._jobs.values()))))

    # --- the lookahead -----------------------------------------------------------------------
    def _cancel(self, job: _Job) -> None:
        """Under ``_cond``."""
        if not job.ticket.cancelled and not job.result.done():
            self._cancelled += 1
        job.ticket.cancel()

    def _count_build(self) -> bool:
        with self._cond:
            self._builds += 1
        return True

    def _lookahead_build(self) -> bool:
        """A lookahead build may start only while builds <= demands + lookahead."""
        with self._cond:
            if self._closed or self._builds + 1 > self._demands + self.lookahead:
                self._deferred += 1
                return False
            self._builds += 1
            return True

    def _next_job(self) -> _Job | None:
        """Under ``_cond``: the first queued lookahead fetch, once it may start."""
        while not self._closed:
            queued = [j for j in self._jobs.values() if not j.started and not j.ticket.cancelled]
            if queued and self._armed and not self._demanding:
                job = queued[0]
                job.started = True
                self._busy = job
                self._live.add(job.ticket)
                return job
            self._cond.wait()
        return None

    def _work(self) -> None:
        while True:
            with self._cond:
                job = self._next_job()
            if job is None:
                return
            failed = False
            try:
                job.result.set_result(self._get(job.commit, job.tags, job.ticket))
            except (ArtifactUnavailable, BuildFailed) as exc:
                failed = True  # kept for the demand of this commit, if one comes
                job.result.set_exception(exc)
            except BaseException as exc:  # Cancelled, Deferred, or a fault: fetched on demand
                job.result.set_exception(exc)
            finally:
                with self._cond:
                    self._busy = None
                    self._live.discard(job.ticket)
                    if job in self._orphans:
                        self._orphans.remove(job)
                    if self._jobs.get(job.commit) is job:
                        # fetched (the cache has it now) or not: no longer a lookahead slot
                        del self._jobs[job.commit]
                        if failed:
                            self._failed[job.commit] = job
                    self._cond.notify_all()

    # --- the work --------------------------------------------------------------------------
    def _cached(self, commit: str, tags: tuple[str, ...]) -> SwapSet | None:
        cached = self.cache.lookup(commit, self.swap_set)
        if cached is not None or not self.package:
            return cached
        from bisect_tool.artifacts.releases import release_aliases

        # A release tag's commit: a release-level bisect (or `artifacts import --release`) may
        # have cached that release's files already; they are the same bytes.
        for alias in release_aliases(self.package, tags):
            found = self.cache.lookup(alias, self.swap_set)
            if found is not None:
                return dataclasses.replace(found, commit=commit)
        return None

    def _get(self, commit: str, tags: tuple[str, ...], ticket: Ticket) -> SwapSet:
        cached = self._cached(commit, tags)
        if cached is not None:
            return cached
        # One fetch per commit across processes: the second waits here, then finds it cached.
        with self.cache.lock(commit):
            cached = self._cached(commit, tags)
            if cached is not None:
                return cached
            reasons: list[str] = []
            build_failure: BuildFailed | None = None
            for source in self.sources:
                try:
                    return self._from(source, commit, tags, ticket)
                except BuildFailed as exc:
                    build_failure = exc
                    reasons.append(f"{source.name}: {exc.message}")
                except ArtifactUnavailable as exc:
                    reasons.append(f"{source.name}: {exc.message}")
            summary = "; ".join(reasons) if reasons else "no sources configured"
            if build_failure is not None:
                raise BuildFailed(f"no artifact for {short(commit)}: {summary}")
            raise ArtifactUnavailable(f"no artifact for {short(commit)}: {summary}")

    def _from(
        self, source: Source, commit: str, tags: tuple[str, ...], ticket: Ticket
    ) -> SwapSet:
        if ticket.cancelled:
            raise Cancelled(f"{short(commit)}: no longer wanted")
        work = Path(tempfile.mkdtemp(prefix="work-", dir=self.cache.dirs["tmp"]))
        try:
            if isinstance(source, SourceBuild):
                fetched = source.fetch(commit, tags, work, ticket)
            elif isinstance(source, WheelIndexSource):
                fetched = source.fetch(commit, tags, work, self.facts(commit))
            else:
                fetched = source.fetch(commit, tags, work)
            self.progress(f"{short(commit)}: {source.name} -> {fetched.origin}")
            try:
                if fetched.kind == "members":
                    return self.cache.add_extracted(
                        commit,
                        fetched.members,
                        source=source.name,
                        origin=fetched.origin,
                        wheel_size=fetched.wheel_size,
                    )
                if fetched.kind == "wheel":
                    return self.cache.add_wheel(
                        commit,
                        fetched.path,
                        self.swap_set,
                        source=source.name,
                        origin=fetched.origin,
                        wheel_sha256=fetched.wheel_sha256,
                    )
                files = swap_files_in(fetched.path, self.swap_set)
                return self.cache.add_files(
                    commit, files, source=source.name, origin=fetched.origin
                )
            finally:
                if fetched.temporary:
                    # Only the swap-set blobs are kept (see cache.py): a damaged download is
                    # deleted too, so the next attempt starts clean.
                    fetched.path.unlink(missing_ok=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    # --- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        """Cancel the lookahead and stop every fetch under way (a build is killed and leaves
        nothing in the cache); then wait for the worker, which ends at once."""
        with self._cond:
            self._closed = True
            for job in [*self._jobs.values(), *self._orphans]:
                self._cancel(job)
            for ticket in self._live:
                ticket.cancel()
            self._jobs.clear()
            self._failed.clear()
            self._orphans = []
            worker, self._worker = self._worker, None
            self._cond.notify_all()
        if worker is not None:
            worker.join()
        if self._on_close:
            self._on_close()

    def __enter__(self) -> CachingProvider:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
