"""Shared fixtures.

- ``docker_client``: a client of a running Docker engine, or the test is skipped with the reason
  (``make docker-up`` starts one, saying what it changes first; ``make test`` changes nothing).
- ``base_image``: the offline base image ``BASE_IMAGE`` that scripts/docker-up.sh builds, or skip.
- Runtime fixtures (a pinned package with a real compiled ``_kernels.so`` and a small stdlib HTTP
  server, plus candidate builds of that library) used by tests/test_runtime*.py.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

BASE_IMAGE = "bisect-base:bookworm"

# A shell that starts a job in the background without job control (`make test &`, nohup, some CI
# runners) hands it SIGINT ignored, and every child inherits that: the Ctrl-C tests would then
# time out on a tool that cannot be interrupted. Give the tests' children the default a terminal
# user has (a handler set here is reset to the default in each exec'd child).
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_configure(config: pytest.Config) -> None:
    """The fast tier (``make check`` deselects ``slow``) draws fewer property-test examples:
    tests/tier.py."""
    import tier

    tier.FAST = "not slow" in (config.getoption("markexpr", "") or "")


#: seconds each test file took in the fast tier (scripts/check-durations.py writes it from a
#: ``make check`` run's own timings): what ``make check``'s shares are balanced by
CHECK_SECONDS = Path(__file__).with_name("check-seconds.json")


def shard_files(weights: dict[str, float], count: int) -> list[set[str]]:
    """The test files split into ``count`` shares of about equal seconds: the longest first,
    each to the share with the least so far. Whole files, so that a module's fixtures are built
    in one process only (every other test of a file, as before, built them in both, and halves
    of 102.7 s and 133.0 s came out)."""
    shares: list[set[str]] = [set() for _ in range(count)]
    loads = [0.0] * count
    for name in sorted(weights, key=lambda n: (-weights[n], n)):
        least = loads.index(min(loads))
        shares[least].add(name)
        loads[least] += weights[name]
    return shares


def _my_share() -> set[str] | None:
    """``BISECT_TEST_SHARD=i/n`` (scripts/check.sh): the test files of the i-th of n shares,
    balanced by their measured seconds (``CHECK_SECONDS``; a file not measured yet counts as
    the median file), as paths from the repository root; None when the whole suite runs."""
    import json
    import statistics

    shard = os.environ.get("BISECT_TEST_SHARD", "")
    if not shard:
        return None
    index, count = (int(x) for x in shard.split("/"))
    here = Path(__file__).parent
    measured: dict[str, dict[str, float]] = (
        json.loads(CHECK_SECONDS.read_text()) if CHECK_SECONDS.is_file() else {})
    median = statistics.median([float(v["seconds"]) for v in measured.values()] or [1.0])
    names = [f"tests/{p.name}" for p in sorted(here.glob("test_*.py"))]
    weights = {n: float(measured[n]["seconds"]) if n in measured else median for n in names}
    return shard_files(weights, count)[index]


_SHARE = _my_share()


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under ``BISECT_TEST_SHARD`` a process collects only its own share's test files: n
    processes share the suite, and none pays for importing and collecting the others' (about
    5 s a process). The session's fixtures are built in each."""
    if _SHARE is None or not collection_path.name.startswith("test_") \
            or collection_path.suffix != ".py":
        return None
    return f"tests/{collection_path.name}" not in _SHARE or None


@pytest.fixture(scope="session")
def docker_client() -> Iterator[Any]:
    try:
        import docker

        client = docker.from_env()
        client.ping()
    except Exception as exc:  # the SDK raises several unrelated types when no engine runs
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        pytest.skip(f"Docker engine unavailable: {first} (make docker-up starts one; it says "
                    "what it changes first)")
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="session")
def base_image(docker_client: Any) -> str:
    import docker.errors

    try:
        docker_client.images.get(BASE_IMAGE)
    except docker.errors.ImageNotFound:
        pytest.skip(f"base image {BASE_IMAGE} missing (make docker-up builds it)")
    return BASE_IMAGE


# ---- runtime: a pinned package and candidate builds of its compiled library -------------------

# The pinned stack's "server": stdlib only (it also runs in bisect-base, which has bare python3).
# /whoami reports the sha256 of the _kernels.so it sees beside its own module, the way vLLM would
# load vllm/_C_stable_libtorch.abi3.so beside vllm/__init__.py.
SERVER_SOURCE = textwrap.dedent(
    """
    import argparse, hashlib, json, os, signal, subprocess, sys
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    HERE = os.path.dirname(os.path.abspath(__file__))
    KERNELS = os.path.join(HERE, "_kernels.so")
    MODE = os.environ.get("TEST_SERVER_MODE", "")

    def main():
        parser = argparse.ArgumentParser()
        parser.add_argument("--host", required=True)
        parser.add_argument("--port", type=int, required=True)
        parser.add_argument("--model", default="")
        args = parser.parse_args()
        print("test server starting, mode", repr(MODE), flush=True)
        if os.environ.get("TEST_PRINT_VAR"):  # a server that prints a secret it was given
            print("loaded with", os.environ.get(os.environ["TEST_PRINT_VAR"], ""), flush=True)
        if MODE == "exit":
            print("boom: cannot load kernels", flush=True)
            sys.exit(3)
        marker = os.environ.get("TEST_PORT_MARKER", "")
        if MODE == "port_taken_once" and not os.path.exists(marker):
            open(marker, "w").close()
            print("OSError: [Errno 98] Address already in use", flush=True)
            sys.exit(1)
        child = None
        if os.environ.get("TEST_SERVER_CHILD"):
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        if MODE == "ignore_term":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        else:
            signal.signal(signal.SIGTERM, lambda *a: os._exit(0))

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path == "/health":
                    code = 503 if MODE == "unhealthy" else 200
                    self.send_response(code)
                    self.end_headers()
                    return
                if self.path == "/whoami":
                    with open(KERNELS, "rb") as f:
                        digest = hashlib.sha256(f.read()).hexdigest()
                    body = json.dumps({
                        "sha256": digest,
                        "kernels": KERNELS,
                        "pid": os.getpid(),
                        "child": child.pid if child else None,
                        "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
                        "lifetime": os.environ.get("BISECT_LIFETIME"),
                        "recipe_env": os.environ.get("RECIPE_VAR"),
                        "spec_env": os.environ.get("SPEC_VAR"),
                        "model": args.model,
                        "host": args.host,
                    }).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.write(body)
                    return
                self.send_response(404)
                self.end_headers()

            def log_message(self, *a):
                pass

        ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()

    if __name__ == "__main__":
        main()
    """
)

PINNED_SCHEMAS = (
    "_C::rms_norm(Tensor! result, Tensor input, Tensor? weight, float epsilon) -> ()",
    "_C::fused_add_rms_norm(Tensor! input, Tensor! residual, Tensor? weight, float epsilon) -> ()",
)


def _c_library(schemas: tuple[str, ...], marker: int) -> str:
    text = "\\n".join(schemas)
    return textwrap.dedent(
        f"""
        /* A stand-in for a compiled extension: it exports the schemas of the ops it registers. */
        const char *bisect_op_schemas(void) {{ return "{text}"; }}
        int kernel_build_marker(void) {{ return {marker}; }}
        """
    )


@dataclass(frozen=True)
class Libraries:
    pinned: Path
    same: Path  # same schemas, different build, plus an extra op (fine)
    changed: Path  # rms_norm takes a required weight (an older schema)
    missing: Path  # lacks fused_add_rms_norm
    broken: Path  # not a shared library at all


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="session")
def kernel_libraries(tmp_path_factory: pytest.TempPathFactory) -> Libraries:
    out = tmp_path_factory.mktemp("kernels")
    variants = {
        "pinned": (PINNED_SCHEMAS, 1),
        "same": (PINNED_SCHEMAS + ("_C::extra_op(Tensor x) -> Tensor",), 2),
        "changed": (
            (
                "_C::rms_norm(Tensor! result, Tensor input, Tensor weight, float epsilon) -> ()",
                PINNED_SCHEMAS[1],
            ),
            3,
        ),
        "missing": (PINNED_SCHEMAS[:1], 4),
    }
    paths: dict[str, Path] = {}
    for name, (schemas, marker) in variants.items():
        src = out / f"{name}.c"
        src.write_text(_c_library(schemas, marker))
        lib = out / name / "_kernels.so"
        lib.parent.mkdir()
        subprocess.run(
            ["gcc", "-shared", "-fPIC", "-O1", "-o", str(lib), str(src)],
            check=True,
            capture_output=True,
        )
        paths[name] = lib
    broken = out / "broken" / "_kernels.so"
    broken.parent.mkdir()
    broken.write_bytes(b"this is not an ELF file\n")
    return Libraries(broken=broken, **paths)


@pytest.fixture()
def pinned_site(tmp_path: Path, kernel_libraries: Libraries) -> Path:
    """A site-packages holding ``demopkg`` (server + pinned ``_kernels.so``)."""
    site = tmp_path / "site"
    pkg = site / "demopkg"
    (pkg / "sub" / "__pycache__").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "server.py").write_text(SERVER_SOURCE)
    (pkg / "sub" / "__init__.py").write_text("VALUE = 1\n")
    (pkg / "_kernels.so").write_bytes(kernel_libraries.pinned.read_bytes())
    return site


def tree_state(root: Path) -> dict[str, str]:
    """Every path under ``root`` with its content hash (or link target): 'unchanged' proof."""
    state: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            state[rel] = "link:" + str(path.readlink())
        elif path.is_file():
            state[rel] = sha256(path)
        else:
            state[rel] = "dir"
    return state


PYTHON = sys.executable


# ---- a real simple index holding real wheels of the demo engine (tests/wheelindex.py) -------


@pytest.fixture(scope="session")
def demollm_wheels(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``wheelindex.DemoWheels``: each release of ``wheelindex.RELEASES`` as a real wheel, each
    kernel variant compiled once per session."""
    import shutil

    from wheelindex import build_demo_wheels

    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler to build the demo wheels (apt-get install gcc)")
    return build_demo_wheels(tmp_path_factory.mktemp("demollm-wheels"))


@pytest.fixture()
def demollm_index(demollm_wheels: Any) -> Iterator[Any]:
    """``wheelindex.DemoIndex`` serving ``demollm_wheels`` on loopback; ``.index_url`` is what
    PIP_INDEX_URL would be; ``.stop()`` plays offline."""
    from wheelindex import DemoIndex

    with DemoIndex.of(demollm_wheels) as index:
        yield index
