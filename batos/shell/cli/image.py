"""Commands on the image itself: init, run, inspect, history, undo, schema, repair, config, zeo."""

from __future__ import annotations

import datetime as dt
from typing import Any

import typer
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from batos import settings
from batos.errors import BatosError, ConfigurationError, ImageURIError
from batos.shell.cli.app import console, image_uri
from batos.shell.cli.terminal import plain, shown, visible
from batos.shell.runtime import open_image, open_runtime
from prototypes.bounded import bounded_repr
from prototypes.incarnation import personas
from prototypes.paths import resolve
from prototypes.uvm import Method, UvmObject
from store.core import schema
from store.core.image import LivingImage, shown_uri

image_app = typer.Typer()
zeo_app = typer.Typer(help="Share one image between processes through a ZEO server.")


def _short(value: Any, width: int = 70) -> str:
    return shown(bounded_repr(value, width))


def _persona_table(root: Any) -> Table:
    table = Table(title="Personas")
    for column in ("persona", "role", "model", "intents", "methods"):
        table.add_column(column, overflow="fold")
    for name, obj in personas(root).items():
        methods = [k for k, v in obj._slots().items() if isinstance(v, Method)]
        table.add_row(
            shown(name),
            shown(str(obj.role).split(":")[0]),
            shown(obj.model),
            shown(", ".join(map(str, obj.intents))),
            shown(", ".join(methods) or "-"),
        )
    return table


@image_app.command()
def init(
    ctx: typer.Context,
    prepare: bool = typer.Option(
        False,
        "--prepare",
        help="Also write the facet methods the image lacks now (minutes on a CPU), so no "
        "request waits for one; without it the heartbeat writes them.",
    ),
) -> None:
    """Create the image if needed, apply pending upgrades and incarnate the personas.

    Examples: batos --image file:///tmp/demo.fs init · batos init --prepare
    """
    uri = image_uri(ctx)
    with open_image(uri) as image:
        with image.read() as root:
            console.print(f"image [bold]{shown(shown_uri(uri))}[/]")
            for name, info in schema.applied(root).items():
                when = dt.datetime.fromtimestamp(info["applied_at"]).isoformat(timespec="seconds")
                console.print(
                    f"  [green]✓[/] {shown(name)}  {shown(info['description'])}  ({when})"
                )
            console.print(_persona_table(root))
        if prepare:
            _prepare_facets(ctx, image)


def _prepare_facets(ctx: typer.Context, image: Any) -> None:
    from batos.shell.cli.app import model_factory
    from batos.shell.cli.progress import ProgressReport
    from graph import facet_writing

    with image.read() as root:
        todo = facet_writing.missing(root)
    if not todo:
        console.print("[green]✓[/] every facet method is written")
        return
    done: list[Any] = []
    interrupted = False
    try:
        with ProgressReport(console, "writing facets", total=len(todo), unit="facets") as bar:

            def tell(result: Any) -> None:
                done.append(result)
                mark = "written" if result.ok else "could not be written"
                bar.update(len(done), f"{result.key} {mark} ({result.seconds:.0f}s)")

            facet_writing.write_all(image, model_factory(ctx), todo, tell)
    except KeyboardInterrupt:  # each facet is its own transaction: those done are kept
        interrupted = True
    for result in done:
        if result.ok:
            console.print(f"  [green]✓[/] {result.key}  ({result.seconds:.0f}s)")
        else:
            reason = shown(result.reason.splitlines()[0][:160])
            console.print(f"  [yellow]✗[/] {result.key}: {reason}")
    if interrupted:
        written = sum(1 for r in done if r.ok)
        console.print(
            f"interrupted: {written} of {len(todo)} facet(s) written and kept; 'batos init "
            "--prepare' writes the rest (the heartbeat does too)",
            markup=False,
        )
        raise typer.Exit(130)
    failed = [r for r in done if not r.ok]
    if failed:
        console.print(
            f"[yellow]{len(failed)} facet(s) could not be written[/]: their personas answer "
            "those parts directly; the heartbeat tries again later ('batos doctor' shows when)"
        )


def _facets_line(root: Any) -> None:
    from graph import facet_writing

    lacking = facet_writing.missing(root)
    total = len(facet_writing.codex_facets())
    if lacking:
        console.print(
            f"facets: {total - len(lacking)} of {total} written; until the rest are, their "
            "personas answer those parts directly ('batos init --prepare' writes them now, the "
            "heartbeat later)"
        )


@image_app.command("run")
def run_main(
    ctx: typer.Context,
    request: str = typer.Option(None, "--request", "-r", help="Answer this instead."),
) -> None:
    """The main job: open the image, check the model, answer a sample request end to end
    (route, plan, facets, synthesis, commit, streamed), then chat when stdin is a terminal.

    Example: BATOS_MODEL=test batos run
    """
    import sys

    from langgraph.checkpoint.base.id import uuid6

    from batos.shell.cli.app import model_factory, report_error
    from batos.shell.cli.mind import SAMPLE_REQUEST, Session, _outcome, chat_loop
    from graph.mind import run_config
    from store.core.model_files import model_path

    uri = image_uri(ctx)
    if model_factory(ctx) is None:
        with console.status("checking the embedded model…"):
            path = model_path()
    session = Session(open_runtime(uri, models=model_factory(ctx)))
    try:
        with session.image.read() as root:
            console.print(f"image [bold]{shown(shown_uri(uri))}[/]")
            if model_factory(ctx) is None:
                console.print(f"model [bold]{shown(settings.get_str('model'))}[/] → {shown(path)}")
            console.print(_persona_table(root))
            _facets_line(root)
        thread_id = f"run-{uuid6()}"
        text = request or SAMPLE_REQUEST
        console.print(f"[bold]you>[/] {shown(text)}")
        context = session.context(None, "full" if request is None else "auto")
        # stdin may be closed (None) as well as a file or a pipe: then there is no chat
        chatting = sys.stdin is not None and sys.stdin.isatty()
        try:
            state = session.cycle(text, run_config(thread_id), context)
            console.print()
            _outcome(state, as_json=False)
        except BatosError as exc:  # a FAILED or stopped first answer: said now, then the chat
            if not chatting:
                raise
            report_error(exc)
        if chatting:
            chat_loop(session, thread_id, None, "auto")
    finally:
        session.close()


@image_app.command()
def inspect(
    ctx: typer.Context,
    path: str = typer.Argument("", help="Dotted path: robin, robin.intents, traits …"),
) -> None:
    """Browse objects in the image: slots, parents and methods with their source.

    Examples: batos inspect · batos inspect robin · batos inspect robin.intents
    """
    with open_image(image_uri(ctx)) as image, image.read() as root:
        target = resolve(root, path)
        label = path or "objects"
        if isinstance(target, UvmObject):
            _show_object(label, target)
        elif hasattr(target, "items"):
            table = Table(title=shown(label))
            table.add_column("key")
            table.add_column("value")
            for key, value in target.items():
                table.add_row(_short(key), _short(value))
            console.print(table)
        else:
            console.print(f"{label} = {bounded_repr(target, 10_000)}", markup=False)


def _show_object(label: str, obj: UvmObject) -> None:
    table = Table(title=shown(f"{label}  {bounded_repr(obj)}"))
    table.add_column("slot")
    table.add_column("kind")
    table.add_column("value")
    methods: list[Method] = []
    for name, value in sorted(obj._slots().items()):
        if isinstance(value, Method):
            methods.append(value)
            table.add_row(shown(name), "method", shown(f"by {value.author}: {value.intent or '-'}"))
        elif name.endswith("*"):
            table.add_row(shown(name), "parent", _short(value))
        else:
            table.add_row(shown(name), "data", _short(value))
    console.print(table)
    for method in methods:
        console.print(
            f"[bold]{shown(method.selector)}[/]  author={shown(method.author)}  "
            f"audit={_short(method.audit, 2_000)}"
        )
        console.print(Syntax(visible(method.source), "python", line_numbers=False))


@image_app.command()
def history(
    ctx: typer.Context,
    limit: int = typer.Option(20, "--limit", "-n", min=1, help="How many transactions to show."),
) -> None:
    """List the image's most recent transactions: id, time, user, what was done.

    Example: batos history -n 5
    """
    with LivingImage.open(image_uri(ctx)) as image:
        table = Table(title=f"Transactions of {shown_uri(image.uri)}")
        for column in ("tid", "when", "user", "description"):
            table.add_column(column)
        for record in image.history(limit):
            when = dt.datetime.fromtimestamp(record.time).isoformat(sep=" ", timespec="seconds")
            table.add_row(shown(record.tid), when, shown(record.user), shown(record.description))
        console.print(table)


@image_app.command()
def undo(
    ctx: typer.Context, tid: str = typer.Argument(..., help="Id from 'batos history'.")
) -> None:
    """Revert one transaction by recording a new one that undoes it.

    Example: batos undo 03f1c2a9b4e5d600
    """
    from graph import learning

    with LivingImage.open(image_uri(ctx)) as image:
        what = image.undo(tid)
        # An undone adapter swap (a retraining mission) serves the previous file again.
        restored = learning.reconcile(image)
    console.print(f"undid transaction {tid}", markup=False)
    if what.startswith("upgrade:"):
        # Opened through the runtime, an image gets every pending layout upgrade first.
        console.print(
            f"note: it was a layout upgrade ({what.removeprefix('upgrade:').strip()}); the next "
            "command that opens the image applies it again",
            markup=False,
        )
    for key in restored:
        console.print(f"adapter {key}: the version the image names is served again", markup=False)


@image_app.command("schema")
def schema_cmd(ctx: typer.Context) -> None:
    """Show which layout upgrades this image has had, and when."""
    with open_image(image_uri(ctx)) as image, image.read() as root:
        table = Table(title="Applied upgrade steps")
        for column in ("step", "description", "applied"):
            table.add_column(column)
        for name, info in schema.applied(root).items():
            when = dt.datetime.fromtimestamp(info["applied_at"]).isoformat(timespec="seconds")
            table.add_row(shown(name), shown(info["description"]), when)
        console.print(table)


@image_app.command()
def repair(ctx: typer.Context) -> None:
    """Repair a damaged file image with ZODB's own recovery; the damaged file is kept beside it.

    Whatever ZODB cannot read back is dropped: this command says what. Run it while no other
    process (nor a ZEO server) has the image open.

    Example: batos --image file:///srv/batos/live_image.fs repair
    """
    from store.core.image import image_path
    from store.core.image_file import repair as repair_file

    uri = image_uri(ctx)
    path = image_path(uri)
    if path is None:
        raise ImageURIError(
            f"only a file:// image can be repaired, not {shown_uri(uri)}",
            hint="repair the file behind the ZEO server or database with its own tools",
        )
    report = repair_file(path)
    found = report.check
    if report.damaged_copy is None:
        if found.uncommitted_tail:
            console.print(
                f"{path}: {found.transactions:,} sound transactions, then one that never "
                "committed (a process stopped mid-commit); the next open drops it and nothing "
                "committed is lost. Nothing to repair.",
                markup=False,
            )
        else:
            console.print(
                f"{path}: {found.transactions:,} transactions, all sound. Nothing to repair.",
                markup=False,
            )
        return
    console.print(f"[bold]damage:[/] {shown(found.damage)}")
    for message in report.messages:
        console.print(f"  recovery: {message}", markup=False)
    console.print(
        f"kept {report.transactions:,} transactions ({found.transactions:,} before the damage); "
        f"dropped {report.bytes_dropped:,} bytes"
    )
    console.print(f"the damaged original is kept as {report.damaged_copy}", markup=False)


@image_app.command("config")
def config_cmd(
    names: list[str] = typer.Argument(None, help="Settings to show (default: all)."),
) -> None:
    """Show every setting as a block: its value in force, where that comes from (its
    environment variable or the default) and what it does. A value that cannot be used is
    shown with the reason, and the command exits 2 after the last block.

    Example: batos config audit_window
    """
    # Every name is checked before any block is shown: a typo among them is the whole answer.
    unknown = [name for name in names or [] if name not in settings.SETTINGS]
    if unknown:
        raise ConfigurationError(
            f"unknown setting{'s' if len(unknown) > 1 else ''} "
            + ", ".join(bounded_repr(name, 80) for name in unknown),
            hint=f"known settings: {', '.join(settings.SETTINGS)}",
        )
    invalid = []
    for name in names or settings.SETTINGS:
        setting = settings.SETTINGS[name]
        # A bad value is shown, flagged, and the rest still listed: this is where one looks
        # to find what is wrong, so it must not stop at the first thing that is.
        reason = None
        try:
            value = str(setting.parse(settings.raw_text(name)))
        except ValueError as exc:
            value, reason = settings.raw_text(name), str(exc)
        except BatosError as exc:  # a default worked out from another setting that is bad
            value, reason = "?", exc.message
        if "key" in name and value:
            value = "***"
        origin = settings.origin(name)
        source = f"from {origin}" if origin != "default" else f"default; {setting.env} overrides"
        # A long value (a path, a URI) stays on one line, whole: wrapped, it could not be
        # copied back; the help is prose and wraps under an indent.
        console.print(
            Text.assemble((name, "bold"), " = ", plain(value)), soft_wrap=True, highlight=False
        )
        console.paragraph(f"({source})", indent=4)
        if reason is not None:
            invalid.append(setting.env)
            console.paragraph(f"NOT VALID: {reason}", indent=4, style="bold red")
        console.paragraph(setting.help, indent=4)
        console.print()
    if invalid:
        raise ConfigurationError(
            f"{len(invalid)} setting{'s' if len(invalid) > 1 else ''} not valid: "
            + ", ".join(invalid),
            hint="set each to a value as its block above says, or unset it",
        )


@zeo_app.command("start")
def zeo_start(
    ctx: typer.Context,
    address: str = typer.Option(
        None, "--address", "-a", help="HOST:PORT to serve on (setting zeo_address)."
    ),
) -> None:
    """Serve the file image to other processes until interrupted (Ctrl-C, SIGTERM, SIGHUP).

    Example: batos --image file:///srv/batos/live_image.fs zeo start -a 127.0.0.1:8100
    then, elsewhere: BATOS_IMAGE=zeo://127.0.0.1:8100 batos inspect
    """
    from store.core.image import image_path
    from store.core.zeo import ZeoServer

    path = image_path(image_uri(ctx))
    if path is None:
        raise BatosError("ZEO serves a file image", hint="pass --image file:///path/live_image.fs")
    server = ZeoServer(path, address or settings.get_str("zeo_address"))
    server.serve(
        on_ready=lambda: console.print(
            f"serving {shown(path)} at [bold]{shown(server.uri)}[/] (Ctrl-C or SIGTERM stops)"
        )
    )
    console.print(f"stopped serving {path}", markup=False)


def register(app: typer.Typer) -> None:
    for command in image_app.registered_commands:
        app.registered_commands.append(command)
    app.add_typer(zeo_app, name="zeo")
