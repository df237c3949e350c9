"""bisect: find the vLLM commit that introduced or fixed an intermittent kernel bug."""


def __getattr__(name: str) -> str:
    # Looked up when asked, not on import: importlib.metadata costs ~30 ms at every start, in
    # the window where a Ctrl-C could not yet be turned into one line (__main__.py).
    if name != "__version__":
        raise AttributeError(f"module 'bisect_tool' has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        # pyproject.toml is the one place the version is written; this reads what pip installed.
        return version("bisect-tool")
    except PackageNotFoundError:  # a source tree on sys.path that was never pip-installed
        return "0+unknown"
