"""``batos ask``, ``chat`` and ``serve``: the mind from the command line (what it
committed: ``batos cycles``, in ``batos.shell.cli.cycles``).

``ask`` and ``chat`` stream a cycle as it runs — the route, the plan, each facet as it finishes,
the answer token by token — and end with the commit (or the reason it FAILED, exit code 10).
Ctrl-C stops a cycle without committing anything and marks its request interrupted in the
thread (exit code 130 for ``ask``; ``chat`` returns to its prompt, ``batos.shell.cli.repl``).
``serve`` runs the LangGraph server (what ``langgraph dev`` runs, without the browser) on
loopback with langgraph.json's graphs, checkpointer and store.
"""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import typer
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base.id import uuid6
from langgraph.graph import END
from langgraph.types import StateSnapshot

from batos.errors import (
    BatosError,
    CycleFailed,
    CycleInterrupted,
    GenerationCancelled,
    GraphRequestError,
)
from batos.shell.cli.app import console, image_uri, model_factory
from batos.shell.cli.cycles import cycles_table, print_failed
from batos.shell.cli.repl import LineReader, StopOnInterrupt, clean_line
from batos.shell.cli.terminal import shown
from batos.shell.runtime import Runtime, open_image, open_runtime
from graph.mind import MAX_ANSWER_CHARS, own_run, refuse_if_busy, run_config, run_state
from graph.request import DEPTHS, check_thread_id, content_text
from prototypes.bounded import bounded_repr
from prototypes.codex import PERSONAS

mind_app = typer.Typer()
#: The request ``batos run`` answers end to end before it opens the chat.
SAMPLE_REQUEST = (
    "Plan my first week of learning to program: the steps to take, and why it is worth it."
)
LOOPBACK = ("127.0.0.1", "localhost", "::1")
#: What ends the answer of a cycle the user stopped, in its thread.
INTERRUPTED = "(interrupted)"


class Session:
    """A runtime and its compiled mind, for a command's lifetime; closing it closes both."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.image = runtime.image
        self.saver = runtime.saver
        self.graph = runtime.mind()

    def close(self) -> None:
        self.runtime.close()

    def context(self, persona: str | None, depth: str | None) -> dict[str, Any]:
        context: dict[str, Any] = {}
        if persona is None:
            try:
                import graph.router  # noqa: F401
            except ImportError:
                console.print("[yellow]no router installed: BRICK answers[/]")
                persona = "BRICK"
        if persona:
            context["persona"] = persona
        if depth and depth != "auto":
            context["depth"] = depth
        return context

    def cycle(
        self,
        text: str,
        config: RunnableConfig,
        context: dict[str, Any],
        *,
        show: bool = True,
    ) -> dict[str, Any]:
        """Run one cycle, showing it as it goes when ``show``; its final state.

        Ctrl-C stops it: the model calls in progress end at their next token, nothing is
        committed, the thread gets the request's answer marked interrupted and
        ``CycleInterrupted`` is raised. Work that is no model call is given up on after two
        more (``StopOnInterrupt``).
        """
        answer: list[str] = []
        run = own_run(refuse_if_busy(self.graph, config))
        with StopOnInterrupt() as stop:
            try:
                self._stream(text, run, context, show, answer)
            except (GenerationCancelled, KeyboardInterrupt):
                stop.hold()
                if show:
                    console.print()
                kept = self.mark_interrupted(run_state(self.graph, run), "".join(answer))
                if kept is not None:
                    raise CycleInterrupted(
                        "interrupted: nothing was committed; "
                        + (
                            "the thread keeps the request, its answer marked interrupted"
                            if kept
                            else "the request had not reached the thread"
                        )
                    ) from None
            # what this run left, not what ``config`` names: after /undo that is the checkpoint
            # the run started from, and the thread's latest may be another process's run
            left = run_state(self.graph, run)
            assert left is not None, "a run that ran stored at least its input"
            return left.values

    def _stream(
        self,
        text: str,
        config: RunnableConfig,
        context: dict[str, Any],
        show: bool,
        answer: list[str],
    ) -> None:
        """Stream the cycle, printing it when ``show``; ``answer`` gets the answer so far."""
        stream = self.graph.stream(
            {"messages": [HumanMessage(text)]},
            config,
            context=context,
            stream_mode=["messages", "updates"],
        )
        answering = False
        for mode, payload in stream:
            if mode == "messages":
                chunk, meta = payload
                if meta.get("langgraph_node") == "synthesize":
                    if not answering:  # a gate's retry answers again, from the start
                        answer.clear()
                        answering = True
                        if show:
                            console.print("[bold]answer:[/] ", end="")
                    piece = content_text(chunk.content)
                    answer.append(piece)
                    if show:
                        console.print(piece, end="", markup=False)
                continue
            for node, update in (payload or {}).items():
                # the gate replaces an answer that twice contradicted its computed result:
                # what is kept is shown, not only what was streamed
                if show and (node == "synthesize" or (update or {}).get("response")):
                    _show_kept(update or {}, "".join(answer), cut=node == "synthesize")
                if answering and node != "synthesize":
                    answering = False
                    if show:
                        console.print()
                if show:
                    _show_update(node, update or {})

    def mark_interrupted(self, snapshot: StateSnapshot | None, answered: str) -> bool | None:
        """End the stopped cycle that left its thread at ``snapshot`` (``graph.mind.run_state``;
        None: it left nothing) as FAILED, in a checkpoint of its own after that one, with an
        answer marked interrupted (``batos_interrupted``; ``batos_failed``, so later cycles
        leave it out of the history they show the model) holding what was answered so far:
        the thread never keeps a request without its answer, and is idle. Its effects are
        dropped, so nothing is committed.

        True when the request is kept with its mark; False when the stop came before the
        request reached the thread's messages (the run that was to start is dropped); None when
        the cycle had ended before the stop took effect.
        """
        if snapshot is None:
            return False
        if not snapshot.next:
            return None
        config = snapshot.config
        values = snapshot.values
        messages = values.get("messages") or []
        if not messages or not isinstance(messages[-1], HumanMessage):
            self.graph.update_state(config, None, as_node=END)
            return False
        routed = not {"__start__", "route"} & set(snapshot.next)
        chosen = (values.get("route") or {}).get("chosen") if routed else None
        cycle_id = (values.get("cycle") or {}).get("id") if routed else None
        answered = answered[:MAX_ANSWER_CHARS].rstrip()
        mark = AIMessage(
            f"{answered} {INTERRUPTED}" if answered else INTERRUPTED,
            name=chosen[0].lower() if chosen else None,
            additional_kwargs={
                "batos_failed": True,
                "batos_interrupted": True,
                "batos_cycle": cycle_id,
            },
        )
        failure = {"node": snapshot.next[0], "reason": "interrupted by the user", "hint": ""}
        self.graph.update_state(
            config,
            {
                "messages": [mark],
                "status": "FAILED",
                "failure": failure,
                "effects": {"replace": []},
                "commit": None,
            },
            as_node="fail",
        )
        return True


def _show_update(node: str, update: dict[str, Any]) -> None:
    if node == "route" and update.get("route"):
        route, depth = update["route"], update["cycle"]["depth"]
        ranked = ", ".join(f"{p} {s:.2f}" for p, s in route["ranked"][:4])
        console.print(
            f"[cyan]route[/] → {shown(' + '.join(route['chosen']))}  ({shown(ranked)})  "
            f"[dim]depth {shown(depth['mode'])}: {shown(depth['rule'])}[/]"
        )
    elif node == "decompose" and update.get("plan"):
        for step in update["plan"]:
            step_name = shown(f"{step['persona']}.{step['facet']}")
            console.print(f"[cyan]plan[/]  {step_name}: {shown(step['query'])}")
    elif node == "facet":
        for partial in update.get("partials") or []:
            _show_partial(partial)
    elif node == "gate" and update.get("status") == "SYNTHESIZING":
        reason = shown(update["cycle"]["gate"]["reason"])
        console.print(f"[yellow]gate:[/] {reason}; answering again")


#: What each kind of partial answer did, as the stream shows it.
_PARTIAL_KINDS = {
    "instruction": "in the answer's outline",
    "note": "note written",
    "passages": "passages from memory",
    "computed": "computed",
}


def _show_partial(partial: dict[str, Any]) -> None:
    name = shown(f"{partial['persona']}.{partial['facet']}")
    seconds = f"{partial.get('seconds', 0):.1f}s"
    if not partial.get("ok"):
        console.print(f"[yellow]~[/] facet {name} ({seconds}): {shown(partial.get('reason', ''))}")
        return
    kind = partial.get("kind") or ""
    said = _PARTIAL_KINDS.get(kind, kind)
    if kind == "computed":
        said += f" = {shown(bounded_repr(partial.get('text'), 120).strip(chr(39)))}"
    elif kind == "passages":
        said = f"{len(partial.get('passages') or [])} {said}"
    wrote = " [magenta](method written)[/]" if partial.get("wrote") else ""
    console.print(f"[green]✓[/] facet {name} ({seconds}): {said}{wrote}")
    if partial.get("degraded"):
        console.print(f"  [yellow]degraded:[/] {shown(str(partial['degraded']))}")


def _show_kept(update: dict[str, Any], streamed: str, *, cut: bool = True) -> None:
    """What the kept answer adds to, or takes from, the streamed one: its sources line, the
    tail cut because the answer ran out of tokens (``cut``: the update is the synthesis's),
    or the whole of an answer put in its place."""
    final = update.get("response") or ""
    if not final or final == streamed:
        return
    body, _, sources = final.partition("\n\nSources: ")
    if cut and (update.get("cycle") or {}).get("truncated"):
        console.print("\n[dim](cut at its last full sentence: the answer ran out of tokens)[/]")
    if not streamed.startswith(body):  # a citation corrected, a placeholder taken out…
        console.print(f"\n[dim]kept as:[/] {shown(body)}")
    if sources:
        console.print(f"\n[dim]Sources: {shown(sources)}[/]")


def _summary(state: dict[str, Any]) -> dict[str, Any]:
    cycle_state = state.get("cycle") or {}
    metrics = state.get("metrics") or []
    return {
        "status": state.get("status"),
        "thread_id": cycle_state.get("thread_id"),
        "cycle": cycle_state.get("id"),
        "response": state.get("response") if state.get("status") == "COMPLETE" else None,
        "route": state.get("route"),
        "depth": cycle_state.get("depth"),
        "plan": state.get("plan"),
        "facets": [
            {
                k: p.get(k)
                for k in (
                    "persona",
                    "facet",
                    "kind",
                    "ok",
                    "seconds",
                    "wrote",
                    "reason",
                    "degraded",
                )
            }
            for p in state.get("partials") or []
        ],
        "degraded": cycle_state.get("degraded") or [],
        "truncated": bool(cycle_state.get("truncated")),
        "cited": cycle_state.get("cited") or [],
        "failure": state.get("failure"),
        "input_tokens": sum(m["input_tokens"] for m in metrics),
        "output_tokens": sum(m["output_tokens"] for m in metrics),
        "model_calls": len(metrics),
    }


def _outcome(state: dict[str, Any], *, as_json: bool) -> None:
    """Print how the cycle ended; a FAILED one raises ``CycleFailed`` (exit code 10)."""
    summary = _summary(state)
    if as_json:
        console.print_value_json(summary, "the cycle")
    if state.get("status") == "COMPLETE":
        if not as_json:
            seconds = dt.datetime.now().timestamp() - state["cycle"]["started"]
            console.print(
                f"[green]COMPLETE[/] cycle {shown(summary['cycle'])} on thread "
                f"{shown(summary['thread_id'])} "
                f"· committed with its checkpoint · {seconds:.1f}s · "
                f"{summary['model_calls']} model calls, {summary['output_tokens']} tokens out"
            )
            for entry in summary["degraded"]:
                times = f" ({entry['times']} times)" if entry.get("times") else ""
                console.print(
                    f"  [yellow]degraded[/] {shown(entry['where'])} {shown(entry['what'])}"
                    f"{times}: {shown(entry['reason'])}"
                )
        return
    failure = state.get("failure") or {}
    raise CycleFailed(
        f"the cycle FAILED at {failure.get('node')}: {failure.get('reason')}; "
        "the image is unchanged",
        hint=failure.get("hint") or None,
        state=state,
    )


def _thread_id(thread: str | None, command: str) -> str:
    """The thread ``--thread`` names, or a new one when it is left out. An empty one is
    refused: taken as left out, it started a new thread away from the conversation meant."""
    if thread is None:
        return f"{command}-{uuid6()}"
    if not thread.strip():
        raise typer.BadParameter(
            "a thread id cannot be empty (leave --thread out to start a new thread; "
            "'batos threads' lists those there are)",
            param_hint="--thread",
        )
    return check_thread_id(thread)


def _check_depth(depth: str) -> None:
    if depth not in DEPTHS:  # the mind's own refusal would hint at an API run context
        raise typer.BadParameter(f"choose {', '.join(DEPTHS)}", param_hint="--depth")


@mind_app.command()
def ask(
    ctx: typer.Context,
    text: str = typer.Argument(..., help="The request."),
    thread: str = typer.Option(
        None, "--thread", "-t", help="Continue this thread (a new one when left out)."
    ),
    persona: str = typer.Option(None, "--persona", "-p", help="Answer as this persona."),
    depth: str = typer.Option("auto", "--depth", help="auto, fast or full."),
    as_json: bool = typer.Option(False, "--json", help="Print the cycle as JSON at the end."),
) -> None:
    """Answer one request in one mind cycle, streamed: route, plan, facets, answer, commit.

    Examples: batos ask "how do I plan a garden?" · batos ask hi -t chat-1 --json
    """
    thread_id = _thread_id(thread, "ask")
    _check_depth(depth)
    text = clean_line(text)  # as a chat line is: no escape codes or controls in the thread
    session = Session(open_runtime(image_uri(ctx), models=model_factory(ctx)))
    try:
        state = session.cycle(
            text, run_config(thread_id), session.context(persona, depth), show=not as_json
        )
    finally:
        session.close()
    if not as_json:
        console.print()
    _outcome(state, as_json=as_json)


COMMANDS = (
    "thread",
    "history",
    "undo",
    "good",
    "bad",
    "persona",
    "depth",
    "cycles",
    "help",
    "quit",
)
CHAT_HELP = (
    "commands: /thread [ID|new]  /history  /undo  /good  /bad  /persona NAME|auto  "
    "/depth auto|fast|full  /cycles  /help  /quit  (anything else is a request; begin one "
    "with // to start it with /)\n"
    "keys: ↑/↓ earlier lines  Tab completes a /command  Ctrl-C stops an answer (at the prompt: "
    "clears the line)  Ctrl-D quits"
)


def chat_loop(
    session: Session,
    thread_id: str,
    persona: str | None,
    depth: str,
    reader: LineReader | None = None,
) -> None:
    """Read requests until /quit or end of input (Ctrl-D); each is one cycle on the current
    thread. Lines come from ``reader`` (by default readline's, on a terminal)."""
    reader = reader or LineReader(COMMANDS)
    config: RunnableConfig = run_config(thread_id)
    console.print(f"[dim]thread {thread_id} · {CHAT_HELP}[/]")
    while True:
        try:
            line = reader.read()
        except KeyboardInterrupt:  # Ctrl-C at the prompt: the line is dropped, a new prompt
            console.print()
            continue
        if line is None:
            console.print("\nbye")
            return
        if not line:
            continue
        if line.startswith("//"):  # a request that itself begins with '/': a path, say
            line = line[1:]
        elif line.startswith("/"):
            command, _, argument = line[1:].partition(" ")
            argument = argument.strip()
            if command in ("quit", "exit"):
                return
            # A command can fail as a request can (a malformed thread id; a thread stored by
            # an earlier version with a client's refused message answers every read with
            # GraphRequestError until its next request): the error is said, and the chat goes on.
            try:
                if command == "help":
                    console.print(CHAT_HELP)
                elif command == "thread":
                    if argument:  # a malformed id is said, and the thread stays
                        config = run_config(f"chat-{uuid6()}" if argument == "new" else argument)
                    console.print(f"thread {shown(config['configurable']['thread_id'])}")
                elif command == "history":
                    _show_history(session, config)
                elif command == "undo":
                    config = _undo(session, config)
                elif command in ("good", "bad"):
                    _mark(session, config, command)
                elif command == "persona":
                    chosen = None if argument.lower() in ("", "auto") else argument.upper()
                    if chosen is not None and chosen not in PERSONAS:  # said now, not next request
                        console.print(
                            f"[red]no persona {shown(argument)}[/]: /persona "
                            f"{'|'.join(p.lower() for p in PERSONAS)}|auto"
                        )
                        continue
                    persona = chosen
                    console.print(f"persona {shown(persona or 'routed')}")
                elif command == "depth":
                    if (argument or "auto") not in DEPTHS:
                        console.print(
                            f"[red]no depth {shown(argument)}[/]: /depth {'|'.join(DEPTHS)}"
                        )
                        continue
                    depth = argument or "auto"
                    console.print(f"depth {shown(depth)}")
                elif command == "cycles":  # as 'batos cycles' lists them
                    cycles_table(session.image, None, 10)
                    print_failed(session.image, 10)
                else:
                    console.print(f"[red]unknown command /{shown(command)}[/]\n{CHAT_HELP}")
            except GraphRequestError as exc:  # the client's hint (what to send) is no help here
                thread = shown(config["configurable"]["thread_id"])
                console.print(f"[red]thread {thread} cannot be read: {shown(exc.message)}[/]")
                console.print(
                    "[yellow]hint:[/] it holds a client's input that was refused; its next "
                    "request goes on as usual"
                )
            except BatosError as exc:
                _report(exc)
            continue
        try:
            state = session.cycle(line, config, session.context(persona, depth))
            console.print()
            _outcome(state, as_json=False)
        except CycleInterrupted as exc:
            console.print(f"[yellow]{shown(exc.message)}[/]")
        except BatosError as exc:
            _report(exc)
        except KeyboardInterrupt:  # Ctrl-C after the cycle ended, while its outcome printed
            console.print()
        # after a fork (/undo) the next cycle continues from the fork's new head
        config = run_config(config["configurable"]["thread_id"])


def _report(exc: BatosError) -> None:
    """An error said at the chat's prompt, with its hint: the chat goes on."""
    console.print(f"[red]{shown(exc.message)}[/]")
    if exc.hint:
        console.print(f"[yellow]hint:[/] {shown(exc.hint)}")


def _show_history(session: Session, config: RunnableConfig) -> None:
    messages = session.graph.get_state(config).values.get("messages") or []
    if not messages:
        console.print("[dim](no messages yet)[/]")
    for message in messages:
        who = "you" if message.type == "human" else (message.name or "batos")
        console.print(f"[bold]{shown(who)}:[/] {shown(content_text(message.content))}")


def _mark(session: Session, config: RunnableConfig, verdict: str) -> None:
    """Mark the thread's last answer good or bad: what its persona learns from (or never)."""
    from graph import learning

    messages = session.graph.get_state(config).values.get("messages") or []
    cycles = [m.additional_kwargs.get("batos_cycle") for m in messages if m.type == "ai"]
    cycle_id = next((c for c in reversed(cycles) if c), None)
    if cycle_id is None:
        console.print("no answer to mark yet")
        return
    try:
        lesson = learning.mark(
            session.image, config["configurable"]["thread_id"], cycle_id, verdict
        )
    except BatosError as exc:
        console.print(f"[red]{shown(exc.message)}[/]")
        return
    console.print(
        f"marked {verdict}: {shown(lesson['persona'])} learns from cycle {cycle_id}"
        if verdict == "good"
        else f"marked bad: cycle {cycle_id} is never trained on"
    )


def _ancestry(session: Session, config: RunnableConfig) -> Iterator[Any]:
    """The conversation's checkpoints from where ``config`` stands back to its first, parent
    by parent. After an undo the config names a checkpoint, and the thread's history listed
    from it would hold that one alone; a thread's newest checkpoints may be another branch."""
    at: RunnableConfig | None = config
    while at is not None:
        snapshot = session.graph.get_state(at)
        if not snapshot.config:  # an empty thread
            return
        yield snapshot
        at = snapshot.parent_config


def _undo(session: Session, config: RunnableConfig) -> RunnableConfig:
    """Fork the thread from just before its last request; the image keeps what was learned."""
    for snapshot in _ancestry(session, config):
        if snapshot.metadata and snapshot.metadata.get("source") == "input":
            if any(task.name == "__start__" and task.error for task in snapshot.tasks):
                continue  # a client's input that was refused: nothing of it ran
            parent = snapshot.parent_config
            if parent is None:
                console.print("nothing before the first request: starting a new thread")
                return run_config(f"chat-{uuid6()}")
            console.print(
                "the last exchange is undone for this conversation (the image keeps what the "
                "cycle committed; 'batos history' and 'batos undo TID' revert that)"
            )
            return {**config, "configurable": {**parent["configurable"]}}
    console.print("nothing to undo")
    return config


@mind_app.command()
def chat(
    ctx: typer.Context,
    thread: str = typer.Option(
        None, "--thread", "-t", help="Continue this thread (a new one when left out)."
    ),
    persona: str = typer.Option(None, "--persona", "-p", help="Answer as this persona."),
    depth: str = typer.Option("auto", "--depth", help="auto, fast or full."),
) -> None:
    """Talk with BAT OS: each line is one mind cycle, streamed. /help lists the commands and
    keys: arrows recall earlier lines, Ctrl-C stops an answer, Ctrl-D quits.

    Example: batos chat -t kitchen
    """
    thread_id = _thread_id(thread, "chat")
    _check_depth(depth)
    session = Session(open_runtime(image_uri(ctx), models=model_factory(ctx)))
    try:
        chat_loop(session, thread_id, persona, depth)
    finally:
        session.close()


def _port_free(host: str, port: int) -> None:
    """Refuse a port something already listens on: the LangGraph server would move to another
    one on its own, and clients of this one would reach whatever holds it."""
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise BatosError(
                f"{host}:{port} cannot be served: {exc.strerror or exc}",
                hint="pick another port with --port, or stop what listens there",
            ) from None


@mind_app.command()
def serve(
    ctx: typer.Context,
    host: str = typer.Option("127.0.0.1", "--host", help="Loopback address to listen on."),
    port: int = typer.Option(2024, "--port", help="Port."),
    config: Path = typer.Option(
        Path("langgraph.json"), "--config", help="The LangGraph configuration file."
    ),
    jobs: int = typer.Option(
        1, "--jobs", "-j", min=1, max=256, help="Runs this server executes at once."
    ),
) -> None:
    """Run the LangGraph server (as 'langgraph dev' does, without the browser) on loopback,
    with the image as its checkpointer and store; Studio and langgraph_sdk clients connect.

    Runs beyond --jobs wait in the server's queue. Concurrent runs commit to the image in
    their own transactions; write conflicts between them are retried.

    Example: BATOS_IMAGE=zeo://127.0.0.1:8100 batos serve --port 2024 --jobs 16
    """
    import os

    if host not in LOOPBACK:
        raise BatosError(
            f"'batos serve' listens on loopback only, not {host}",
            hint="put a reverse proxy with authentication in front of it to reach it remotely",
        )
    try:
        import langgraph_cli.config as cli_config
        from langgraph_api.cli import run_server
    except ImportError as exc:
        raise BatosError(
            "the LangGraph server is not installed",
            hint='pip install "langgraph-cli[inmem]==0.4.40"',
        ) from exc
    if not config.is_file():
        raise BatosError(f"no {config}", hint="run it in the project folder, or pass --config")
    if not 1 <= port <= 65535:
        raise typer.BadParameter("a port is a number from 1 to 65535", param_hint="--port")
    _port_free(host, port)
    # The server opens the image only inside its startup, where a missing or busy image is a
    # page of uvicorn tracebacks (and a missing one would be created): it is opened here first.
    with open_image(image_uri(ctx)):
        pass
    os.environ["BATOS_IMAGE"] = image_uri(ctx)  # the checkpointer and store factories read it
    settings_json = cli_config.validate_config_file(config)
    folder = config.resolve().parent
    for dependency in settings_json.get("dependencies", []):
        path = (folder / dependency).resolve()
        if path.is_dir() and str(path) not in sys.path:
            sys.path.append(str(path))
    os.chdir(folder)
    console.print(
        f"serving {', '.join(settings_json['graphs'])} at http://{host}:{port}", markup=False
    )
    uri = image_uri(ctx)
    run_server(
        host,
        port,
        False,
        settings_json["graphs"],
        open_browser=False,
        n_jobs_per_worker=jobs,
        # The dev server's blockbuster raises on blocking I/O in *any* running event loop; a
        # ZEO client runs its own loop in its networking thread and reads its cache file there
        # by design, so every load would fail. The server's own loop is still not blocked:
        # the checkpointer and store run their image work in executor threads.
        allow_blocking=urlsplit(uri).scheme == "zeo",
        env=settings_json.get("env"),
        store=settings_json.get("store"),
        checkpointer=settings_json.get("checkpointer"),
        http=settings_json.get("http"),
    )


def register(app: typer.Typer) -> None:
    for command in mind_app.registered_commands:
        app.registered_commands.append(command)
