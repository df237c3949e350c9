import click


@click.command("demo")
def demo_command() -> None:
    """Run the whole pipeline on the built-in demo target (no GPU needed)."""
