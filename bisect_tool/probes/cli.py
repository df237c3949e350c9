import click


@click.command("probe")
def probe_command() -> None:
    """Run one probe once (against a server, a candidate or an extension file)."""
