import click


@click.group("artifacts")
def artifacts_group() -> None:
    """Fetch, list and clean the cached compiled extensions of candidates."""
