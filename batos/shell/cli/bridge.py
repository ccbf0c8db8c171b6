"""``batos bridge``: the Synaptic Bridge (``batos.shell.bridge``) on a ZeroMQ ROUTER socket."""

from __future__ import annotations

import os
import signal

import typer

from batos.shell.cli.app import console, image_uri, model_factory

DEFAULT_BIND = "tcp://127.0.0.1:5555"


def bridge(
    ctx: typer.Context,
    bind: str = typer.Option(DEFAULT_BIND, "--bind", help="ZeroMQ endpoint, loopback only."),
) -> None:
    """Serve the mind to ZeroMQ clients (DEALER sockets) until Ctrl-C or SIGTERM (twice: at
    once, abandoning the running requests); the message format is in docs/serving.md (The
    Synaptic Bridge).

    Example: batos bridge --bind tcp://127.0.0.1:5555 · python examples/bridge_client.py hello
    """
    from batos.shell.bridge import Bridge, check_bind
    from batos.shell.runtime import open_runtime

    check_bind(bind)
    with open_runtime(image_uri(ctx), models=model_factory(ctx)) as runtime:
        server = Bridge(runtime, bind)

        def on_signal(signum: int, frame: object) -> None:
            if not server.stopping:  # the first: running requests are answered, then exit
                server.stop()  # the socket loop wakes every 100 ms and sees it
                console.print(
                    "bridge stopping once the running requests are answered (stop it again "
                    "to abandon them)",
                    markup=False,
                )
                return
            # The second: a cycle can run for minutes on a slow model, and its thread cannot
            # be stopped from outside. A cycle commits only as it ends (docs/mind.md), so an
            # abandoned one leaves the image as it was; its thread takes its next request.
            console.print(
                "stopping now: the running requests are abandoned, nothing of their cycles "
                "committed",
                markup=False,
            )
            os._exit(128 + signum)

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            server.serve(
                ready=lambda endpoint: console.print(
                    f"bridge on {endpoint} (mind graph); Ctrl-C stops it (twice: at once)"
                )
            )
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def register(app: typer.Typer) -> None:
    app.command("bridge")(bridge)
