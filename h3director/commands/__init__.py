"""Subcommands of the `h3director` command line tool, one module each."""
