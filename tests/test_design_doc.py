"""docs/DESIGN.md names the code as it is: every path it cites exists and every dotted name
resolves to a module or an attribute of one. A rename that leaves the map behind fails here."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "DESIGN.md"
TEXT = DOC.read_text()
PATHS = sorted(set(re.findall(r"\b((?:bisect_tool|tests|docs)/[\w/.-]*\w/?)", TEXT)))
NAMES = sorted(set(re.findall(r"`(bisect_tool(?:\.\w+)+)`", TEXT)))


def resolve(dotted: str) -> object:
    """The module or attribute ``dotted`` names (ImportError/AttributeError if none)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            found = getattr(found, name)
        return found
    raise ImportError(dotted)


def test_the_doc_cites_enough_to_be_a_map() -> None:
    assert len(PATHS) > 20 and len(NAMES) > 20


@pytest.mark.parametrize("path", PATHS)
def test_every_path_it_cites_exists(path: str) -> None:
    assert (ROOT / path).exists(), f"docs/DESIGN.md cites {path}, which is not in the tree"


@pytest.mark.parametrize("name", NAMES)
def test_every_name_it_cites_resolves(name: str) -> None:
    resolve(name)


def test_a_name_that_does_not_exist_is_caught() -> None:
    with pytest.raises((ImportError, AttributeError)):
        resolve("bisect_tool.run.engine.NoSuchEngine")
