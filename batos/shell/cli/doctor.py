"""``batos doctor``: every check of ``batos.shell.doctor``, one line each, with what to fix."""

from __future__ import annotations

import json

import typer

from batos.shell.cli.app import console, image_uri
from batos.shell.cli.terminal import shown

_STYLE = {"ok": "green", "warn": "yellow", "fail": "bold red"}


def doctor(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="One JSON line per check."),
    port: int = typer.Option(
        2024, "--port", min=1, max=65535, help="Port a local 'batos serve' would answer on."
    ),
) -> int:
    """Check the image (and its storage's consistency), the model and its checksums, the
    adapters, the backends, the heartbeat's jobs and lease, and the server; say what to fix.

    Exit code 1 when any check fails (warnings alone exit 0). Example: batos doctor --json
    """
    from batos.shell.doctor import FAIL, diagnose

    failed = 0
    for check in diagnose(image_uri(ctx), server_port=port):
        failed += check.status == FAIL
        if as_json:
            console.print(
                json.dumps(check.as_dict()), markup=False, highlight=False, soft_wrap=True
            )
            continue
        style = _STYLE[check.status]
        console.print(
            f"[{style}]{check.status:<4}[/] {check.area:<9} {shown(check.detail)}",
            markup=True,
            highlight=False,
        )
        if check.fix:
            console.print(f"               fix: {check.fix}", markup=False, highlight=False)
    if not as_json:
        console.print(f"{failed} check(s) failed" if failed else "no check failed")
    return 1 if failed else 0


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor)
