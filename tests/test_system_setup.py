"""The first commands change nothing outside the clone; the system changes the Docker tests need
are `make docker-up`'s, said before they are made and refused unless asked for, and `make
docker-down` undoes them, removing only what it proves is the tool's own (issue 41: `make test`
installed 28 apt packages as root, started a root dockerd that kept running and left four images,
with nothing to undo it).

What cannot happen in a test (apt-get install as root, a second root dockerd beside the shared
one) is replaced by programs on PATH that log how they were called: the tests check the exact
commands the scripts run, and that without consent they run none that changes anything. The
engine check stops a real process named dockerd; the image check removes real images of a real
engine, under repository names no one else uses."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
UP = ROOT / "scripts" / "docker-up.sh"
DOWN = ROOT / "scripts" / "docker-down.sh"


def _make_n(target: str) -> str:
    done = subprocess.run(["make", "-n", target, "VENV=/nonexistent/venv"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=True)
    return done.stdout


def test_make_test_and_make_demo_change_nothing_outside_the_clone() -> None:
    for target in ("test", "demo", "check"):
        commands = _make_n(target)
        for system in ("docker-up", "apt-get", "dockerd", "sudo", "debootstrap"):
            assert system not in commands, (target, commands)
    # the demo installs what it needs (the package, 133 MB), not the dev and ray extras (683 MB)
    demo = _make_n("demo")
    assert "pip install --quiet -e .\n" in demo and "[dev" not in demo and "ray" not in demo
    assert "pip install --quiet -e '.[dev,ray]'" in _make_n("test")


def test_ci_runs_the_readmes_test_command_with_the_setup_step_around_it() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    steps = [line.strip() for line in ci.splitlines()
             if line.strip().startswith(("make ", "trap "))]
    assert steps[0].startswith("make docker-up CONFIRM=yes")
    assert "make docker-down CONFIRM=yes" in steps[1]
    assert steps[-1] == "make test"
    assert "make test " in readme and "make docker-up" in readme and "make docker-down" in readme


# -- scripts/docker-up.sh and docker-down.sh with logging stand-ins on PATH ----------------------

STUB = """#!/bin/sh
echo "$(basename "$0") $*" >> "{log}"
{body}
"""


def _stubs(tmp_path: Path, bodies: dict[str, str]) -> tuple[dict[str, str], Path]:
    """An environment whose PATH finds the stand-ins first, then only /usr/bin and /bin (no
    dockerd, debootstrap or docker of this machine), and the log they write."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "calls.log"
    log.touch()
    for name, body in bodies.items():
        path = bindir / name
        path.write_text(STUB.format(log=log, body=body))
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    env = {**os.environ, "PATH": f"{bindir}:/usr/bin:/bin",
           "BISECT_SYSTEM_DIR": str(tmp_path / "record"), "HOME": str(tmp_path)}
    env.pop("CONFIRM", None)
    return env, log


#: a machine with no engine and no image: docker answers nothing, apt simulates two packages
NO_ENGINE = {
    "docker": "exit 1",
    "apt-get": 'case "$1" in -s) echo "Inst docker.io"; echo "Inst runc";; esac',
    "sudo": "", "setsid": "", "dpkg-query": "",
}


def test_docker_up_says_what_it_would_change_and_without_consent_changes_nothing(
    tmp_path: Path,
) -> None:
    env, log = _stubs(tmp_path, NO_ENGINE)
    done = subprocess.run(["bash", str(UP)], env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    out = done.stdout
    assert "apt-get install docker.io debootstrap as root (2 packages" in out
    assert "start a root dockerd (--bridge=none --iptables=false --ip6tables=false" in out
    assert "keeps running until make docker-down" in out
    assert "build bisect-base:bookworm" in out and "label bisect.image=bisect-base" in out
    assert "nothing changed; run `make docker-up CONFIRM=yes`" in out
    calls = log.read_text().splitlines()
    # asked, never changed: only the engine's state and apt's simulation were run
    assert calls and all(c.startswith(("docker info", "docker image inspect", "apt-get -s"))
                         for c in calls), calls
    assert not (tmp_path / "record").exists()
    # any answer but yes is no
    env["CONFIRM"] = "maybe"
    done = subprocess.run(["bash", str(UP)], env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "nothing changed (CONFIRM=maybe" in done.stdout


def test_docker_up_with_the_engine_up_and_the_image_there_has_nothing_to_do(
    tmp_path: Path,
) -> None:
    env, log = _stubs(tmp_path, {"docker": "exit 0", "dockerd": "", "debootstrap": ""})
    done = subprocess.run(["bash", str(UP)], env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "nothing to change: the engine is up and bisect-base:bookworm is present" in done.stdout


def _start_time(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]


@pytest.fixture
def fake_dockerd(tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A real process named dockerd (a copy of sleep), as the engine docker-up started."""
    program = tmp_path / "dockerd"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", program)
    proc = subprocess.Popen([str(program), "600"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_docker_down_stops_the_engine_docker_up_started_and_only_that_one(
    tmp_path: Path, fake_dockerd: subprocess.Popen[bytes]
) -> None:
    env, log = _stubs(tmp_path, {"docker": "exit 1", "sudo": "", "apt-get": ""})
    record = tmp_path / "record"
    record.mkdir()
    pid = fake_dockerd.pid
    # a pid reused by another process: its start time differs, so it is left alone
    (record / "engine").write_text(f"{pid} 1\n")
    (record / "packages").write_text("bisect-test-no-such-package\n")
    done = subprocess.run(["bash", str(DOWN)], env={**env, "CONFIRM": "yes"},
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (f"the dockerd docker-up started (pid {pid}) is gone, or its pid is another"
            in done.stdout)
    assert fake_dockerd.poll() is None  # still running
    assert "apt-get" not in log.read_text()  # a package no longer installed is not removed
    # the one it recorded: asked first, stopped with consent
    record.mkdir(exist_ok=True)
    (record / "engine").write_text(f"{pid} {_start_time(pid)}\n")
    done = subprocess.run(["bash", str(DOWN)], env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and f"stop the dockerd docker-up started (pid {pid})" in done.stdout
    assert "nothing changed" in done.stdout and fake_dockerd.poll() is None
    done = subprocess.run(["bash", str(DOWN)], env={**env, "CONFIRM": "yes"},
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"stopped dockerd (pid {pid})" in done.stdout
    deadline = time.monotonic() + 10  # a bound on the wait, not a timing assertion
    while fake_dockerd.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert fake_dockerd.poll() is not None
    assert not record.exists()  # nothing left to undo


@pytest.mark.docker
def test_docker_down_removes_the_tools_images_and_keeps_one_that_only_inherited_the_label(
    tmp_path: Path, docker_client: Any, base_image: str
) -> None:
    import io
    import tarfile

    repo = f"bisect-test-down-{uuid.uuid4().hex[:8]}"
    empty = io.BytesIO()
    with tarfile.open(fileobj=empty, mode="w"):
        pass
    made = []
    for tag, label in (("own", repo), ("derived", "bisect-base")):
        image = docker_client.api.import_image_from_data(
            empty.getvalue(), repository=repo, tag=tag, changes=[f"LABEL bisect.image={label}"])
        made.append(f"{repo}:{tag}")
        assert image
    # a container a crashed run left (the tool's label): it holds its image, which `docker rmi`
    # alone then refuses (CI, 2026-12-07)
    left = docker_client.containers.create(
        f"{repo}:own", command=["/left-by-a-crash"],
        labels={"bisect.tool": "bisect", "bisect.session": "crashed"})
    # one a live run is using: kept, and named
    live = docker_client.containers.run(
        base_image, ["sleep", "120"], detach=True, network_mode="host",
        labels={"bisect.tool": "bisect", "bisect.session": "live"})
    try:
        docker = shutil.which("docker")
        assert docker
        env = {**os.environ, "BISECT_IMAGE_REPOS": repo, "CONFIRM": "yes",
               "BISECT_SYSTEM_DIR": str(tmp_path / "record")}
        done = subprocess.run(["bash", str(DOWN)], env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        tags = {t for i in docker_client.images.list(name=repo) for t in i.tags}
        assert tags == {f"{repo}:derived"}, done.stdout
        assert f"removed {repo}:own" in done.stdout
        assert f"removed container {left.short_id}" in done.stdout
        assert not docker_client.containers.list(all=True, filters={"id": left.id})
        assert f"keep the running container {live.short_id}" in done.stdout
        live.reload()
        assert live.status == "running"
        assert f"keep {repo}:derived (label bisect.image=bisect-base, not {repo}" in done.stdout
    finally:
        with contextlib.suppress(Exception):  # already removed by the script
            left.remove(force=True)
        live.remove(force=True)
        for ref in made:
            with contextlib.suppress(Exception):  # already removed by the script
                docker_client.images.remove(ref, force=True)
