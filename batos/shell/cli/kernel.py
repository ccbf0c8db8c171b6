"""``batos methods`` and ``batos send``: the image's methods, and messages sent by hand.

Hand-written methods pass the same gate as generated ones (the PersistenceGuardian and the
sandbox compiler); a message nothing understands goes through doesNotUnderstand.
"""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

import typer
from rich.syntax import Syntax
from rich.table import Table

from batos.errors import BatosError, GeneratedCodeError, ObjectPathError
from batos.shell.cli.app import console, err_console, image_uri, model_factory
from batos.shell.cli.terminal import json_text, shown, visible
from batos.shell.runtime import open_image
from graph import rejection
from prototypes import bounded, guardian, kernel
from prototypes.bounded import (
    PLAIN_NODES,
    ValueTooLarge,
    bounded_plain,
    bounded_repr,
    strict_json,
)
from prototypes.paths import prototype
from prototypes.uvm import Method

methods_app = typer.Typer(
    help="Methods in the image: list them, add one by hand, remove one, reject a generated "
    "one as wrong and restore it.",
    invoke_without_command=True,
    no_args_is_help=False,
)


def _when(stamp: float) -> str:
    return dt.datetime.fromtimestamp(stamp).isoformat(sep=" ", timespec="seconds")


@methods_app.callback(invoke_without_command=True)
def methods(
    ctx: typer.Context,
    path: str = typer.Option("", "--path", "-p", help="Only this object (dotted path)."),
    source: bool = typer.Option(True, "--source/--no-source", help="Show each method's code."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    rejected: bool = typer.Option(
        False,
        "--rejected",
        help="List the generated methods taken out as wrong instead: why, by whom, and "
        "whether they were written again or restored.",
    ),
) -> None:
    """List the methods that went through the gate: intent, author, audit verdict, source.

    Examples: batos methods · batos methods -p brick --no-source · batos methods --json ·
    batos methods --rejected
    """
    if ctx.invoked_subcommand is not None:
        return
    with open_image(image_uri(ctx)) as image, image.read() as root:
        if rejected:
            _print_rejected(rejection.rejected_rows(root), source, as_json)
            return
        found = [
            (where, m)
            for where, obj in ([(path, prototype(root, path))] if path else rejection.walk(root))
            for m in kernel.generated_methods(obj)
        ]
        if as_json:
            rows = [
                {
                    "path": where,
                    "selector": m.selector,
                    "intent": m.intent,
                    "author": m.author,
                    "verdict": m.audit.get("verdict"),
                    "created": m.created,
                    "seconds": m.audit.get("mission_seconds"),
                    "source": m.source,
                    "examples": _plain(list(m.examples), f"{where}.{m.selector}'s examples"),
                    "examples_check": _plain(
                        m.audit.get("examples_check"), f"{where}.{m.selector}'s check"
                    ),
                }
                for where, m in found
            ]
            if not source:
                rows = [{k: v for k, v in row.items() if k != "source"} for row in rows]
            console.print_value_json(rows, "the methods")
            return
        table = Table(title="Methods written through the gate")
        columns = ("object", "selector", "author", "verdict", "created", "s", "examples", "intent")
        for column in columns:
            table.add_column(column)
        for where, m in found:
            seconds = m.audit.get("mission_seconds")
            table.add_row(
                shown(where),
                shown(m.selector),
                shown(m.author),
                shown(m.audit.get("verdict", "-")),
                _when(m.created),
                f"{seconds:.1f}" if isinstance(seconds, (int, float)) else "-",
                _examples_cell(m),
                shown(m.intent or "-"),
            )
        console.print(table)
        if source:
            for where, m in found:
                console.print(f"[bold]{shown(where)}.{shown(m.selector)}[/]  by {shown(m.author)}")
                console.print(Syntax(visible(m.source), "python"))
                for line in _example_lines(m.selector, m.examples, m.audit.get("examples_check")):
                    console.print(line, markup=False, highlight=False, soft_wrap=True)
        taken_out = [r for r in rejection.rejected_rows(root) if r["status"] != "restored"]
        if taken_out and not path:
            console.print(
                f"{len(taken_out)} method(s) taken out as wrong: 'batos methods --rejected' "
                "shows which, why, and how to put one back",
                markup=False,
            )


def _print_rejected(rows: list[dict[str, Any]], source: bool, as_json: bool) -> None:
    """The rejected methods: a table (and each one's code and examples), or JSON."""
    if as_json:
        plain = [
            {
                **row,
                "examples": _plain(row["examples"], f"rejected method {row['id']}'s examples"),
                "examples_check": _plain(row["examples_check"], f"rejected {row['id']}'s check"),
            }
            for row in rows
        ]
        if not source:
            plain = [{k: v for k, v in row.items() if k != "source"} for row in plain]
        console.print_value_json(plain, "the rejected methods")
        return
    if not rows:
        console.print("no method has been rejected")
        return
    table = Table(title="Generated methods taken out as wrong")
    for column in ("#", "object", "selector", "taken out", "by", "why", "now"):
        table.add_column(column)
    for row in rows:
        why = row["reason"] or ("marked wrong" if row["cause"] == rejection.BY_USER else "-")
        now = row["status"]
        if now == "pending":
            now = f"pending: written again by {row['rewritten_by']}"
        elif now == "restored":
            now = f"restored {_when(row['restored_at'] or 0)} by {row['restored_by']}"
        table.add_row(
            str(row["id"]),
            shown(row["path"]),
            shown(row["selector"]),
            _when(row["at"]),
            shown(row["by"]),
            shown(_cut(why, 400)),
            shown(now),
        )
    console.print(table)
    if source:
        for row in rows:
            name = f"#{row['id']} {shown(row['path'])}.{shown(row['selector'])}"
            console.print(f"[bold]{name}[/]  by {shown(row['author'])}")
            console.print(Syntax(visible(row["source"]), "python"))
            for line in _example_lines(row["selector"], row["examples"], row["examples_check"]):
                console.print(line, markup=False, highlight=False, soft_wrap=True)


def _examples_cell(method: Method) -> str:
    """'3/4 pass' for the last run of the examples; '-' for a method without any."""
    check = method.audit.get("examples_check")
    if not method.examples or not isinstance(check, dict):
        return "-"
    agreed = sum(1 for e in method.examples if e.get("status") == "agreed")
    return f"{check.get('passed', 0)}/{agreed} pass"


def _example_lines(selector: str, stored_examples: Any, check: Any) -> list[str]:
    """Each example as 'self.sel(args) → expected', the disputed ones and failures marked."""
    lines = []
    for stored in stored_examples:
        args = ", ".join(_literal(a) for a in stored.get("args", []))
        slots = f" with {_literal(stored['slots'])}" if stored.get("slots") else ""
        after = f", slots {_literal(stored['slots_after'])}" if stored.get("slots_after") else ""
        mark = "  (disputed: no draft chosen agreed)" if stored.get("status") == "disputed" else ""
        line = f"  self.{selector}({args}){slots} → {_literal(stored.get('returns'))}"
        lines.append(_cut(line + after + mark))
    for failure in (check or {}).get("failed", []) if isinstance(check, dict) else []:
        lines.append(_cut(f"  FAILS: {failure}"))
    return lines


def _literal(value: Any) -> str:
    """A stored example's value as JSON, or its bounded repr where JSON cannot say it (an
    integer past Python's digit limit, a type JSON lacks): a listing never fails on one."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return bounded_repr(value, 200)


def _cut(text: str, limit: int = 2_000) -> str:
    # Examples are bounded when written, but the image is data anyone could have edited.
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _source_file(file: Path) -> str:
    """A method's source: UTF-8 text, at most the guardian's limit (checked before reading
    the whole file, so a huge or endless file is refused without being loaded)."""
    limit = guardian.MAX_SOURCE_CHARS
    try:
        with file.open("rb") as handle:
            data = handle.read(4 * limit + 1)  # UTF-8 needs at most 4 bytes a character
    except OSError as exc:
        raise BatosError(
            f"cannot read {file}: {exc.strerror}", hint="pass the path of a Python file"
        ) from exc
    try:
        source = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BatosError(
            f"{file} is not UTF-8 text (byte {exc.start}: {data[exc.start : exc.start + 1]!r})",
            hint="pass the path of a Python source file saved as UTF-8",
        ) from None
    if len(data) > 4 * limit or len(source) > limit:
        raise GeneratedCodeError(
            f"{file} is over the {limit:,} characters a method may have",
            hint="a method is one function; split the work into several methods",
        )
    return source


@methods_app.command("add")
def methods_add(
    ctx: typer.Context,
    path: str = typer.Argument(..., help="Object that gets the method, e.g. brick."),
    selector: str = typer.Argument(..., help="Method name; the file must define it."),
    file: Path = typer.Argument(..., help="Python file with 'def SELECTOR(self, ...):'."),
    intent: str = typer.Option(
        "",
        "--intent",
        help="What the method is for (default: the object's declared intent, if any).",
    ),
) -> None:
    """Audit a hand-written method and install it; every finding is printed if it is refused.

    Example: batos methods add brick shout shout.py
    """
    source = _source_file(file)

    def install(root: Any) -> tuple[str, list[str]]:
        method = kernel.add_method(prototype(root, path), selector, source, intent=intent)
        check = method.audit.get("examples_check") or {}
        return method.selector, list(check.get("failed", []))

    with open_image(image_uri(ctx)) as image:
        name, failed = image.transact(install, note=f"methods add {path}.{selector}")
        console.print(f"installed [bold]{shown(path)}.{shown(name)}[/] (audit: approved)")
        for failure in failed:  # the examples the method it replaced kept
            err_console.print(f"fails a stored example: {failure}", markup=False)


@methods_app.command("remove")
def methods_remove(
    ctx: typer.Context,
    path: str = typer.Argument(..., help="Object that holds the method."),
    selector: str = typer.Argument(..., help="Method to remove."),
) -> None:
    """Remove a method from the object that holds it ('batos undo' brings it back).

    Example: batos methods remove brick shout
    """

    def remove(root: Any) -> None:
        target = prototype(root, path)
        if not isinstance(target._slots().get(selector), Method):
            own = (
                ", ".join(sorted(k for k, v in target._slots().items() if isinstance(v, Method)))
                or "none"
            )
            raise ObjectPathError(
                f"{path} has no own method {selector!r}", hint=f"its methods: {own}"
            )
        delattr(target, selector)

    with open_image(image_uri(ctx)) as image:
        image.transact(remove, note=f"methods remove {path}.{selector}")
    console.print(f"removed {path}.{selector}", markup=False)


@methods_app.command("reject")
def methods_reject(
    ctx: typer.Context,
    path: str = typer.Argument(..., help="Object that answers the selector, e.g. brick."),
    selector: str = typer.Argument(..., help="The generated method that is wrong."),
    reason: str = typer.Option("", "--reason", "-r", help="Why it is wrong (kept with it)."),
) -> None:
    """Take out a generated method that is wrong, in a transaction of its own.

    It is kept in the image ('batos methods --rejected' lists it, 'batos methods restore'
    puts it back); its intent is written again later, never with the same code.

    Example: batos methods reject brick estimate --reason 'largest is the last size'
    """
    with open_image(image_uri(ctx)) as image:
        done = rejection.reject(image, path, selector, reason=reason)
    console.print(
        f"rejected {done.path}.{done.selector} (record {done.number}); its intent is pending, "
        f"written again by {done.rewritten_by}",
        markup=False,
    )
    err_console.print(
        f"'batos methods restore {path} {selector}' puts it back", markup=False, highlight=False
    )


@methods_app.command("restore")
def methods_restore(
    ctx: typer.Context,
    path: str = typer.Argument(..., help="Object that answered the selector, e.g. brick."),
    selector: str = typer.Argument(..., help="The rejected method to put back."),
) -> None:
    """Put back the newest rejected method of that name, through the gate again.

    The PersistenceGuardian and the sandbox compiler check it again; the stored examples it
    fails are printed and kept as disputed.

    Example: batos methods restore brick estimate
    """
    with open_image(image_uri(ctx)) as image:
        done = rejection.restore(image, path, selector)
    console.print(
        f"restored {done.path}.{done.selector} from record {done.number} (audit: approved)",
        markup=False,
    )
    for failure in done.disputed:
        err_console.print(f"fails a stored example, now disputed: {failure}", markup=False)


def _take_out_failing(image: Any) -> None:
    """Take out the generated methods that failed their stored examples when this command
    compiled them: each in a transaction of its own, after the command's is over."""
    try:
        report = rejection.remove_noted(image)
    except BatosError as exc:  # the heartbeat's check takes them out later
        err_console.print(f"methods that fail their examples stay for now: {exc.message}")
        return
    for done in report.removed:
        err_console.print(
            f"took out {done.path}.{done.selector}: {done.reason} ('batos methods restore "
            f"{done.path} {done.selector}' puts it back)",
            markup=False,
        )


def _argument(text: str) -> Any:
    # Nesting too deep raises RecursionError: a malformed argument, not a crash.
    try:
        return strict_json(text, max_int_digits=None)
    except (ValueError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]
        raise BatosError(
            f"argument {bounded_repr(text, 80)} is not a JSON literal: {reason}",
            hint="quote strings JSON-style: '\"hello\"', numbers as 3, lists as '[1, 2]'",
        ) from None


def _plain(value: Any, what: str) -> Any:
    """Persistent containers as plain ones, for printing and JSON; bounded by nodes visited.

    Called inside the transaction: a persistent container read after it closed could not
    load its state.
    """
    try:
        return bounded_plain(value)
    except ValueTooLarge as exc:
        raise BatosError(
            f"{what} is too large to print: {exc} (limit {PLAIN_NODES:,})",
            hint="read a part of it with a method that returns less",
        ) from None


def send(
    ctx: typer.Context,
    path: str = typer.Argument(..., help="Receiver (dotted path), e.g. brick."),
    selector: str = typer.Argument(..., help="Message to send."),
    args: list[str] = typer.Argument(None, help="Arguments as JSON literals."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    ask: bool | None = typer.Option(
        None,
        "--ask/--no-ask",
        help="When a written method is not trusted, ask for one example on standard input "
        "(default: when it is a terminal); --no-ask refuses at once.",
    ),
) -> None:
    """Send a message and print the result; an unknown selector is written on the spot.

    A method that cannot be trusted (BATOS_JIT_TRUST) is not installed: you are asked for
    one example of input and output, and the drafts are judged again with it.

    Examples: batos send brick estimate '[3, 5, 2]' · batos send alfred verdict 0.8 --json
    """
    from graph import jit

    values = [_argument(a) for a in args or []]

    def deliver(root: Any) -> Any:
        receiver = prototype(root, path)
        found = receiver._lookup(selector)
        if found is not None and not isinstance(found[1], Method):
            if values:
                raise BatosError(
                    f"{path}.{selector} is a data slot, not a method",
                    hint=f"send it without arguments to read it, or use 'batos inspect {path}'",
                )
            return _plain(found[1], f"{path}.{selector}")
        if found is not None:
            try:
                return _plain(getattr(receiver, selector)(*values), "the result")
            except BatosError:
                raise
            except Exception as exc:
                notes = "".join(f" {n}" for n in getattr(exc, "__notes__", ()))
                raise BatosError(
                    f"{path}.{selector} raised {type(exc).__name__}: "
                    f"{bounded.exception_text(exc)}{notes}",
                    hint="nothing was changed; check the arguments ('batos methods -p "
                    f"{path}' shows the method's source)",
                ) from exc
        status = err_console.status(
            f"{shown(path)} does not understand {shown(repr(selector))}: writing it…"
        )
        asking = sys.stdin.isatty() if ask is None else ask
        runner = jit.JitRunner(
            model_factory=model_factory(ctx),
            ask=(lambda question: _ask_user(question, status)) if asking else None,
        )
        with status:
            result = _plain(runner.send(receiver, selector, tuple(values), {}), "the result")
        written.append(receiver._lookup(selector)[1])  # type: ignore[index]  # the send found it
        return result

    written: list[Method] = []
    with open_image(image_uri(ctx)) as image:
        try:
            result = image.transact(deliver, note=f"send {path}.{selector}")
        finally:
            _take_out_failing(image)
        if written:
            err_console.print(_written_line(f"{path}.{selector}", written[0]), markup=False)
    if as_json:
        typer.echo(json_text(result, f"the result of {path}.{selector}"))
    else:
        console.print(bounded_repr(result, 100_000, nodes=PLAIN_NODES), markup=False)


def _ask_user(question: dict[str, Any], status: Any) -> str | None:
    """Put the mission's question on the terminal; the answer line (empty: refuse)."""
    status.stop()  # the spinner would write over the question
    try:
        if question.get("again"):  # the last answer could not be read: ask once more
            err_console.print(f"{question['again']}; try again (empty refuses)", markup=False)
            line = typer.prompt("example", default="", show_default=False, err=True)
            return line.strip() or None
        err_console.print(question["question"], markup=False)
        for why in question.get("why", []):
            err_console.print(f"  - {why}", markup=False)
        err_console.print(
            f"The call was {question['call']}. For example: " + '{"args": [...], "returns": ...}',
            markup=False,
        )
        line = typer.prompt("example", default="", show_default=False, err=True)
        return line.strip() or None
    except (EOFError, typer.Abort):
        return None
    finally:
        status.start()


def _written_line(name: str, method: Method) -> str:
    """How long writing the method took, and how it was chosen."""
    audit = method.audit
    line = f"wrote {name} in {audit.get('mission_seconds') or 0:.1f} s"
    if method.examples:
        agreed = sum(1 for e in method.examples if e.get("status") == "agreed")
        line += (
            f" ({audit.get('drafts', 1)} draft(s), {audit.get('agreement', 1)} agree, "
            f"{agreed}/{len(method.examples)} examples agree with it)"
        )
    return line


def register(app: typer.Typer) -> None:
    app.add_typer(methods_app, name="methods")
    app.command("send")(send)
