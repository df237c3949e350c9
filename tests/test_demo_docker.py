"""`bisect demo --backend docker`: the demo's lifetimes in containers of an image derived from the
offline base image, with the candidate's ``_kernels.so`` mounted over the pinned one.

Needs a running engine and bisect-base:bookworm (scripts/docker-up.sh); skipped with the reason
otherwise. The full demo run is marked slow (about 2.5 min on 2 cores): ``-m "not slow"`` leaves
it out.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bisect_tool import journal as journal_mod
from bisect_tool.demo import image, pinned
from bisect_tool.demo.cli import write_recipe
from bisect_tool.demo.history import generate
from bisect_tool.labels import LABEL_SESSION, LABEL_TOOL, TOOL_NAME
from bisect_tool.recipes import recipe as recipe_mod
from bisect_tool.run.wiring import open_evaluators
from bisect_tool.values import Verdict

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def demo_image(docker_client: Any, base_image: str) -> str:
    return image.ensure_image(docker_client, base=base_image)


def left_over(docker_client: Any, session: str) -> list[str]:
    found = docker_client.containers.list(
        all=True, filters={"label": [f"{LABEL_TOOL}={TOOL_NAME}", f"{LABEL_SESSION}={session}"]}
    )
    return [c.name for c in found]


def test_image_tag_follows_the_stack_sources(tmp_path: Path) -> None:
    stack = tmp_path / "stack"
    stack.mkdir()
    (stack / "setup.py").write_text("print('v1')\n")
    first = image.image_tag(stack)
    (stack / "demollm").mkdir()
    (stack / "demollm" / "_kernels.so").write_bytes(b"a host build: not an input")
    assert image.image_tag(stack) == first
    (stack / "setup.py").write_text("print('v2')\n")
    assert image.image_tag(stack) != first
    assert first.startswith("bisect-demo-stack:")


def test_image_runs_the_pinned_stack(docker_client: Any, demo_image: str) -> None:
    out = docker_client.containers.run(
        demo_image,
        ["python3", "-c", "import demollm, numpy; print(demollm.__file__)"],
        network_mode="host",
        remove=True,
    )
    assert out.decode().strip() == f"{image.STACK_IN_IMAGE}/demollm/__init__.py"


def test_one_lifetime_in_a_container_serves_the_candidate_build(
    tmp_path: Path, docker_client: Any, demo_image: str
) -> None:
    history = generate(tmp_path / "repo", commits=80)
    pinned.ensure_pinned_build()
    recipe = recipe_mod.load(
        str(write_recipe(tmp_path / "recipe.toml", tmp_path / "cache", image=demo_image))
    )
    assert recipe.runtime.backend == "docker" and recipe.runtime.image == demo_image
    sha = history.planted_commit
    session = f"test-demo-docker-{secrets.token_hex(4)}"
    state = tmp_path / "state"
    with open_evaluators(recipe, history.repo, session, state, {}) as evaluators:
        evaluator = evaluators.faithful
        obs = evaluator.evaluate(sha, "lt-0")
        swap = evaluator._swap(sha, ())  # type: ignore[attr-defined]
    assert obs.verdict in (Verdict.CLEAN, Verdict.INCONCLUSIVE), obs.message  # the fixed kernel
    built = hashlib.sha256(Path(swap.files[pinned.SWAP_PATH]).read_bytes()).hexdigest()
    log = (state / "logs" / "lt-0.log").read_text()
    # The server in the container loaded the candidate's file at the image's pinned path.
    assert f"kernels={image.STACK_IN_IMAGE}/demollm/_kernels.so" in log
    assert f"kernels_sha256={built}" in log
    assert obs.detail["distinct_outputs"] == 1
    assert left_over(docker_client, session) == []


@pytest.mark.slow
def test_demo_with_docker_backend_finds_the_planted_fix(
    tmp_path: Path, docker_client: Any, demo_image: str
) -> None:
    workdir = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "bisect_tool", "demo", "--backend", "docker", "--workdir",
         str(workdir), "--json", "--commits", "80"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert summary["state"] == "done"
    assert summary["flip_commit"] == summary["planted_commit"]
    header = journal_mod.read(Path(summary["state_dir"]) / journal_mod.JOURNAL_NAME).header
    assert header["recipe"]["runtime"]["backend"] == "docker"
    assert header["recipe"]["runtime"]["image"] == demo_image
    assert header["session"] and left_over(docker_client, str(header["session"])) == []
    print(f"\ndemo --backend docker --commits 80: {summary['wall_s']} s, "
          f"{summary['lifetimes']} lifetimes, breakdown {summary['breakdown']}")
