import click


@click.group("model")
def model_group() -> None:
    """Make model weights for the runtime (e.g. a random checkpoint at a realistic scale)."""
