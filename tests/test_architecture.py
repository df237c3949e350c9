"""The import rules of the design, enforced: no import cycle in bisect_tool, the pure core
imports no I/O library (ruff's banned-api, configured in pyproject.toml), the core passes
mypy's strict flags."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "bisect_tool"


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """bisect_tool's modules -> the bisect_tool modules each imports (function-level imports
    included: a lazy import is still a dependency). ``from pkg import sub`` depends on ``sub``;
    ``from pkg import name`` on ``pkg``."""
    modules: dict[str, Path] = {}
    for path in (root / "bisect_tool").rglob("*.py"):
        if "demo/stack" in path.as_posix():
            continue  # the demo target's own code, run by the pinned stack, not the tool
        parts = path.relative_to(root).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    here = name.split(".") if is_package else name.split(".")[:-1]
                    here = here[: len(here) - (node.level - 1)]
                    base = ".".join([*here, *([node.module] if node.module else [])])
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in modules else base)
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def unresolved_imports(root: Path = ROOT) -> list[str]:
    """``bisect_tool`` imports that name no module here: a function-level import of a moved
    module passes every import-time check and fails only when that branch runs."""
    missing: list[str] = []
    for path in (root / "bisect_tool").rglob("*.py"):
        if "demo/stack" in path.as_posix():
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names = [node.module]
            for module in names:
                if module.split(".")[0] != "bisect_tool":
                    continue
                relative = Path(*module.split("."))
                if not ((root / relative).with_suffix(".py").exists()
                        or (root / relative / "__init__.py").exists()):
                    missing.append(f"{path.relative_to(root)}:{node.lineno}: {module}")
    return missing


def test_every_import_of_the_tool_names_a_module_that_exists() -> None:
    assert unresolved_imports() == []


def test_the_import_check_sees_a_moved_module(tmp_path: Path) -> None:
    pkg = tmp_path / "bisect_tool"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from bisect_tool.gone import g\n")
    assert unresolved_imports(tmp_path) == ["bisect_tool/a.py:2: bisect_tool.gone"]


def test_bisect_tool_has_no_import_cycle() -> None:
    graph = import_graph()
    assert len(graph) > 40  # the walk found the package
    assert cycles(graph) == []


def room(module: str, root: Path = ROOT) -> str:
    """The room a module lives in: its sub-package of bisect_tool (``bisect_tool.artifacts``),
    or, for a module directly under bisect_tool, the module itself."""
    parts = module.split(".")
    if len(parts) >= 2 and (root / "bisect_tool" / parts[1]).is_dir():
        return ".".join(parts[:2])
    return module


def folder_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """The import graph between rooms (function-level imports included, as in
    ``import_graph``): the package's own sub-packages must not import each other both ways."""
    rooms: dict[str, set[str]] = {}
    for module, targets in import_graph(root).items():
        here = room(module, root)
        rooms.setdefault(here, set())
        for target in targets:
            there = room(target, root)
            if there != here and there != "bisect_tool":
                rooms[here].add(there)
    return rooms


def test_no_two_folders_import_each_other() -> None:
    graph = folder_graph()
    assert {"bisect_tool.artifacts", "bisect_tool.runtime", "bisect_tool.evaluate"} <= set(graph)
    assert cycles(graph) == []


def test_the_folder_check_sees_a_cycle_made_in_a_function(tmp_path: Path) -> None:
    pkg = tmp_path / "bisect_tool"
    for sub in ("a", "b"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a" / "x.py").write_text("from bisect_tool.b import y\n")
    (pkg / "b" / "y.py").write_text("def f():\n    from bisect_tool.a.x import g\n")
    assert cycles(folder_graph(tmp_path)) == [["bisect_tool.a", "bisect_tool.b"]]


def test_the_cycle_check_sees_a_cycle(tmp_path: Path) -> None:
    pkg = tmp_path / "bisect_tool"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from bisect_tool import b\n")
    (pkg / "b.py").write_text("def f():\n    from bisect_tool.a import x\n")
    assert cycles(import_graph(tmp_path)) == [["bisect_tool.a", "bisect_tool.b"]]


CORE = ["strategy", "designs", "verdict.py", "values.py", "events.py", "cause.py", "report",
        "kinds"]


def _ruff() -> str:
    exe = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if exe is None:
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    return exe


def test_the_core_imports_no_io_library() -> None:
    done = subprocess.run(
        [_ruff(), "check", "--select", "TID251", *(str(PACKAGE / c) for c in CORE)],
        capture_output=True, text=True, cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout


@pytest.mark.parametrize("library", ["httpx", "docker", "git", "click", "subprocess"])
def test_ruff_refuses_an_io_import_in_the_core(tmp_path: Path, library: str) -> None:
    # The rule as configured, applied to a copy of the core with one forbidden import added.
    copy = tmp_path / "bisect_tool"
    (copy / "report").mkdir(parents=True)
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (copy / "verdict.py").write_text(f'"""x"""\n\nimport {library}\n\nprint({library})\n')
    (copy / "run.py").write_text(f'"""x"""\n\nimport {library}\n\nprint({library})\n')
    done = subprocess.run(
        [_ruff(), "check", "--select", "TID251", "."], capture_output=True, text=True,
        cwd=tmp_path,
    )
    assert done.returncode == 1
    assert "bisect_tool/verdict.py" in done.stdout and "TID251" in done.stdout
    assert "bisect_tool/run.py" not in done.stdout  # outside the core, I/O is allowed


@pytest.mark.slow
def test_lint_and_types_are_clean() -> None:
    """`make lint` as part of `make test`: ruff over the tree, mypy over bisect_tool and bench."""
    ruff = subprocess.run(
        [_ruff(), "check", "bisect_tool", "tests", "bench"], capture_output=True, text=True,
        cwd=ROOT,
    )
    assert ruff.returncode == 0, ruff.stdout
    mypy = subprocess.run(
        [sys.executable, "-m", "mypy", "bisect_tool", "bench"], capture_output=True, text=True,
        cwd=ROOT,
    )
    if "No module named mypy" in mypy.stderr:
        pytest.skip("mypy is not installed (pip install -e '.[dev]')")
    assert mypy.returncode == 0, mypy.stdout[-3000:]


# -- probe kinds: told apart by their specs, never by name --------------------------------------


def _strings(node: ast.AST) -> set[str]:
    """The string constants ``node`` is, or holds as a tuple, list or set."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return set().union(*(_strings(e) for e in node.elts))
    return set()


def kind_matches(root: Path = ROOT) -> list[str]:
    """Lines outside ``bisect_tool/probes/`` that tell probe kinds apart by name: a comparison of
    something called a kind with a kind's name (``probe.kind == "server"``,
    ``report.get("probe_kind") in ("op", "run")``), a table keyed by two kinds' names, or the
    retired ``ProbeKind`` enum. Each should read a field of the kind's spec
    (``bisect_tool.kinds``)."""
    from bisect_tool.kinds import COMMAND, KINDS

    names = {*KINDS, COMMAND.name}
    found: list[str] = []
    for path in sorted((root / "bisect_tool").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("bisect_tool/probes/") or "demo/stack" in rel:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                said = set().union(*(_strings(n) for n in [node.left, *node.comparators]))
                hit = bool(said & names) and "kind" in ast.unparse(node)
            elif isinstance(node, ast.Dict):
                keys = [k for k in node.keys if k is not None]
                hit = len(set().union(*map(_strings, keys)) & names) >= 2
            else:
                hit = (isinstance(node, ast.Name) and node.id == "ProbeKind") or (
                    isinstance(node, ast.Attribute) and node.attr == "ProbeKind")
            if hit:
                found.append(f"{rel}:{getattr(node, 'lineno', 0)}")
    return found


def test_no_module_outside_the_probes_matches_a_probe_kind_by_name() -> None:
    assert kind_matches() == []


def test_the_kind_check_sees_a_match_by_name(tmp_path: Path) -> None:
    pkg = tmp_path / "bisect_tool"
    (pkg / "probes").mkdir(parents=True)
    (pkg / "report.py").write_text(
        'def f(probe, report, kind):\n'
        '    if probe.kind == "server":\n'
        '        return 1\n'
        '    if report.get("probe_kind") in ("op", "run"):\n'
        '        return 2\n'
        '    return {"server": 3, "op": 4}[kind]\n'
        'def g(mode, entry_kind):\n'
        '    return mode == "run" or entry_kind == "observation"\n'
    )
    (pkg / "probes" / "render.py").write_text('def f(kind):\n    return kind == "op"\n')
    assert kind_matches(tmp_path) == ["bisect_tool/report.py:2", "bisect_tool/report.py:4",
                                      "bisect_tool/report.py:6"]


def test_one_line_in_the_registry_makes_a_probe_kind_a_recipe_may_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bisect_tool import kinds
    from bisect_tool.errors import RecipeError
    from bisect_tool.recipes import recipe

    named = {"name": "x", "probe": {"kind": "echo"}}
    narrowed = {"name": "x", "probe": {"narrow": "echo"}}
    for data in (named, narrowed):
        with pytest.raises(RecipeError, match="must be one of"):
            recipe.from_dict(data)
    monkeypatch.setitem(kinds.KINDS, "echo", kinds.ProbeSpec(name="echo", narrows=True))
    assert recipe.from_dict(named).probe.kind == "echo"
    assert recipe.from_dict(narrowed).probe.narrow == "echo"


def test_every_probe_kind_has_its_evaluators_and_run_is_none() -> None:
    """``[probe] kind = "run"`` was refused by recipe validation, so its factory never ran: a
    command is ``bisect start --run`` (``bisect_tool.evaluate.command``), whose report the
    ``COMMAND`` spec describes."""
    from bisect_tool import kinds
    from bisect_tool.run import wiring

    assert set(wiring.PROBES) == set(kinds.KINDS)
    assert set(wiring.NARROW) == set(kinds.narrow_choices()) - {""}
    assert kinds.COMMAND.name not in kinds.KINDS
    assert all(name == spec.name for name, spec in kinds.KINDS.items())
