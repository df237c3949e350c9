"""`bisect probe` end to end: real loopback servers, exit status = verdict."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from probe_servers import Behaviour, serve

from bisect_tool.cli import main

SMALL = ["--requests", "4", "--fillers", "2", "--repeats", "3", "--max-tokens", "3",
         "--jitter-ms", "0"]


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def test_clean_server_prints_the_table_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    with serve(Behaviour(workload_size=6, gather=6)) as server:
        code, out, _ = run(["probe", "--server", server.url, *SMALL], capsys)
    assert code == 0, out
    assert "| distinct outputs / repeats | 1 / 3 |" in out
    assert "CLEAN: 3 repeats bitwise identical" in out


def test_divergent_server_exits_1_and_json_has_the_pairs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    b = Behaviour(workload_size=6, gather=6, perturb_passes=frozenset({3}))
    with serve(b) as server:
        code, out, _ = run(["probe", "--server", server.url, *SMALL, "--json"], capsys)
    assert code == 1
    data = json.loads(out)
    assert data["verdict"] == "divergent"
    assert data["detail"]["differing_pairs"] == [[0, 2], [1, 2]]


def test_sequential_flag_and_inconclusive_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with serve(Behaviour(workload_size=6, serialize=True, hold_s=0.01)) as server:
        code, out, _ = run(["probe", "--server", server.url, *SMALL], capsys)
        assert code == 2 and "INCONCLUSIVE" in out
        code, out, _ = run(["probe", "--server", server.url, *SMALL, "--sequential"], capsys)
        assert code == 0 and "| mode | sequential |" in out


def test_extension_without_torch_exits_3(tmp_path: Path, capsys) -> None:
    lib = tmp_path / "x.so"
    lib.write_bytes(b"")
    code, out, _ = run(["probe", "--extension", str(lib), "--env", "VLLM_BATCH_INVARIANT=1"],
                       capsys)
    assert code == 3 and "UNTESTABLE: PyTorch is not importable" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["probe"], "exactly one of --server"),
        (["probe", "--commit", "no-such-ref-xyz"], "unknown ref"),
        (["probe", "--server", "localhost:8000"], "must be an http(s) URL with a host"),
        (["probe", "--extension", "/nonexistent.so"], "no such file"),
        (["probe", "--extension", "/dev/null", "--env", "NOEQUALS"], "KEY=VALUE"),
        (["probe", "--server", "http://127.0.0.1:1", "--repeats", "1"],
         "'--repeats': 1 is not in the range x>=2"),
        (["probe", "--server", "http://127.0.0.1:1", "--recipe", "nope"], "unknown recipe"),
    ],
)
def test_bad_input_is_one_line_naming_the_fix(argv, message, capsys) -> None:
    code, _, err = run(argv, capsys)
    assert code != 0 and message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_extension_runs_without_gitpython_docker_tenacity(tmp_path: Path) -> None:
    # The GPU machine has PyTorch but not these: `python -m bisect_tool.probes` must not need
    # them (importing any of them below raises ImportError).
    lib = tmp_path / "x.so"
    lib.write_bytes(b"")
    code = (
        "import sys, runpy\n"
        "for m in ('git', 'docker', 'tenacity', 'rich', 'filelock'): sys.modules[m] = None\n"
        f"sys.argv = ['bisect_tool.probes', '--extension', {str(lib)!r}]\n"
        "runpy.run_module('bisect_tool.probes', run_name='__main__')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1], check=False)
    assert proc.returncode == 3, proc.stderr
    assert "PyTorch is not importable" in proc.stdout
