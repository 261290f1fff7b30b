"""Subcommands of the `h3director` command line tool, one module each."""

__all__: list[str] = []
