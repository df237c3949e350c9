"""Controls: is the probe able to see divergence, and does it invent none?

From the seed thread (vLLM issue 51187) and the H200 measurements in vllm-facts.md:

- positive control: the same concurrent workload with the recipe's invariance switch off
  (``{invariance_env: "0"}``) must diverge. With ``--load-format dummy`` weights it did not, and
  the 13 CLEAN lifetimes measured with them meant nothing: a CLEAN is only evidence when the
  probe has been shown to detect divergence on this stack.
- negative control: the same workload with one request in flight at a time must be clean;
  otherwise divergence comes from the client or the sampler, not from batching.

``run_controls`` runs both (positive first); ``gate`` is the pure rule deciding what verdict may
be reported for a lifetime given the controls.

Suspects (``[probe] suspects``, issue 40): the same candidate with the invariance switch as the
recipe sets it, under each value of a setting besides the recipe's own (``run_suspects``), and
in words which values show divergence (``suspect_findings``): #51187's reporters saw their
divergence go with ``VLLM_USE_FLASHINFER_SAMPLER=0``, and every run of this tool set it to 0,
so nothing said whether the sampler or the kernels carried it.

The negative control's pass is the longest thing in a run: every request sent alone, priming
pass and repeats (155 requests, 119 s on the H100, where the whole answer should take 120 s:
issue 39). ``spread`` boots that many servers of the candidate at once, all with the invariance
switch off, and deals the requests over them (``ServerDeterminismProbe.split``): each request
is still sent alone to one server and compared with itself over the same repeats, so the
control makes the same comparisons on the same stack and setting, in ``spread`` times less
time; the positive control runs on the first server meanwhile. It fails as the single pass
would: a request whose repeats differ is a divergent negative control, on whichever server.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace

from bisect_tool.errors import UntestableError
from bisect_tool.interfaces import ProbeResult, ServerHandle, ServerProbe
from bisect_tool.values import Verdict

# probe_factory(sequential) -> a probe; boot(env) -> a context manager around one lifetime
# (boot(env, part): the part-th of the servers the negative control is spread over).
ProbeFactory = Callable[[bool], ServerProbe]
Boot = Callable[..., AbstractContextManager[ServerHandle]]


@dataclass(frozen=True)
class ControlsResult:
    positive: ProbeResult  # invariance off, concurrent: must be DIVERGENT
    negative: ProbeResult  # sequential submission: must be CLEAN

    @property
    def positive_ok(self) -> bool:
        return self.positive.verdict is Verdict.DIVERGENT

    @property
    def negative_ok(self) -> bool:
        return self.negative.verdict is Verdict.CLEAN

    @property
    def ok(self) -> bool:
        return self.positive_ok and self.negative_ok

    @property
    def could_not_run(self) -> bool:
        """Neither control ran: the candidate's server did not boot (or the gate refused it)."""
        return (self.positive.verdict is Verdict.UNTESTABLE
                and self.negative.verdict is Verdict.UNTESTABLE)

    @property
    def problem(self) -> str:
        """"" when both controls held; else what failed and what to change."""
        if self.could_not_run:
            # No probe advice: the probe never ran (vLLM 0.22.0's _C under 0.26.0's Python
            # died before /health, and the advice to fix the sampler was wrong).
            return f"the controls could not run: {self.positive.message or 'no message'}"
        problems = []
        if not self.positive_ok:
            problems.append(
                f"positive control (invariance off) was {self.positive.verdict.value}, not "
                f"divergent ({self.positive.message or 'no message'}): the probe cannot show "
                "divergence on this stack, so a CLEAN would mean nothing; use weights at a "
                "realistic scale (not --load-format dummy), add jitter, disable prefix caching"
            )
        if not self.negative_ok:
            problems.append(
                f"negative control (sequential) was {self.negative.verdict.value}, not clean "
                f"({self.negative.message or 'no message'}): outputs differ without batching, "
                "so divergence would not point at the kernels; check sampling is greedy"
            )
        return "; ".join(problems)

    def to_detail(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "problem": self.problem,
            "positive": {"verdict": self.positive.verdict.value, "message": self.positive.message,
                         "detail": self.positive.detail},
            "negative": {"verdict": self.negative.verdict.value, "message": self.negative.message,
                         "detail": self.negative.detail},
        }


def run_controls(
    probe_factory: ProbeFactory,
    boot: Boot,
    invariance_env: str = "VLLM_BATCH_INVARIANT",
    share_lifetime: bool = True,
    spread: int = 1,
) -> ControlsResult:
    """Run the positive control, then the negative one.

    With ``share_lifetime`` (the default) both run in one lifetime booted with the invariance
    switch off, which saves a boot (~50 s for vLLM) and is the stronger negative control: even
    the non-invariant server must answer identically when requests come one at a time.
    Otherwise the negative control gets its own lifetime booted with the recipe's env (``{}``).
    ``spread`` > 1: the negative control's requests are dealt over that many such servers,
    booted at once (the module's docstring says why it proves the same).
    A boot that fails is an UNTESTABLE control, never an exception.
    """
    off = {invariance_env: "0"}
    if share_lifetime and spread > 1:
        parts = _parts(probe_factory(True), spread)
        if len(parts) > 1:
            return _spread(probe_factory, boot, off, parts)
    if share_lifetime:
        try:
            with boot(off) as server:
                positive = probe_factory(False).run(server)
                negative = probe_factory(True).run(server)
        except UntestableError as exc:
            failed = ProbeResult(Verdict.UNTESTABLE, {}, f"boot failed: {exc}")
            return ControlsResult(positive=failed, negative=failed)
        return ControlsResult(positive=positive, negative=negative)
    positive = _in_lifetime(boot, off, probe_factory(False))
    negative = _in_lifetime(boot, {}, probe_factory(True))
    return ControlsResult(positive=positive, negative=negative)


def _parts(probe: ServerProbe, spread: int) -> list[ServerProbe]:
    split = getattr(probe, "split", None)
    return list(split(spread)) if callable(split) else [probe]


def _spread(probe_factory: ProbeFactory, boot: Boot, off: Mapping[str, str],
            parts: Sequence[ServerProbe]) -> ControlsResult:
    """Both controls over ``len(parts)`` servers booted at once: the positive control and the
    first share of the negative one's requests on the first, the other shares on the rest."""
    positive: list[ProbeResult] = []

    def on_server(part: int) -> ProbeResult:
        try:
            with boot(off, part) as server:
                if part == 0:
                    positive.append(probe_factory(False).run(server))
                return parts[part].run(server)
        except UntestableError as exc:
            failed = ProbeResult(Verdict.UNTESTABLE, {}, f"boot failed: {exc}")
            if part == 0:
                positive.append(failed)
            return failed

    with ThreadPoolExecutor(len(parts), thread_name_prefix="bisect-controls") as servers:
        negatives = list(servers.map(on_server, range(len(parts))))
    return ControlsResult(positive=positive[0], negative=merged(negatives))


def merged(results: Sequence[ProbeResult]) -> ProbeResult:
    """One negative control from its shares: divergent if any share diverged (a request's
    repeats differed on its server), untestable if any could not run, inconclusive if any was,
    else clean; the detail keeps every share's and sums what the report reads."""
    order = (Verdict.DIVERGENT, Verdict.UNTESTABLE, Verdict.INCONCLUSIVE, Verdict.CLEAN)
    verdict = next(v for v in order if any(r.verdict is v for r in results))
    details = [r.detail for r in results]
    distinct = [d["distinct_outputs"] for d in details
                if isinstance(d.get("distinct_outputs"), int)]
    pairs = [p for d in details for p in (d.get("differing_pairs") or [])]
    detail: dict[str, object] = {
        "mode": "sequential",
        "servers": len(results),
        "lifetime_id": details[0].get("lifetime_id") if details else None,
        "repeats": details[0].get("repeats") if details else None,
        "distinct_outputs": max(distinct) if distinct else None,
        "differing_pairs": pairs,
        "parts": details,
    }
    messages = [f"server {i + 1} of {len(results)}: {r.message}"
                for i, r in enumerate(results) if r.verdict is verdict and r.message]
    return ProbeResult(verdict, detail, "; ".join(messages[:3]))


def _in_lifetime(boot: Boot, env: Mapping[str, str], probe: ServerProbe) -> ProbeResult:
    try:
        with boot(env) as server:
            return probe.run(server)
    except UntestableError as exc:
        return ProbeResult(Verdict.UNTESTABLE, {}, f"boot failed: {exc}")


def suspect_values(suspects: Mapping[str, str]) -> list[tuple[str, str]]:
    """(setting, value) pairs to run, in the recipe's order: ``{"A": "0,1"}`` -> A=0, A=1."""
    return [(key, value.strip()) for key, values in suspects.items()
            for value in values.split(",") if value.strip()]


def run_suspects(
    probe_factory: ProbeFactory,
    boot: Callable[[Mapping[str, str], str], AbstractContextManager[ServerHandle]],
    suspects: Mapping[str, str],
    lifetimes: int,
) -> dict[str, list[ProbeResult]]:
    """``lifetimes`` lifetimes of each suspect setting (``boot(env, label)``: one lifetime
    with ``env`` over the recipe's, the switch left on), each probed concurrently; keyed
    ``"KEY=VALUE"``. A boot that fails is an UNTESTABLE lifetime, never an exception."""
    out: dict[str, list[ProbeResult]] = {}
    for key, value in suspect_values(suspects):
        setting = f"{key}={value}"
        results = out.setdefault(setting, [])
        for i in range(lifetimes):
            try:
                with boot({key: value}, f"{setting}-{i}") as server:
                    results.append(probe_factory(False).run(server))
            except UntestableError as exc:
                results.append(ProbeResult(Verdict.UNTESTABLE, {}, f"boot failed: {exc}"))
    return out


def suspect_findings(
    results: Mapping[str, list[ProbeResult]], recipe_env: Mapping[str, str], candidate: str
) -> dict[str, object]:
    """What the suspects showed, as plain values and in words (pure): per setting the
    lifetimes that diverged, and per variable which values show divergence on ``candidate``,
    naming the value this run's lifetimes used (``recipe_env``; unset when it sets none)."""
    settings = []
    by_key: dict[str, list[tuple[str, int, int]]] = {}
    for setting, runs in results.items():
        key, _, value = setting.partition("=")
        divergent = sum(r.verdict is Verdict.DIVERGENT for r in runs)
        conclusive = sum(r.verdict in (Verdict.DIVERGENT, Verdict.CLEAN) for r in runs)
        settings.append({"setting": setting, "divergent": divergent, "conclusive": conclusive,
                         "lifetimes": len(runs),
                         "verdicts": [r.verdict.value for r in runs],
                         "messages": [r.message for r in runs]})
        by_key.setdefault(key, []).append((value, divergent, conclusive))
    findings = []
    for key, rows in by_key.items():
        ran = recipe_env.get(key)
        seen = "; ".join(
            f"{key}={v}"
            + (" (the setting this run used)" if v == ran else "")
            + f": divergent in {d} of {c} conclusive lifetimes" for v, d, c in rows)
        showing = [v for v, d, _ in rows if d]
        clean = [v for v, d, c in rows if not d and c]
        if showing and clean:
            words = (f"on {candidate} only {', '.join(f'{key}={v}' for v in showing)} shows "
                     "divergence: this setting decides whether it shows")
        elif showing:
            words = (f"on {candidate} every value shows divergence: {key} is not what "
                     "carries it")
        elif clean:
            words = f"on {candidate} no value of {key} shows divergence"
        else:
            words = f"on {candidate} no lifetime of {key}'s values was conclusive"
        how = f"this run used {key}={ran}" if ran is not None else f"this run left {key} unset"
        findings.append(f"{seen}; {words} ({how})")
    return {"candidate": candidate, "settings": settings, "findings": findings}


def may_report_clean(controls: ControlsResult | None, require_controls: bool = True) -> bool:
    """A CLEAN may stand only when the positive control diverged (and the negative held)."""
    if controls is None:
        return not require_controls
    return controls.ok


def may_report_divergent(controls: ControlsResult | None) -> bool:
    """A DIVERGENT stands unless the negative control showed the client itself diverges."""
    return controls is None or controls.negative_ok


def gate(
    result: ProbeResult, controls: ControlsResult | None, require_controls: bool = True
) -> ProbeResult:
    """The verdict that may be reported for a lifetime, given the controls (pure).

    CLEAN without a passing positive control, or DIVERGENT with a failing negative control,
    becomes INCONCLUSIVE with the reason; other verdicts pass through unchanged.
    """
    if result.verdict is Verdict.CLEAN and not may_report_clean(controls, require_controls):
        why = controls.problem if controls is not None else "the controls were not run"
        return _downgrade(result, f"CLEAN not reported: {why}")
    if result.verdict is Verdict.DIVERGENT and not may_report_divergent(controls):
        assert controls is not None
        return _downgrade(result, f"DIVERGENT not reported: {controls.problem}")
    return result


def _downgrade(result: ProbeResult, why: str) -> ProbeResult:
    detail = {**result.detail, "gated_from": result.verdict.value, "gate_reason": why}
    return replace(result, verdict=Verdict.INCONCLUSIVE, detail=detail,
                   message=f"{why} (probe said: {result.message})")
