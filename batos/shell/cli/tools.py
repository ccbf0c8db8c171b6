"""``batos tools``: the tool proxies in the image — list, show, declare and remove them.

A proxy's methods are written by doesNotUnderstand (``batos send tools.NAME SELECTOR ARGS``);
each change here is one transaction of its own, so ``batos undo TID`` reverts it.
"""

from __future__ import annotations

import keyword
from typing import Any

import typer
from persistent.mapping import PersistentMapping
from rich.syntax import Syntax
from rich.table import Table

from batos.errors import ObjectPathError
from batos.shell.cli.app import console, image_uri
from batos.shell.cli.terminal import json_text, shown, visible
from batos.shell.runtime import open_image
from prototypes import rejected, tools
from prototypes.uvm import Method, UvmObject
from store.core import layout

tools_app = typer.Typer(
    help="Tool proxies: objects whose methods call an outside service within tools_allow.",
    invoke_without_command=True,
    no_args_is_help=False,
)


def _toolbox(root: Any) -> UvmObject:
    toolbox = layout.objects(root).get(tools.TOOLBOX)
    if toolbox is None:
        raise ObjectPathError("the image has no tools object", hint="run 'batos init'")
    return toolbox


def _proxy(root: Any, name: str) -> UvmObject:
    toolbox = _toolbox(root)
    proxy = tools.proxies(toolbox).get(name)
    if proxy is None:
        known = ", ".join(tools.proxies(toolbox)) or "none yet"
        raise ObjectPathError(f"there is no tool {name!r}", hint=f"tools: {known}")
    return proxy


def _methods(proxy: UvmObject) -> list[Method]:
    return [m for m in proxy._slots().values() if isinstance(m, Method)]


def _row(name: str, proxy: UvmObject) -> dict[str, Any]:
    return {
        "name": name,
        "about": str(proxy._slots().get("about", "")),
        "methods": [
            {
                "selector": m.selector,
                "intent": m.intent,
                "author": m.author,
                "created": m.created,
                "source": m.source,
            }
            for m in _methods(proxy)
        ],
    }


@tools_app.callback(invoke_without_command=True)
def tools_list(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """List the tool proxies, what each is for and its methods.

    Examples: batos tools · batos tools --json · batos tools show weather
    """
    if ctx.invoked_subcommand is not None:
        return
    with open_image(image_uri(ctx)) as image, image.read() as root:
        rows = [_row(name, p) for name, p in tools.proxies(_toolbox(root)).items()]
    if as_json:
        typer.echo(json_text(rows, "the tools"))
        return
    table = Table(title="Tool proxies")
    for column in ("name", "methods", "about"):
        table.add_column(column)
    for row in rows:
        selectors = ", ".join(m["selector"] for m in row["methods"]) or "-"
        table.add_row(shown(row["name"]), shown(selectors), shown(_cut(row["about"])))
    console.print(table)
    console.print(
        f"allowed: {tools.ToolPolicy.from_settings().described()}", markup=False, highlight=False
    )


@tools_app.command("show")
def tools_show(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="The tool, e.g. weather."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Show one tool: what it is for and each method's intent and source.

    Example: batos tools show weather
    """
    with open_image(image_uri(ctx)) as image, image.read() as root:
        row = _row(name, _proxy(root, name))
    if as_json:
        typer.echo(json_text(row, f"tool {name}"))
        return
    console.print(f"[bold]tools.{shown(name)}[/]: {shown(_cut(row['about']))}")
    if not row["methods"]:
        console.print(
            f"no methods yet: 'batos send tools.{name} SELECTOR ARGS...' writes one", markup=False
        )
    for method in row["methods"]:
        console.print(
            f"{name}.{method['selector']} by {method['author']}: {method['intent'] or '-'}",
            markup=False,
        )
        console.print(Syntax(visible(method["source"]), "python"))


#: Bounds of a declared tool: its name, and the description every method prompt carries.
MAX_NAME_CHARS, MAX_ABOUT_CHARS = 64, 2_000


def _cut(about: str) -> str:
    """A description as shown: one declared before descriptions were bounded can be long."""
    if len(about) <= MAX_ABOUT_CHARS:
        return about
    return f"{about[:MAX_ABOUT_CHARS]}… ({len(about):,} characters)"


@tools_app.command("add")
def tools_add(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="The tool's name, e.g. weather."),
    about: str = typer.Option(
        ..., "--about", "-a", help="What the service is and where it answers (its base URL)."
    ),
) -> None:
    """Declare a tool: what the service is, for the model that writes its methods.

    Example: batos tools add weather --about 'Open-Meteo forecasts at https://api.open-meteo.com'
    """
    if (
        not name.isidentifier()
        or name.startswith("_")
        or keyword.iskeyword(name)
        or len(name) > MAX_NAME_CHARS
    ):
        raise typer.BadParameter(
            f"a tool's name is a public identifier of at most {MAX_NAME_CHARS} characters, "
            "not a Python keyword, e.g. weather",
            param_hint="NAME",
        )
    about = about.strip()
    if len(about) > MAX_ABOUT_CHARS:  # it goes into every prompt that writes the tool's methods
        raise typer.BadParameter(
            f"the description is {len(about):,} characters; at most {MAX_ABOUT_CHARS:,}: say "
            "what the service is and its base URL",
            param_hint="--about",
        )
    if not about:
        # the model that writes the tool's methods has nothing else to go on
        raise typer.BadParameter(
            "say what the service is and its base URL, e.g. 'Open-Meteo forecasts at "
            "https://api.open-meteo.com'",
            param_hint="--about",
        )

    def add(root: Any) -> str | None:
        toolbox = _toolbox(root)
        intents = toolbox._slots().get("intents")
        if not isinstance(intents, PersistentMapping):
            intents = toolbox.intents = PersistentMapping()
        before = intents.get(name)
        intents[name] = about
        proxy = tools.open_proxy(toolbox, name)
        proxy.about = about
        return before if isinstance(before, str) else None

    with open_image(image_uri(ctx)) as image:
        before = image.transact(add, note=f"tools add {name}")
    if before is None:
        console.print(f"declared tools.{name}", markup=False)
    elif before == about:
        console.print(f"tools.{name} was declared already, as it is", markup=False)
    else:
        console.print(
            f"tools.{name} declared again: its description was {before!r} "
            "('batos undo TID' brings it back; its methods are kept)",
            markup=False,
        )


@tools_app.command("remove")
def tools_remove(
    ctx: typer.Context,
    name: str = typer.Argument(..., help="The tool to remove, with its methods."),
) -> None:
    """Remove a tool and its methods ('batos undo TID' brings them back).

    Example: batos tools remove weather
    """

    def remove(root: Any) -> tuple[int, int]:
        proxy = _proxy(root, name)
        count = len(_methods(proxy))
        toolbox = _toolbox(root)
        delattr(toolbox, name)
        intents = toolbox._slots().get("intents")
        if isinstance(intents, PersistentMapping) and name in intents:
            del intents[name]
        return count, rejected.drop_held_by(root, proxy)

    with open_image(image_uri(ctx)) as image:
        count, records = image.transact(remove, note=f"tools remove {name}")
    also = f" and {records} record(s) of its rejected methods" if records else ""
    console.print(
        f"removed tools.{name} and {count} method(s){also}; 'batos history' shows the "
        "transaction to undo",
        markup=False,
    )


def register(app: typer.Typer) -> None:
    app.add_typer(tools_app, name="tools")
