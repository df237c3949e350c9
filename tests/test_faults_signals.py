"""Issue 30, signals: SIGHUP (a closed terminal or SSH session) acts like SIGTERM, and Ctrl-C in
the first moments of `bisect start` is one line and exit 130. Real `bisect start --run`
processes; the tests wait on what the run wrote, never on the clock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gitrepos import Repo, linear, run_cli

from bisect_tool import journal as journal_mod
from bisect_tool.errors import AbortError

N = 16
FLIP = 11
BAD = f'[ "$(cat f)" -lt {FLIP} ]'


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Repo:
    return linear(tmp_path_factory.mktemp("faults-signals") / "repo", N, tag_every=4)


def start_argv(repo: Repo, state: Path, command: str) -> list[str]:
    return ["start", "--good", "v0.1.0", "--bad", "v0.4.0", "--repo", str(repo.path),
            "--state-dir", str(state), "--run", command]


def labelled(session: str) -> list[int]:
    """Live processes carrying the session's label (the probes and what they started)."""
    wanted = f"BISECT_SESSION={session}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if wanted in env and state not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def wait_for_lines(path: Path, count: int, proc: subprocess.Popen[str]) -> None:
    while not (path.exists() and len(path.read_text().splitlines()) >= count):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)


#: ``python -c`` this, then the tool's arguments: ``bisect`` with SIGHUP's default disposition
_SIGHUP_DEFAULT = ("import signal, sys; signal.signal(signal.SIGHUP, signal.SIG_DFL); "
                   "sys.argv[0] = 'bisect'; from bisect_tool.__main__ import main; main()")


def _ended(proc: subprocess.Popen[str], timeout: float = 120) -> str:
    """The run's stderr once it has ended. One that does not end within ``timeout`` is killed
    (its probes die with it: the shepherd's parent-death signal), so that its worktree does
    not stay live into the next tests (a run that missed its SIGHUP, SIGHUP being ignored by
    the shell that started the tests, failed eight more); first it is asked where each of its
    threads waits (SIGUSR1: ``interrupts.install``)."""
    try:
        return proc.communicate(timeout=timeout)[1]
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)  # where each of its threads waits (faulthandler)
        time.sleep(1)
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(
            f"the run did not end within {timeout} s of its signal:\n{err}") from None


@pytest.mark.parametrize("sig", [pytest.param(signal.SIGTERM, marks=pytest.mark.slow),
                                 signal.SIGHUP], ids=lambda s: s.name)
def test_sighup_acts_like_sigterm(repo: Repo, tmp_path: Path, sig: signal.Signals) -> None:
    record, state = tmp_path / "record", tmp_path / "st"
    # the first lifetime ends at once; with SLOW set, the second one is still running when
    # the signal comes (resume runs without SLOW)
    probe = (f'echo "$BISECT_LIFETIME" >> {record}; '
             f'if [ -n "$SLOW" ] && [ "$(wc -l < {record})" -ge 2 ]; then sleep 60; fi; {BAD}')
    # with SIGHUP as a terminal leaves it: a test run under `nohup` (or a CI runner that
    # ignores SIGHUP) hands its children SIGHUP ignored, and the tool then rightly leaves it
    # alone (test_sighup_is_left_alone_under_nohup)
    proc = subprocess.Popen(
        [sys.executable, "-c", _SIGHUP_DEFAULT, *start_argv(repo, state, probe)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "SLOW": "1"},
    )
    wait_for_lines(record, 2, proc)
    session = str(journal_mod.read(state / "journal.jsonl").header["session"])
    assert labelled(session), "the second lifetime is running"
    proc.send_signal(sig)
    err = _ended(proc)
    assert proc.returncode == AbortError.exit_code, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == f"bisect: terminated ({sig.name}); lifetimes torn down"
    finished = journal_mod.read(state / "journal.jsonl").observations
    assert [o["lifetime_id"] for o in finished] == [record.read_text().split()[0]]
    assert labelled(session) == [], "no probe left running"
    assert len(repo.worktrees()) == 1

    code, out, err = run_cli("resume", "--repo", str(repo.path), "--state-dir", str(state))
    assert code == 0, err
    assert f"first bad commit: {repo.main[FLIP - 1]}" in out
    ids = [o["lifetime_id"] for o in journal_mod.read(state / "journal.jsonl").observations]
    assert ids[0] == finished[0]["lifetime_id"] and len(ids) == len(set(ids))


@pytest.mark.slow  # a live `start --run` in a subprocess under nohup, then a resume
def test_sighup_is_left_alone_under_nohup(repo: Repo, tmp_path: Path) -> None:
    # `nohup bisect start ...` asks to outlive the terminal: SIGHUP stays ignored
    state, started, sent = tmp_path / "st", tmp_path / "started", tmp_path / "sent"
    # the first lifetime waits until the SIGHUP was sent, so it lands mid-run on any machine;
    # the others answer at once
    probe = (f"if mkdir {started} 2>/dev/null; then "
             f"while [ ! -e {sent} ]; do sleep 0.01; done; fi; {BAD}")
    proc = subprocess.Popen(
        ["nohup", sys.executable, "-m", "bisect_tool", *start_argv(repo, state, probe)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )
    while not started.exists():
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    proc.send_signal(signal.SIGHUP)
    sent.touch()
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    log = (tmp_path / "nohup.out").read_text() if (tmp_path / "nohup.out").exists() else out
    assert f"first bad commit: {repo.main[FLIP - 1]}" in log


# three places in the fast tier, all six in `make test`
@pytest.mark.parametrize("delay", [pytest.param(0.02, marks=pytest.mark.slow),
                                   pytest.param(0.05, marks=pytest.mark.slow), 0.1,
                                   pytest.param(0.2, marks=pytest.mark.slow),
                                   pytest.param(0.35, marks=pytest.mark.slow),
                                   pytest.param(0.5, marks=pytest.mark.slow)])
def test_ctrl_c_early_in_start_is_one_line_and_a_new_start_works(
    repo: Repo, tmp_path: Path, delay: float
) -> None:
    state = tmp_path / "st"
    # -X importtime: its line for the package says the interpreter's own start is over (a
    # Ctrl-C inside Python's startup, before any of the tool's code runs, is Python's)
    proc = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "bisect_tool",
         *start_argv(repo, state, f"sleep 30; {BAD}")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if line.rstrip().endswith("| bisect_tool"):
            break
    else:
        raise AssertionError("".join(seen))
    time.sleep(delay)  # where in the start the Ctrl-C lands: each place must end cleanly
    proc.send_signal(signal.SIGINT)
    rest = _ended(proc)
    said = [x for x in rest.splitlines() if x.strip() and not x.startswith("import time:")]
    # 130, or killed by SIGINT (the shell shows both as 130)
    assert proc.returncode in (130, -signal.SIGINT), rest
    # progress lines may come first (on a quick machine the run is under way by then); the
    # error is one line, the last, and there is no traceback
    errors = [x for x in said if x.startswith("bisect: interrupted")]
    assert "Traceback" not in rest and errors == [said[-1]], said
    assert said[-1].startswith("bisect: interrupted"), said
    if (state / "journal.jsonl").exists():
        session = str(journal_mod.read(state / "journal.jsonl").header["session"])
        assert labelled(session) == []

    code, out, err = run_cli(*start_argv(repo, state, BAD))
    assert code == 0, err
    assert f"first bad commit: {repo.main[FLIP - 1]}" in out
    assert len(repo.worktrees()) == 1


# ---- issue 38: Ctrl-C or SIGTERM during the controls does not wait for them -------------------


class _SlowControls:
    """Controls that hold their (imagined) GPU server until released or 30 s have passed."""

    def __init__(self) -> None:
        import threading

        self.started, self.release = threading.Event(), threading.Event()
        self.ended = False

    def __call__(self, commit: str) -> _SlowControls:
        self.commit = commit
        return self

    def run(self) -> dict[str, object]:
        self.started.set()
        self.release.wait(30)
        self.ended = True
        return {"type": "controls", "commit": self.commit, "ok": True, "problem": "",
                "positive": {"verdict": "divergent"}, "negative": {"verdict": "clean"}}


class _Quick:
    """A probe that answers at once: the bug from commit ``flip`` of ``shas`` on."""

    def __init__(self, shas: list[str], flip: int) -> None:
        self.shas, self.flip = shas, flip

    def prepare(self, commits: object) -> None:
        return None

    def cancel(self) -> int:
        return 0

    def evaluate(self, commit: str, lifetime_id: str, tags: object = ()) -> object:
        from bisect_tool.values import Observation, Verdict

        bad = self.shas.index(commit) >= self.flip
        return Observation(commit, Verdict.DIVERGENT if bad else Verdict.CLEAN, lifetime_id,
                           {"timing": {"artifacts_s": 0.0}}, "", 0.01)


@pytest.mark.parametrize("how", ["beside the fast probe", "on a slot of their own"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_a_signal_during_the_controls_does_not_wait_for_them(
    tmp_path: Path, how: str, sig: signal.Signals
) -> None:
    """The controls boot a server and probe it (minutes on a GPU). SIGTERM or Ctrl-C while they
    run stopped the run only once they had ended (issue 38). Now the run stops at once; the
    controls are not journaled (a resumed run asks for them again)."""
    import threading

    from bisect_tool.designs import ledger
    from bisect_tool.errors import Interrupted
    from bisect_tool.range import Candidate, CommitRange
    from bisect_tool.recipes.recipe import Recipe
    from bisect_tool.run.owner import bisect_loop
    from bisect_tool.run.wiring import Evaluators
    from bisect_tool.values import Direction

    shas = [f"{i:040x}" for i in range(1, 41)]
    rng = CommitRange("good", "bad", shas[0], shas[-1], Direction.REGRESSION,
                      tuple(Candidate(s, f"commit {i}") for i, s in enumerate(shas)))
    recipe = Recipe("t").to_dict()
    recipe["probe"]["controls"] = True
    tiered = how == "beside the fast probe"
    if tiered:
        recipe["probe"]["narrow"] = "op"
    path = tmp_path / "journal.jsonl"
    journal_mod.create(path, ledger.header_for(rng, recipe=recipe, mode="recipe"))
    controls = _SlowControls()
    evaluators = Evaluators(_Quick(shas, 25), 1 if tiered else 2, controls,
                            narrow=_Quick(shas, 25) if tiered else None)

    def send() -> None:
        if controls.started.wait(30):
            os.kill(os.getpid(), sig)

    sender = threading.Thread(target=send)
    sender.start()
    try:
        with pytest.raises((Interrupted, KeyboardInterrupt)), \
                journal_mod.open_journal(path) as opened:
            state = ledger.replay(opened.contents)
            bisect_loop(opened.journal, state, evaluators, controls=True)
        assert controls.started.is_set()
        assert not controls.ended, "the run waited for the controls to end"
    finally:
        controls.release.set()
        sender.join()
    assert not journal_mod.read(path).of_type("controls")


def test_a_closed_backend_boots_nothing_more(tmp_path: Path) -> None:
    """The controls' thread, not waited for, must not boot its next attempt once the run's
    backend has closed (and stopped the server it had)."""
    from bisect_tool.errors import InfrastructureError
    from bisect_tool.interfaces import LifetimeSpec, SwapSet
    from bisect_tool.recipes.recipe import RuntimeSettings
    from bisect_tool.runtime import LocalBackend

    backend = LocalBackend(RuntimeSettings(backend="local", python=sys.executable,
                                           server_module="http.server", boot_timeout_s=5.0),
                           session="closed", log_dir=tmp_path / "logs", grace_s=1.0,
                           overlay_parent=tmp_path)
    assert backend.close() == 0
    spec = LifetimeSpec(session="closed", lifetime_id="control-x-1",
                        swap=SwapSet(commit="c0ffee" * 7, files={}))
    with pytest.raises(InfrastructureError, match="the run is stopping"), backend.lifetime(spec):
        pass
    assert not (tmp_path / "logs").exists() or not any((tmp_path / "logs").iterdir())


# ---- a signal that lands in a finalizer is not lost (CI: Ctrl-C 0.5 s into start, no end) ----

# `bisect start` whose first finalizer after the run began (the Popen.__del__ at the end of the
# first lifetime's `git worktree add`) sends the signal to the tool itself: its handler runs
# inside that __del__, where an exception is dropped ("Exception ignored in ...")
_IN_FINALIZER = """
import os, signal, subprocess, sys
from bisect_tool.run import engine
armed = []
real_del, real_work = subprocess.Popen.__del__, engine.Engine._work
def __del__(self):
    if armed:
        os.kill(os.getpid(), armed.pop())
        for _ in range(100):  # the handler runs here, inside the finalizer
            pass
    real_del(self)
def _work(self, work):
    if not hasattr(engine, "_armed"):
        engine._armed = armed.append(int(os.environ["SIG"]))
    return real_work(self, work)
subprocess.Popen.__del__, engine.Engine._work = __del__, _work
sys.argv = ["bisect", *sys.argv[1:]]
from bisect_tool.__main__ import main
main()
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_a_signal_inside_a_finalizer_still_ends_the_run(
    repo: Repo, tmp_path: Path, sig: signal.Signals
) -> None:
    state = tmp_path / "st"
    proc = subprocess.Popen(
        [sys.executable, "-c", _IN_FINALIZER, *start_argv(repo, state, f"sleep 30; {BAD}")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "SIG": str(int(sig))},
    )
    try:
        _, err = proc.communicate(timeout=25)  # lost: the run goes on, 30 s a lifetime
    finally:
        proc.kill()
    said = [x for x in err.splitlines() if x.strip()]
    assert "Traceback" not in err and "Exception ignored" not in err, err
    if sig == signal.SIGINT:
        assert proc.returncode == 130, err
        assert said[-1].startswith("bisect: interrupted"), said
    else:
        assert proc.returncode == AbortError.exit_code, err
        assert said[-1] == "bisect: terminated (SIGTERM); lifetimes torn down", said
    session = str(journal_mod.read(state / "journal.jsonl").header["session"])
    assert labelled(session) == []
    assert len(repo.worktrees()) == 1


def test_a_turn_left_open_by_an_interrupt_is_taken_over(repo: Repo) -> None:
    # Ctrl-C in contextlib's __exit__ of `_turn`, before the generator closed the lock's file:
    # the traceback kept the file open and locked, and the worktree's removal waited on its own
    # lock for ever (flock locks by open file)
    import fcntl
    import threading

    from bisect_tool.range.worktrees import _TURNS, _git_common_dir, _turn

    abandoned, done = [], threading.Event()

    def thread() -> None:
        left = _turn(repo.path)
        left.__enter__()  # never exited: as an interrupt in its __exit__ leaves it
        abandoned.append(left)
        with _turn(repo.path):
            pass
        done.set()

    worker = threading.Thread(target=thread, daemon=True)
    worker.start()
    assert done.wait(10), "the second turn waited for the first one of its own thread"
    common = _git_common_dir(str(repo.path))
    assert common is not None
    with open(common / _TURNS, "a") as other:  # given back: another process gets its turn
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(other, fcntl.LOCK_UN)
    abandoned.clear()  # collected later: closes nothing of a later turn's
