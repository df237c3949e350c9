"""Where this tool keeps its files on a machine (what is not the state dir of one bisect).

No third-party imports at module level: the GPU machine imports this without them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

APP_NAME = "bisect"


def default_cache_dir(setting: str = "", env: Mapping[str, str] | None = None) -> Path:
    """The recipe's ``[artifacts] cache_dir``, else $BISECT_CACHE_DIR, else the platform's user
    cache dir for ``bisect`` (platformdirs: ``$XDG_CACHE_HOME/bisect`` or ``~/.cache/bisect``
    on Linux, ``~/Library/Caches/bisect`` on macOS)."""
    env = os.environ if env is None else env
    if setting:
        return Path(setting).expanduser()
    if env.get("BISECT_CACHE_DIR"):
        return Path(env["BISECT_CACHE_DIR"]).expanduser()
    try:
        import platformdirs  # here, not at the top: see the module docstring
    except ImportError:  # a GPU machine given only the stdlib and click/httpx
        return Path.home() / ".cache" / APP_NAME
    return Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False))
