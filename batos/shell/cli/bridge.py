"""``batos bridge``: the Synaptic Bridge (``batos.shell.bridge``) on a ZeroMQ ROUTER socket."""

from __future__ import annotations

import signal

import typer

from batos.shell.cli.app import console, image_uri, model_factory

DEFAULT_BIND = "tcp://127.0.0.1:5555"


def bridge(
    ctx: typer.Context,
    bind: str = typer.Option(DEFAULT_BIND, "--bind", help="ZeroMQ endpoint, loopback only."),
) -> None:
    """Serve the mind to ZeroMQ clients (DEALER sockets) until Ctrl-C or SIGTERM;
    the message format is in docs/serving.md (The Synaptic Bridge).

    Example: batos bridge --bind tcp://127.0.0.1:5555 · python examples/bridge_client.py hello
    """
    from batos.shell.bridge import Bridge, check_bind
    from batos.shell.runtime import open_runtime

    check_bind(bind)
    with open_runtime(image_uri(ctx), models=model_factory(ctx)) as runtime:
        server = Bridge(runtime, bind)

        def on_signal(signum: int, frame: object) -> None:
            server.stop()  # the socket loop wakes every 100 ms and sees it

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            server.serve(
                ready=lambda endpoint: console.print(
                    f"bridge on {endpoint} (mind graph); Ctrl-C stops it"
                )
            )
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def register(app: typer.Typer) -> None:
    app.command("bridge")(bridge)
