"""Source builds of a real C project in a real git repository (gcc), on the host and in Docker."""

from __future__ import annotations

import ctypes
import dataclasses
import time
from pathlib import Path
from typing import Any

import git
import pytest

from bisect_tool.artifacts import make_provider
from bisect_tool.errors import BuildFailed
from bisect_tool.recipes.recipe import ArtifactSettings

SO = "demollm/_kernels.so"
MAKEFILE = "demollm/_kernels.so: kernels.c\n\tmkdir -p demollm\n\tgcc -O2 -shared -fPIC -o $@ $<\n"


@pytest.fixture
def project(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A repo with three commits: version 1 (tagged), a syntax error, version 3."""
    path = tmp_path / "repo"
    repo = git.Repo.init(path)
    with repo:
        repo.config_writer().set_value("user", "name", "t").release()
        repo.config_writer().set_value("user", "email", "t@example.com").release()
        (path / "Makefile").write_text(MAKEFILE)
        shas = {}
        for name, body in [
            ("v1", "int version(void) { return 1; }\n"),
            ("broken", "int version(void) { return 2 }\n"),
            ("v3", "int version(void) { return 3; }\n"),
        ]:
            (path / "kernels.c").write_text(body)
            repo.index.add(["Makefile", "kernels.c"])
            shas[name] = repo.index.commit(name).hexsha
        repo.create_tag("v0.1.0", ref=shas["v1"])
    return path, shas


def settings(tmp_path: Path, executor: str, command: str = "make") -> ArtifactSettings:
    return ArtifactSettings(
        sources=("source-build",),
        swap_set=(SO,),
        build_executor=executor,
        build_command=command,
        cache_dir=str(tmp_path / "cache"),
    )


def version_of(path: Path) -> int:
    return int(ctypes.CDLL(str(path)).version())


def assert_checkout_untouched(repo_path: Path, head: str) -> None:
    with git.Repo(repo_path) as repo:
        assert repo.head.commit.hexsha == head
        assert not repo.is_dirty(untracked_files=True)
        assert len(repo.git.worktree("list").splitlines()) == 1  # the build worktree is gone


def test_host_build_produces_the_swap_set_of_each_commit(tmp_path, project):
    repo, shas = project
    logs = tmp_path / "logs"
    with make_provider(settings(tmp_path, "host"), repo, log_dir=logs) as provider:
        first = provider.get(shas["v1"])
        third = provider.get(shas["v3"])
    assert version_of(first.files[SO]) == 1
    assert version_of(third.files[SO]) == 3
    assert first.source == "source-build"
    assert (logs / f"build-{shas['v1'][:12]}.log").read_text().count("gcc") == 1
    assert_checkout_untouched(repo, shas["v3"])


def test_failed_build_raises_with_the_log_tail(tmp_path, project):
    repo, shas = project
    with (
        make_provider(settings(tmp_path, "host"), repo) as provider,
        pytest.raises(BuildFailed) as err,
    ):
        provider.get(shas["broken"])
    message = str(err.value)
    assert "source-build" in message and "exit 2" in message
    assert "error" in message and "kernels.c" in message  # gcc's own words, from the log
    assert not list((tmp_path / "cache" / "manifests").iterdir())
    assert_checkout_untouched(repo, shas["v3"])


def test_build_that_misses_a_swap_file_names_it(tmp_path, project):
    repo, shas = project
    with (
        make_provider(settings(tmp_path, "host", command="true"), repo) as provider,
        pytest.raises(BuildFailed, match=f"did not produce {SO}"),
    ):
        provider.get(shas["v1"])
    assert_checkout_untouched(repo, shas["v3"])


@pytest.mark.docker
def test_docker_build_in_the_builder_stage(tmp_path, project, docker_client: Any, base_image):
    repo, shas = project
    cfg = settings(tmp_path, "docker")
    with make_provider(cfg, repo, docker_client=docker_client) as provider:
        assert version_of(provider.get(shas["v1"]).files[SO]) == 1
        with pytest.raises(BuildFailed, match="kernels.c"):
            provider.get(shas["broken"])
        assert version_of(provider.get(shas["v3"]).files[SO]) == 3
    assert_checkout_untouched(repo, shas["v3"])
    labelled = docker_client.containers.list(all=True, filters={"label": "bisect.role=build"})
    assert labelled == []  # every build container was removed


def test_host_build_past_its_timeout_is_killed_with_its_children(tmp_path, project):
    """A hung build does not stall the bisect: it is killed, compiler and all, and the candidate
    is untestable with a message that names the knob."""
    repo, shas = project
    pid_file = tmp_path / "child.pid"
    hung = dataclasses.replace(
        settings(tmp_path, "host", command=f"sleep 60 & echo $! > {pid_file}; wait"),
        build_timeout_s=1,
    )
    started = time.monotonic()
    with (
        make_provider(hung, repo) as provider,
        pytest.raises(BuildFailed, match=r"(?s)still running after 1 s.*build_timeout_s") as err,
    ):
        provider.get(shas["v1"])
    assert time.monotonic() - started < 30
    assert "source-build" in str(err.value)
    assert not _running(int(pid_file.read_text()))
    assert_checkout_untouched(repo, shas["v3"])


@pytest.mark.docker
def test_docker_build_past_its_timeout_is_killed_and_removed(
    tmp_path, project, docker_client: Any, base_image
):
    repo, shas = project
    hung = dataclasses.replace(
        settings(tmp_path, "docker", command="echo started; sleep 120"), build_timeout_s=3
    )
    started = time.monotonic()
    with (
        make_provider(hung, repo, docker_client=docker_client) as provider,
        pytest.raises(BuildFailed, match=r"(?s)still running after 3 s.*started"),
    ):
        provider.get(shas["v1"])
    assert time.monotonic() - started < 60
    labelled = docker_client.containers.list(all=True, filters={"label": "bisect.role=build"})
    assert labelled == []
    assert_checkout_untouched(repo, shas["v3"])


def _running(pid: int) -> bool:
    """Alive and not a zombie waiting for whoever adopted it to reap it."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_host_build_carries_the_session_label_so_a_killed_run_can_end_it(tmp_path, project):
    """kill -9 of bisect mid-build leaves the build running, adopted by init: it carries the
    session label, so `resume`/`reset` find its process group and end it (children.py)."""
    import subprocess
    import sys
    import textwrap

    from bisect_tool.runtime.children import end_labelled
    from bisect_tool.runtime.local import pids_with_env

    repo, shas = project
    pid_file = tmp_path / "build.pid"
    slow = settings(tmp_path, "host", command=f"echo $$ > {pid_file}; exec sleep 120")
    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent(f"""
        from pathlib import Path
        from bisect_tool.artifacts import make_provider
        from bisect_tool.recipes.recipe import ArtifactSettings
        s = ArtifactSettings(**{dataclasses.asdict(slow)!r})
        with make_provider(s, Path({str(repo)!r}), session="sess-build-1") as p:
            p.get({shas["v1"]!r})
    """))
    driver = subprocess.Popen([sys.executable, str(script)])
    try:
        for _ in range(600):  # bounded wait for the build to start (not a timing assertion)
            if pid_file.exists() and pid_file.read_text().strip():
                break
            time.sleep(0.1)
        build_pid = int(pid_file.read_text())
    finally:
        driver.kill()  # kill -9 of the tool
        driver.wait()
    assert _running(build_pid)
    assert build_pid in pids_with_env("BISECT_SESSION", "sess-build-1")
    assert end_labelled("sess-build-1") == 1
    for _ in range(100):
        if not _running(build_pid):
            break
        time.sleep(0.1)
    assert not _running(build_pid)
