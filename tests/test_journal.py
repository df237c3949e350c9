"""The journal: torn tails, corrupt lines, versions, and one durable line per lifetime."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gitrepos import Repo, linear, run_cli, write_probe

from bisect_tool import journal as journal_mod
from bisect_tool.designs import ledger
from bisect_tool.errors import CorruptJournal, StateError
from bisect_tool.range import resolve_range

FLIP = 7  # commit index (1-based) of the first bad commit


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Repo:
    return linear(tmp_path_factory.mktemp("j") / "repo", 10, tag_every=5)


def _started(repo: Repo, state: Path, command: str) -> Path:
    """A journal holding only the header of a `--run` bisect of v0.1.0..v0.2.0."""
    header = ledger.header_for(
        resolve_range(repo.path, repo.main[0], "v0.2.0"), repo=repo.path, mode="run"
    )
    header["run_command"] = command
    path = state / journal_mod.JOURNAL_NAME
    with journal_mod.Journal(path) as journal:
        journal.append(header)
    return path


def _observation(repo: Repo, index: int, verdict: str, n: int = 0) -> dict[str, object]:
    sha = repo.main[index - 1]
    return {
        "type": "observation", "lifetime_id": f"{sha[:12]}-{n}", "commit": sha,
        "position": index - 1, "verdict": verdict, "detail": {}, "message": "", "duration_s": 0,
    }


def test_append_read_roundtrip_and_repeated_lifetime_counted_once(tmp_path: Path,
                                                                  repo: Repo) -> None:
    path = _started(repo, tmp_path, "true")
    with journal_mod.Journal(path) as journal:
        first = journal.append(_observation(repo, 10, "divergent"))
        journal.append(_observation(repo, 10, "divergent"))  # the same lifetime id again
    assert first["seq"] == 1
    contents = journal_mod.read(path)
    assert contents.header["type"] == "header" and not contents.torn_tail
    assert len(contents.of_type("observation")) == 2
    assert len(contents.observations) == 1
    state = ledger.replay(contents)
    assert int(state.strategy.summary().total.sum()) == 1


def test_torn_last_line_is_tolerated_and_resume_finishes(tmp_path: Path, repo: Repo) -> None:
    command = write_probe(tmp_path / "probe.py", flip=FLIP)
    path = _started(repo, tmp_path / "state", command)
    with journal_mod.Journal(path) as journal:
        journal.append(_observation(repo, 10, "divergent"))
    whole = json.dumps(_observation(repo, 1, "clean"))
    with open(path, "a") as fh:
        fh.write(whole[: len(whole) // 2])  # the crash hit mid-write
    contents = journal_mod.read(path)
    assert contents.torn_tail and len(contents.observations) == 1

    code, out, err = run_cli("resume", "--repo", str(repo.path),
                             "--state-dir", str(tmp_path / "state"))
    assert code == 0, err
    assert f"first bad commit: {repo.main[FLIP - 1]}" in out
    lines = path.read_text().splitlines()
    assert all(json.loads(line) for line in lines)  # the torn half was cut, not glued onto
    assert len({json.loads(x).get("lifetime_id") for x in lines[1:-1]}) == len(lines) - 2


@pytest.mark.slow  # a whole bisect, then a resume (the torn-line one stays in the fast tier)
def test_a_whole_last_line_without_its_newline_is_kept(tmp_path: Path, repo: Repo) -> None:
    """What an editor leaves when the user follows the tool's advice to "fix or remove that
    line": the last entry, whole, with no newline after it. Resume cut it (issue 38); a line
    that parses is never torn."""
    command = write_probe(tmp_path / "probe.py", flip=FLIP)
    path = _started(repo, tmp_path / "state", command)
    with journal_mod.Journal(path) as journal:
        journal.append(_observation(repo, 10, "divergent"))
        kept = journal.append(_observation(repo, 1, "clean"))
    path.write_bytes(path.read_bytes().rstrip(b"\n"))  # saved by an editor
    assert len(journal_mod.read(path).observations) == 2

    code, out, err = run_cli("resume", "--repo", str(repo.path),
                             "--state-dir", str(tmp_path / "state"))
    assert code == 0, err
    assert f"first bad commit: {repo.main[FLIP - 1]}" in out
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert kept in lines and lines[2] == kept
    assert [e["lifetime_id"] for e in lines[1:3]] == [f"{repo.main[9][:12]}-0",
                                                      f"{repo.main[0][:12]}-0"]


def test_corrupt_complete_last_line_is_cut_before_appending(tmp_path: Path, repo: Repo) -> None:
    path = _started(repo, tmp_path, "true")
    with open(path, "a") as fh:
        fh.write("{not json\n")
    with journal_mod.Journal(path) as journal:
        journal.append(_observation(repo, 10, "divergent"))
    contents = journal_mod.read(path)  # must not turn into a corrupt *middle* line
    assert len(contents.observations) == 1


def test_corrupt_middle_line_is_a_one_line_state_error(tmp_path: Path, repo: Repo) -> None:
    path = _started(repo, tmp_path, "true")
    with open(path, "a") as fh:
        fh.write("{garbage\n" + json.dumps(_observation(repo, 10, "divergent")) + "\n")
    with pytest.raises(StateError, match=r"journal.jsonl:2: corrupt journal line"):
        journal_mod.read(path)
    code, out, err = run_cli("status", "--repo", str(repo.path), "--state-dir", str(tmp_path))
    assert code == CorruptJournal.exit_code
    assert err.count("\n") == 1 and ":2: corrupt journal line" in err and not out


def test_version_mismatch_names_the_versions(tmp_path: Path, repo: Repo) -> None:
    path = _started(repo, tmp_path, "true")
    header = json.loads(path.read_text().splitlines()[0])
    header["version"] = 99
    path.write_text(json.dumps(header) + "\n")
    with pytest.raises(StateError) as exc:
        journal_mod.read(path)
    assert "journal version 99 is not supported" in str(exc.value)
    assert f"reads {journal_mod.JOURNAL_VERSION}" in str(exc.value)


def test_not_a_journal_and_missing_journal(tmp_path: Path) -> None:
    (tmp_path / "journal.jsonl").write_text('{"type": "observation"}\n')
    with pytest.raises(StateError, match="no header line"):
        journal_mod.read(tmp_path / "journal.jsonl")
    with pytest.raises(StateError, match="start one with `bisect start`"):
        journal_mod.read(tmp_path / "nothing" / "journal.jsonl")


@pytest.mark.slow  # a whole bisect whose probe reads the journal
def test_each_observation_is_on_disk_before_the_next_lifetime(tmp_path: Path,
                                                              repo: Repo) -> None:
    """The --run script reads the journal itself: lifetime k sees the header and k - 1
    observations, so every verdict was written (and flushed) before the next lifetime began."""
    state = tmp_path / "state"
    record = tmp_path / "record.txt"
    command = write_probe(tmp_path / "probe.py", flip=FLIP, p=0.5, record=record,
                          journal=state / journal_mod.JOURNAL_NAME)
    code, out, err = run_cli("start", "--good", "v0.1.0", "--bad", "v0.2.0", "--run", command,
                             "--repo", str(repo.path), "--state-dir", str(state))
    assert code == 0, err
    seen = [int(line.split()[2]) for line in record.read_text().splitlines()]
    assert len(seen) >= 3
    assert seen == list(range(1, len(seen) + 1))
