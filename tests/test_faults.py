"""The fault sweep (issue 14): bad input and faults as a new user meets them. Each case is a one-
line error with a non-zero exit, or the run survives the fault without a wrong answer, a lost
lifetime or a leftover process."""

from __future__ import annotations

import json
import os
import subprocess
import time
import zipfile
from pathlib import Path

import pytest
from gitrepos import Repo, git, linear, live_run, run_cli

from bisect_tool import journal as journal_mod
from bisect_tool.errors import (
    AbortError,
    CorruptJournal,
    RecipeError,
    StateDirUnusable,
    StateError,
    UsageError,
)
from bisect_tool.runtime.local import pids_with_env

N = 16
FLIP = 11


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Repo:
    return linear(tmp_path_factory.mktemp("faults") / "repo", N, tag_every=4)


def start(repo: Repo, state: Path, *extra: str) -> tuple[int, str, str]:
    return run_cli("start", "--good", "v0.1.0", "--bad", "v0.4.0", "--repo", str(repo.path),
                   "--state-dir", str(state), *extra)


def one_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert "Traceback" not in err
    assert lines and lines[-1].startswith("bisect: "), err
    return lines[-1]


def _wait_for(predicate: object, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


def gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


# ---- 1. a --run command that never ran is not a verdict ----------------------------------------


def test_relative_script_path_aborts_naming_the_path_the_worktree_sees(
    repo: Repo, tmp_path: Path
) -> None:
    (tmp_path / "probe.sh").write_text("#!/bin/sh\nexit 0\n")
    code, out, err = start(repo, tmp_path / "st", "--run", "bash ../probe.sh")
    assert code == AbortError.exit_code, out + err
    assert "first bad commit" not in out
    line = one_line(err)
    assert "exited 127 (not found)" in line and "`../probe.sh`" in line
    assert "bisect-wt-" in line and "which does not exist" in line and "absolute path" in line
    # nothing was observed: no journal is left to refuse the next start (issue 31)
    assert not (tmp_path / "st" / "journal.jsonl").exists()
    assert len(repo.worktrees()) == 1


def test_script_that_is_not_executable_aborts_with_exit_126(repo: Repo, tmp_path: Path) -> None:
    code, out, err = start(repo, tmp_path / "st", "--run", "./f")  # every commit has f, mode 644
    assert code == AbortError.exit_code
    line = one_line(err)
    assert "exited 126 (not executable)" in line and "/src/f as the candidate's worktree" in line
    assert "chmod +x" in line


def test_unknown_command_aborts_naming_it(repo: Repo, tmp_path: Path) -> None:
    code, _, err = start(repo, tmp_path / "st", "--run", "no-such-probe-command --flag")
    assert code == AbortError.exit_code
    assert "`no-such-probe-command` is not a command on PATH" in one_line(err)


@pytest.mark.slow  # a whole `start --run`
def test_first_lifetime_echoes_its_working_directory(repo: Repo, tmp_path: Path) -> None:
    code, out, err = start(repo, tmp_path / "st", "--run", f'[ "$(cat f)" -lt {FLIP} ]')
    assert code == 0, err
    assert "bisect: --run runs in /" in err and "relative paths in the command resolve" in err
    obs = journal_mod.read(tmp_path / "st" / "journal.jsonl").of_type("observation")
    first = obs[0]["detail"]["log_tail"].splitlines()[0]
    assert first.startswith("bisect: --run runs in ") and "bisect-wt-" in first
    assert not any("--run runs in" in o["detail"]["log_tail"] for o in obs[1:])


# ---- 2 + 4 + 8. one run per state dir; a killed run's probe is ended --------------------------


def _slow_run(repo: Repo, tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path, Path]:
    return live_run(repo, tmp_path, flip=FLIP)


def _session(state: Path) -> str:
    return str(journal_mod.read(state / "journal.jsonl").header["session"])


@pytest.mark.slow  # a live run in a subprocess, then a resume to its end
def test_second_start_and_resume_are_refused_while_a_run_is_live_then_resume_takes_over(
    repo: Repo, tmp_path: Path
) -> None:
    proc, state, _ = _slow_run(repo, tmp_path)
    try:
        for argv in (
            ["start", "--good", "v0.1.0", "--bad", "v0.4.0", "--run", "true"],
            ["resume"],
            ["reset"],
            ["good"],
        ):
            code, _, err = run_cli(*argv, "--repo", str(repo.path), "--state-dir", str(state))
            assert code == StateError.exit_code, (argv, err)
            line = one_line(err)
            assert f"a bisect is running in {state}: pid {proc.pid} on " in line, line
            assert f"kill {proc.pid}" in line
        code, out, _ = run_cli("status", "--repo", str(repo.path), "--state-dir", str(state))
        assert f"state: running (pid {proc.pid} on " in out
        session = _session(state)
        probes = pids_with_env("BISECT_SESSION", session)
        assert probes, "the probe carries the session label"
    finally:
        proc.kill()
        proc.communicate()
    # the probe's parent (bisect_tool.runtime.shepherd) is told by the kernel, and ends it
    _wait_for(lambda: all(gone(p) for p in probes))

    code, out, _ = run_cli("status", "--repo", str(repo.path), "--state-dir", str(state))
    assert "state: stopped (no process is running it; `bisect resume` continues it)" in out

    code, out, err = run_cli("resume", "--repo", str(repo.path), "--state-dir", str(state))
    assert code == 0, err
    assert f"took over the lock of pid {proc.pid} on " in err and "no longer running" in err
    assert f"first bad commit: {repo.main[FLIP - 1]}" in out
    entries = journal_mod.read(state / "journal.jsonl").entries
    seqs = [e["seq"] for e in entries]
    ids = [e["lifetime_id"] for e in entries if e["type"] == "observation"]
    assert seqs == list(range(1, len(entries) + 1)) and len(ids) == len(set(ids))
    assert [e["type"] for e in entries].count("end") == 1
    assert len(repo.worktrees()) == 1


def test_reset_after_kill_9_ends_the_orphaned_probe_and_its_worktree(
    repo: Repo, tmp_path: Path
) -> None:
    proc, state, _ = _slow_run(repo, tmp_path)
    session = _session(state)
    probes = pids_with_env("BISECT_SESSION", session)
    # The probe's shepherd would end it when the tool dies: killed first (by the OOM killer,
    # say), it leaves the probe to init, found again by the group the state dir records.
    shepherds = [json.loads(r.read_text())["pgid"] for r in (state / "children").glob("*.json")]
    assert len(shepherds) == 1
    os.kill(shepherds[0], 9)
    proc.kill()
    proc.communicate()
    probes = [p for p in probes if p != shepherds[0]]
    assert probes and all(not gone(p) for p in probes)
    assert len(repo.worktrees()) == 2  # the probe's locked worktree
    code, out, err = run_cli("reset", "--repo", str(repo.path), "--state-dir", str(state))
    assert code == 0, err
    assert f"removed {state}" in out and "ended 1 leftover probe process group(s)" in out
    assert all(gone(p) for p in probes)
    assert len(repo.worktrees()) == 1 and not state.exists()


# ---- 5. one line where one line is promised ----------------------------------------------------


def test_state_dir_that_is_a_file_or_cannot_be_made(repo: Repo, tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    code, _, err = start(repo, afile, "--run", "true")
    assert code == StateDirUnusable.exit_code and "is a file, not a folder" in one_line(err)
    code, _, err = start(repo, Path("/proc/bisect-nope/st"), "--run", "true")
    assert code == StateDirUnusable.exit_code
    assert "cannot create the state dir /proc/bisect-nope/st" in one_line(err)


def test_cache_dir_that_is_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    code, _, err = run_cli("artifacts", "ls", "--cache-dir", str(afile))
    assert code == UsageError.exit_code and "set --cache-dir, BISECT_CACHE_DIR" in one_line(err)
    monkeypatch.setenv("BISECT_CACHE_DIR", str(afile))
    code, _, err = run_cli("artifacts", "ls")
    assert code == UsageError.exit_code and f"artifact cache {afile}" in one_line(err)
    monkeypatch.setenv("BISECT_CACHE_DIR", "/proc/bisect-nope")
    code, _, err = run_cli("artifacts", "ls")
    assert code == UsageError.exit_code and "cannot be used" in one_line(err)


@pytest.fixture(scope="module")
def finished(repo: Repo, tmp_path_factory: pytest.TempPathFactory) -> Path:
    state = tmp_path_factory.mktemp("finished") / "st"
    code, _, err = start(repo, state, "--run", f'[ "$(cat f)" -lt {FLIP} ]')
    assert code == 0, err
    return state


def test_report_plot_to_an_unwritable_path(repo: Repo, finished: Path) -> None:
    code, _, err = run_cli("report", "--plot", "/proc/nope.png", "--repo", str(repo.path),
                           "--state-dir", str(finished))
    assert code == UsageError.exit_code
    assert "cannot write the plot to /proc/nope.png" in one_line(err)


@pytest.mark.parametrize(
    "bad_line, says",
    [
        (b'{"type":"observation"}', "lacks 'position'"),
        (b"[1,2,3]", "is not a JSON object"),
        (b'{"type":"observation","position":99,"commit":"x","lifetime_id":"x","verdict":"clean"}',
         "position 99 outside the 13 candidates"),
        (b'{"type":"end"}', "lacks 'state'"),
        (b'{"type":"obs\xff\xfe"}', "not UTF-8 text"),
    ],
)
def test_journal_line_of_the_wrong_shape_is_one_line_naming_it(
    finished: Path, tmp_path: Path, bad_line: bytes, says: str
) -> None:
    lines = (finished / "journal.jsonl").read_bytes().split(b"\n")
    copy = tmp_path / "journal.jsonl"
    copy.write_bytes(b"\n".join([lines[0], lines[1], bad_line, *lines[2:]]))
    for argv in (["replay", str(copy)], ["status", "--state-dir", str(tmp_path)],
                 ["report", "--state-dir", str(tmp_path)]):
        code, _, err = run_cli(*argv)
        assert code == CorruptJournal.exit_code, (argv, err)
        line = one_line(err)
        assert f"{copy}:3: " in line and says in line, line


def test_replay_of_a_binary_file(tmp_path: Path) -> None:
    blob = tmp_path / "blob.bin"
    blob.write_bytes(bytes(range(256)) * 8)
    code, _, err = run_cli("replay", str(blob))
    assert code == CorruptJournal.exit_code and "not a bisect journal" in one_line(err)


# ---- 6. numbers out of range ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--confidence", "1.5"], "'--confidence': 1.5 is not in the range 0<x<1"),
        (["--confidence", "0"], "'--confidence': 0.0 is not in the range 0<x<1"),
        (["--max-evaluations", "-1"], "'--max-evaluations': -1 is not in the range x>=1"),
        (["--run-timeout", "-1"], "'--run-timeout': -1.0 is not in the range x>=0"),
        (["--cost-lifetime", "0"], "'--cost-lifetime': 0.0 is not in the range x>0"),
    ],
)
def test_cli_numbers_out_of_range_are_refused(
    repo: Repo, tmp_path: Path, flags: list[str], says: str
) -> None:
    code, _, err = start(repo, tmp_path / "st", "--run", "true", *flags)
    assert code == 2 and says in one_line(err), err
    assert not (tmp_path / "st" / "journal.jsonl").exists()


def test_empty_run_command_is_refused_not_manual_mode(repo: Repo, tmp_path: Path) -> None:
    code, out, err = start(repo, tmp_path / "st", "--run", "")
    assert code == UsageError.exit_code and "next:" not in out
    assert "--run needs a command" in one_line(err)


@pytest.mark.parametrize(
    "section, line, says",
    [
        ("search", "max_end_lifetimes = -3", "'search.max_end_lifetimes' must be >= 1, got -3"),
        ("search", "confidence = 1.5", "'search.confidence' must be in (0, 1), got 1.5"),
        ("search", "max_evaluations = 0", "'search.max_evaluations' must be >= 1, got 0"),
        ("probe", "repeats = 1", "'probe.repeats' must be >= 2, got 1"),
        ("probe", "hidden_sizes = [512, -1]", "'probe.hidden_sizes' must be >= 1, got -1"),
        ("artifacts", 'swap_set = ["../../evil.so"]', "climbs out of its folder"),
        ("artifacts", 'swap_set = ["/abs/evil.so"]', "is an absolute path"),
    ],
)
def test_recipe_values_out_of_range_are_refused(
    repo: Repo, tmp_path: Path, section: str, line: str, says: str
) -> None:
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'name = "r"\n[{section}]\n{line}\n')
    code, _, err = start(repo, tmp_path / "st", "--recipe", str(recipe))
    assert code == RecipeError.exit_code
    assert f"{recipe}: " in one_line(err) and says in one_line(err)


# ---- 7. paths stay inside their folder -----------------------------------------------------------


def test_extract_refuses_a_member_that_climbs_out_of_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheel = tmp_path / "x.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("../../evil.so", b"evil")
        zf.writestr("pkg/ok.so", b"ok")
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli("artifacts", "extract", str(wheel), "--member", "../../evil.so",
                           "--out", "deep/a/b")
    assert code == UsageError.exit_code
    assert "wheel member '../../evil.so' climbs out of its folder" in one_line(err)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["x.whl"]
    code, _, err = run_cli("artifacts", "extract", str(wheel), "--member", "/etc/evil.so",
                           "--out", "deep")
    assert code == UsageError.exit_code and "is an absolute path" in one_line(err)
    (tmp_path / "deep").mkdir()
    (tmp_path / "deep" / "link").symlink_to(tmp_path.parent)
    code, _, err = run_cli("artifacts", "extract", str(wheel), "--member", "link/pkg/ok.so",
                           "--out", "deep")
    assert code == UsageError.exit_code and "through a link" in one_line(err)
    code, out, err = run_cli("artifacts", "extract", str(wheel), "--member", "pkg/ok.so",
                             "--out", "deep/a/b")
    assert code == 0, err
    assert (tmp_path / "deep/a/b/pkg/ok.so").read_bytes() == b"ok"


def test_import_of_a_missing_file_says_not_found(tmp_path: Path) -> None:
    code, _, err = run_cli("artifacts", "import", "--commit", "a" * 40, "/nope.so",
                           "--member", "vllm/nope.so", "--cache-dir", str(tmp_path / "c"))
    assert code == UsageError.exit_code and "/nope.so not found" in one_line(err)
    code, _, err = run_cli("artifacts", "import", "--commit", "a" * 40, str(tmp_path),
                           "--member", "../up.so", "--cache-dir", str(tmp_path / "c"))
    assert code == UsageError.exit_code and "climbs out of its folder" in one_line(err)


# ---- 8. the --run report: no recipe "?", links only to the clone's own GitHub remote ------------


def _report(repo: Repo, state: Path) -> str:
    code, out, err = run_cli("report", "--repo", str(repo.path), "--state-dir", str(state))
    assert code == 0, err
    return out


@pytest.mark.parametrize(
    "remote, base",
    [
        # a run each: two shapes in the fast tier, the other remotes in make test
        (None, None),
        pytest.param("https://github.com/someone/vllm.git", "https://github.com/someone/vllm",
                     marks=pytest.mark.slow),
        ("git@github.com:vllm-project/vllm.git", "https://github.com/vllm-project/vllm"),
        pytest.param("https://github.com/someone/other-project", None, marks=pytest.mark.slow),
        pytest.param("https://gitlab.example/vllm-project/vllm.git", None,
                     marks=pytest.mark.slow),
    ],
)
def test_run_report_names_the_command_and_links_only_to_the_clones_remote(
    tmp_path: Path, remote: str | None, base: str | None
) -> None:
    r = linear(tmp_path / "repo", 8, tag_every=4)
    if remote:
        git(r.path, "remote", "add", "origin", remote)
    state = tmp_path / "st"
    code, _, err = run_cli("start", "--good", "v0.1.0", "--bad", "v0.2.0", "--run",
                           '[ "$(cat f)" -lt 6 ]', "--repo", str(r.path), "--state-dir",
                           str(state))
    assert code == 0, err
    text = _report(r, state)
    assert "recipe `?`" not in text and '- Probe: `--run` `[ "$(cat f)" -lt 6 ]`' in text
    if base is None:
        assert "github.com" not in text and "](http" not in text
        assert f"`{r.main[5][:7]}`" in text
    else:
        assert f"]({base}/commit/{r.main[5]})" in text and f"{base}/compare/" in text
        assert text.count("github.com/") == text.count(f"{base}/")


def _serve_500(models_ok: bool):  # type: ignore[no-untyped-def]
    """A loopback server answering HTTP 500 (and /v1/models too, unless ``models_ok``)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            if self.command == "POST":
                self.rfile.read(int(self.headers.get("content-length", 0)))
            if models_ok and self.path == "/v1/models":
                body, code = json.dumps({"data": [{"id": "m"}]}).encode(), 200
            else:
                body, code = b"internal error: engine step failed", 500
            self.send_response(code)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *a: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.parametrize("models_ok, says, never", [
    (False, "/v1/models answered HTTP 500: internal error", "lists no model"),
    (True, "server failed during the priming pass (HTTP 500", "server died"),
])
def test_http_500_is_reported_as_http_500(models_ok: bool, says: str, never: str) -> None:
    from bisect_tool.interfaces import ServerHandle
    from bisect_tool.probes.server import ServerDeterminismProbe
    from bisect_tool.recipes.recipe import ProbeSettings
    from bisect_tool.values import Verdict

    server = _serve_500(models_ok)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        probe = ServerDeterminismProbe(ProbeSettings(requests=2, fillers=1, repeats=2,
                                                     request_timeout_s=10.0, jitter_ms=0.0))
        result = probe.run(ServerHandle(url=url, lifetime_id="t-0", log_path=Path("/nonexistent")),
                           lambda: True)
    finally:
        server.shutdown()
        server.server_close()
    assert result.verdict is Verdict.UNTESTABLE
    assert says in result.message and never not in result.message, result.message
