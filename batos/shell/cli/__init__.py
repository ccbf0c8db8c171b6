"""``batos``: the command line of BAT OS, one module per command group (see ``app``)."""

from batos.shell.cli.app import app, main

__all__ = ["app", "main"]
