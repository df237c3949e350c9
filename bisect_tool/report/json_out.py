"""The report as JSON: the facts dict as it is (the Markdown's twin)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def render_json(report: Mapping[str, Any]) -> str:
    return json.dumps(report, indent=2, sort_keys=True, allow_nan=False, default=str) + "\n"
