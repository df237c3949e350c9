"""bisect: find the vLLM commit that introduced or fixed an intermittent kernel bug."""

from importlib.metadata import PackageNotFoundError, version

try:
    # pyproject.toml is the one place the version is written; this reads what pip installed.
    __version__ = version("bisect-tool")
except PackageNotFoundError:  # a source tree on sys.path that was never pip-installed
    __version__ = "0+unknown"
