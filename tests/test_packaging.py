"""What the package declares: every library its code imports, and the license file its metadata
names (issue 41: `requests` was imported but not declared; no LICENSE though the metadata said
Apache-2.0)."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

#: import name -> the distribution that provides it, where the two differ
DISTRIBUTION = {"git": "gitpython"}
#: imported only inside the pinned stack's interpreter (a child process: the op check loads the
#: candidate's extension into PyTorch there), never by the tool's own
PINNED_ONLY = {"torch"}
#: the engine the demo runs, shipped inside bisect_tool/demo/stack (package data, not a library)
DEMO_STACK = "demo/stack"


def _requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\s\[<>=!~;]", r, maxsplit=1)[0].lower().replace("_", "-")
            for r in requirements}


def _imported() -> dict[str, set[str]]:
    """Top-level third-party modules the tool's code imports, with the files importing each."""
    found: dict[str, set[str]] = {}
    for path in (ROOT / "bisect_tool").rglob("*.py"):
        rel = path.relative_to(ROOT / "bisect_tool").as_posix()
        if rel.startswith(DEMO_STACK):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "bisect_tool":
                    found.setdefault(top, set()).add(rel)
    return found


def test_every_library_the_tool_imports_is_declared() -> None:
    project = PYPROJECT["project"]
    declared = _requirement_names(project["dependencies"])
    extras = {name: _requirement_names(reqs)
              for name, reqs in project["optional-dependencies"].items() if name != "dev"}
    optional = set().union(*extras.values())
    undeclared = {}
    for module, files in _imported().items():
        if module in PINNED_ONLY:
            continue
        dist = DISTRIBUTION.get(module, module).lower().replace("_", "-")
        if dist not in declared and dist not in optional:
            undeclared[module] = sorted(files)
    assert undeclared == {}, f"imported but not declared in pyproject.toml: {undeclared}"
    assert "requests" in declared  # the Docker SDK's transport, caught by name


def test_the_license_file_is_the_one_the_metadata_names() -> None:
    project = PYPROJECT["project"]
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text.splitlines()[1]
    assert "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
