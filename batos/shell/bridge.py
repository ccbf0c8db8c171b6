"""The Synaptic Bridge: the mind graph behind a ZeroMQ ROUTER socket, for clients that speak it.

A request is one multipart message from a DEALER socket (a REQ socket reads only the first
reply); the bridge answers it with a stream of multipart messages, the last of which is
``result`` or ``error``. Several requests may be in flight on one connection: every reply names
its request id.

    client → bridge   [b"BATOS/1", request_id, body]         body: JSON, at most MAX_BODY_BYTES
        {"thread_id": "kitchen",                             optional; a new id when left out
         "input": {"messages": [{"role": "user", "content": "hello"}]},
         "context": {"persona": "robin", "depth": "auto"}}   optional, as the server's context
    bridge → client   [request_id, kind, JSON]
        accepted  {"thread_id": ...}                         the request passed the first checks
        token     {"node": "synthesize", "text": "Hel"}      answer tokens as the model writes
        update    {"node": "route", "status": "ROUTE"}       a node finished (its next status)
        result    {"thread_id", "status", "response", "failure", "cycle"}   the cycle's end
        error     {"error": "GraphRequestError", "message": ..., "hint": ...}   nothing ran

Validation and errors are the HTTP server's: the same graph checks the input (a malformed
message is a ``GraphRequestError``; an unknown persona or an empty request ends the cycle
FAILED, reported in ``result``), thread ids follow ``graph.request.check_thread_id``, and every
frame is bounded before it is parsed. Requests run on a bounded pool of threads; one socket
thread owns the ROUTER socket (ZeroMQ sockets are not thread-safe) and forwards the workers'
replies, which reach it over an in-process PULL socket.

Bounds, each answered with an ``error`` that says which: a message is read one frame at a time,
without copying, and one with more than ``MAX_FRAMES`` frames or ``MAX_MESSAGE_BYTES`` in all is
dropped as it is read — its frames released one by one, never gathered; a client (one
connection's identity) has at most ``MAX_PER_CLIENT`` requests in flight, the bridge
``MAX_WAITING``. What the bridge cannot bound: libzmq hands a multipart message over only once
its last frame has arrived, and until then holds every frame itself (``MAXMSGSIZE`` bounds each
frame, nothing in libzmq their number), so one message over the bounds still costs its size in
memory while it arrives; ``RECEIVE_QUEUE`` bounds how many whole messages libzmq queues for one
connection before it stops reading from it.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import zmq

from batos.errors import BatosError, GraphRequestError
from batos.shell.runtime import Runtime
from graph.mind import MindContext, MindServices, own_run, refuse_if_busy, run_state
from graph.request import check_thread_id, content_text
from prototypes.bounded import strict_json

log = logging.getLogger("batos.bridge")

PROTOCOL = b"BATOS/1"
#: Largest request body, in bytes; larger ones are refused before they are parsed.
MAX_BODY_BYTES = 1 << 20
#: Longest request id, in bytes.
MAX_ID_BYTES = 64
#: Requests running at once; more wait, up to MAX_WAITING, and past that are refused.
WORKERS = 4
MAX_WAITING = 64
#: Requests one client (one connection's identity) may have in flight; more are refused.
MAX_PER_CLIENT = 8
#: Largest message in all, and largest frame (libzmq drops a peer that sends a larger frame).
MAX_MESSAGE_BYTES = MAX_BODY_BYTES + 4096
#: Frames of a request: the identity, a REQ client's empty delimiter, protocol, id and body.
MAX_FRAMES = 5
#: Whole messages libzmq queues for one connection before it stops reading from it.
RECEIVE_QUEUE = 16
LOOPBACK_PREFIXES = ("tcp://127.0.0.1:", "tcp://localhost:", "tcp://[::1]:", "ipc://", "inproc://")
_REQUEST_HINT = (
    'send [b"BATOS/1", request_id, body] with body {"input": {"messages": [{"role": "user", '
    '"content": "..."}]}, "context": {"persona": "robin"}, "thread_id": "t1"} (docs/serving.md: '
    "The Synaptic Bridge)"
)


def check_bind(address: str) -> str:
    """``address`` if it is a loopback (or local) endpoint; the bridge has no authentication."""
    if not address.startswith(LOOPBACK_PREFIXES):
        raise BatosError(
            f"the bridge binds to loopback only, not {address[:200]!r}",
            hint="use tcp://127.0.0.1:PORT (or ipc://PATH); reach it remotely through an "
            "authenticated tunnel (ssh -L)",
        )
    return address


def _json(data: dict[str, Any]) -> bytes:
    return json.dumps(data, default=str).encode("utf-8")


def parse_request(frames: list[bytes]) -> tuple[bytes, dict[str, Any]]:
    """``(request_id, body)`` from a request's frames (identity and delimiter removed);
    ``GraphRequestError`` saying what is wrong otherwise."""
    if len(frames) != 3 or frames[0] != PROTOCOL:
        raise GraphRequestError(
            f"a request is 3 frames starting with {PROTOCOL.decode()}, not {len(frames)} "
            f"starting with {frames[0][:16]!r}"
            if frames
            else "an empty request",
            hint=_REQUEST_HINT,
        )
    _, request_id, body = frames
    if not request_id or len(request_id) > MAX_ID_BYTES:
        raise GraphRequestError(
            f"the request id is {len(request_id)} bytes; give 1 to {MAX_ID_BYTES}",
            hint=_REQUEST_HINT,
        )
    if len(body) > MAX_BODY_BYTES:
        raise GraphRequestError(
            f"the request body is {len(body):,} bytes; the bridge accepts {MAX_BODY_BYTES:,}",
            hint="ingest long material with 'batos ingest' and ask about it",
        )
    try:
        payload = strict_json(body.decode("utf-8"), max_int_digits=MAX_INT_DIGITS)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]
        raise GraphRequestError(
            f"the request body is not JSON: {reason}", hint=_REQUEST_HINT
        ) from None
    if not isinstance(payload, dict):
        raise GraphRequestError(
            f"the request body is {_JSON_KINDS.get(type(payload), 'JSON')}, not an object",
            hint=_REQUEST_HINT,
        )
    unknown = sorted(set(payload) - {"input", "context", "thread_id"})
    if unknown:
        raise GraphRequestError(
            f"unknown request field(s): {', '.join(map(repr, unknown))[:200]}",
            hint=_REQUEST_HINT,
        )
    for field in ("input", "context"):
        if not isinstance(payload.get(field, {}), dict):
            raise GraphRequestError(f"{field!r} must be a JSON object", hint=_REQUEST_HINT)
    if "input" not in payload:
        raise GraphRequestError("the request has no 'input'", hint=_REQUEST_HINT)
    # The server drops context keys its schema lacks (with a log line the client never sees);
    # a bridge client is told, so that "depht": "fast" is not a fast request answered in full.
    strange = sorted(set(payload.get("context") or {}) - set(MindContext.__annotations__))
    if strange:
        raise GraphRequestError(
            f"unknown context key(s): {', '.join(map(repr, strange))[:200]}",
            hint=f"the context takes {' and '.join(MindContext.__annotations__)} (both optional)",
        )
    return request_id, payload


#: What a JSON value other than an object is called in an error.
_JSON_KINDS = {
    list: "a JSON array",
    str: "a JSON string",
    int: "a JSON number",
    float: "a JSON number",
    bool: "JSON true or false",
    type(None): "JSON null",
}
#: Digits of the longest integer a body may hold (Python's own limit says its setting's name).
MAX_INT_DIGITS = 100


def receive(socket: zmq.Socket) -> tuple[list[bytes], str | None]:
    """One message from ``socket``, read frame by frame without copying: ``(frames, None)``,
    or, past ``MAX_FRAMES`` or ``MAX_MESSAGE_BYTES``, the frames within the bounds and why the
    message was dropped. The rest of a dropped message is still read to its end — the next
    message starts after it — but each frame is released as soon as it is counted."""
    kept: list[bytes] = []
    frames = size = 0
    over = None
    more = True
    while more:
        frame = socket.recv(copy=False)
        more = frame.more
        frames += 1
        size += len(frame)
        if over is None and frames > MAX_FRAMES:
            over = f"it has more than {MAX_FRAMES} frames"
        elif over is None and size > MAX_MESSAGE_BYTES:
            over = f"it is over {MAX_MESSAGE_BYTES:,} bytes"
        if over is None:
            kept.append(frame.bytes)
    if over is None:
        return kept, None
    return kept, f"{over} ({frames:,} frames, {size:,} bytes)"


class Bridge:
    """The ROUTER endpoint over one image; ``serve()`` runs until ``stop()``."""

    def __init__(
        self,
        runtime: Runtime,
        address: str,
        services: MindServices | None = None,
        *,
        context: zmq.Context | None = None,
        workers: int = WORKERS,
    ) -> None:
        self.address = check_bind(address)
        self.image = runtime.image
        self.saver = runtime.saver
        self.graph = runtime.mind(services)
        self.zmq = context or zmq.Context.instance()
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="bridge")
        self._outbox = f"inproc://batos-bridge-{uuid.uuid4().hex}"
        self._local = threading.local()
        self._pending = 0
        #: Requests in flight per client identity; a client leaves it with its last request.
        self._in_flight: dict[bytes, int] = {}
        #: Threads a request is answering now: a second at once would fork the thread.
        self._threads: set[str] = set()
        self._pushers: list[zmq.Socket] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self.bound = threading.Event()
        self.endpoint = ""

    # -- the socket thread ------------------------------------------------------------------

    def serve(self, ready: Callable[[str], None] | None = None) -> None:
        """Answer requests until ``stop()``; ``ready(endpoint)`` is called once bound."""
        router = self.zmq.socket(zmq.ROUTER)
        router.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        router.setsockopt(zmq.RCVHWM, RECEIVE_QUEUE)
        router.setsockopt(zmq.LINGER, 1000)
        inbox = self.zmq.socket(zmq.PULL)
        try:
            try:
                router.bind(self.address)
            except zmq.ZMQError as exc:
                raise BatosError(
                    f"the bridge cannot bind {self.address}: {exc}",
                    hint="pick a free port: batos bridge --bind tcp://127.0.0.1:PORT",
                ) from exc
            self.endpoint = router.getsockopt_string(zmq.LAST_ENDPOINT)
            inbox.bind(self._outbox)
            poller = zmq.Poller()
            poller.register(router, zmq.POLLIN)
            poller.register(inbox, zmq.POLLIN)
            self.bound.set()
            log.info("bridge listening on %s", self.endpoint)
            if ready is not None:
                ready(self.endpoint)
            while not self._stopping.is_set():
                for sock, _ in poller.poll(100):
                    if sock is inbox:
                        router.send_multipart(inbox.recv_multipart())
                    else:
                        self._accept(router, *receive(router))
            # Running requests finish and their replies go out; forwarding goes on meanwhile,
            # or a worker blocked on a full in-process queue would never finish. A request
            # that reaches the socket now is refused, not left unread: its client would wait
            # for a reply for ever.
            while True:
                with self._lock:
                    idle = self._pending == 0
                waiting = dict(poller.poll(0 if idle else 100))
                if inbox in waiting:
                    router.send_multipart(inbox.recv_multipart())
                if router in waiting:
                    self._refuse(router, *receive(router))
                if idle and not waiting:
                    break
            self.pool.shutdown(wait=True)
            while inbox.poll(50):
                router.send_multipart(inbox.recv_multipart())
            while router.poll(0):
                self._refuse(router, *receive(router))
        finally:
            self.bound.set()
            self.pool.shutdown(wait=True)
            for pusher in self._pushers:  # their threads are done: closing them is safe
                pusher.close(linger=0)
            inbox.close(linger=0)
            router.close()  # the checkpointer is the runtime's: its owner closes it

    def stop(self) -> None:
        self._stopping.set()

    @property
    def stopping(self) -> bool:
        """Whether ``stop()`` was called (the running requests may still be answering)."""
        return self._stopping.is_set()

    @staticmethod
    def _envelope(frames: list[bytes]) -> tuple[list[bytes], list[bytes], bytes]:
        """The reply envelope, the request's own frames, and its id (``b"?"`` if unreadable)."""
        client = frames[0]
        rest = frames[1:]
        envelope = [client]
        if rest and rest[0] == b"":  # a REQ client puts an empty delimiter first
            rest, envelope = rest[1:], [client, b""]
        request_id = rest[1] if len(rest) > 1 and len(rest[1]) <= MAX_ID_BYTES else b"?"
        return envelope, rest, request_id

    def _refuse(self, router: zmq.Socket, frames: list[bytes], dropped: str | None) -> None:
        """Answer a request that came after ``stop()`` with the error that says so."""
        envelope, _, request_id = self._envelope(frames)
        if dropped is not None:
            log.warning("bridge dropped a message from client %s: %s", envelope[0].hex(), dropped)
        router.send_multipart([*envelope, request_id, b"error", _json(_error(_stopping()))])

    def _accept(self, router: zmq.Socket, frames: list[bytes], dropped: str | None) -> None:
        envelope, rest, request_id = self._envelope(frames)
        client = envelope[0]
        try:
            if dropped is not None:
                log.warning("bridge dropped a message from client %s: %s", client.hex(), dropped)
                raise GraphRequestError(f"the message was dropped: {dropped}", hint=_REQUEST_HINT)
            request_id, payload = parse_request(rest)
            with self._lock:
                if self._pending >= MAX_WAITING:
                    raise GraphRequestError(
                        f"the bridge is busy: {MAX_WAITING} requests are waiting",
                        hint="retry later, or run another bridge on a ZEO-served image",
                    )
                if self._in_flight.get(client, 0) >= MAX_PER_CLIENT:
                    raise GraphRequestError(
                        f"the bridge is busy: this client has {MAX_PER_CLIENT} requests in flight",
                        hint="wait for a result or error before sending more",
                    )
                self._pending += 1
                self._in_flight[client] = self._in_flight.get(client, 0) + 1
        except BatosError as exc:
            router.send_multipart([*envelope, request_id, b"error", _json(_error(exc))])
            return
        self.pool.submit(self._run, envelope, request_id, payload)

    # -- the workers --------------------------------------------------------------------------

    def _send(self, envelope: list[bytes], request_id: bytes, kind: str, data: dict) -> None:
        out = getattr(self._local, "out", None)
        if out is None:
            out = self._local.out = self.zmq.socket(zmq.PUSH)
            out.connect(self._outbox)
            with self._lock:
                self._pushers.append(out)
        out.send_multipart([*envelope, request_id, kind.encode(), _json(data)])

    def _run(self, envelope: list[bytes], request_id: bytes, payload: dict[str, Any]) -> None:
        try:
            if self._stopping.is_set():
                # Waiting when the bridge was told to stop: refused, so that a stop waits for
                # the requests running, not for every one queued behind them.
                raise _stopping()
            self._answer(envelope, request_id, payload)
        except BatosError as exc:
            self._send(envelope, request_id, "error", _error(exc))
        except Exception as exc:  # reported to the client, logged in full here
            log.exception("bridge request %r failed", request_id)
            self._send(
                envelope,
                request_id,
                "error",
                {"error": type(exc).__name__, "message": str(exc)[:500], "hint": "see the log"},
            )
        finally:
            with self._lock:
                self._pending -= 1
                left = self._in_flight.pop(envelope[0]) - 1
                if left:
                    self._in_flight[envelope[0]] = left

    def _answer(self, envelope: list[bytes], request_id: bytes, payload: dict[str, Any]) -> None:
        thread_id = payload.get("thread_id")
        thread_id = check_thread_id(thread_id) if thread_id is not None else f"zmq-{uuid.uuid4()}"
        with self._lock:
            if thread_id in self._threads:
                # Both runs would start from the same checkpoint: the thread would fork, and
                # the conversation keep one of the two exchanges (LangGraph's server refuses
                # it too).
                raise GraphRequestError(
                    f"thread {thread_id} is answering another request",
                    hint="wait for that request's result, then send this one again",
                )
            self._threads.add(thread_id)
        try:
            result = self._answer_on(envelope, request_id, payload, thread_id)
        finally:
            with self._lock:
                self._threads.discard(thread_id)
        # Sent once the thread is free: a client that sends its next request on seeing the
        # result must not find the thread still taken.
        self._send(envelope, request_id, "result", result)

    def _answer_on(
        self, envelope: list[bytes], request_id: bytes, payload: dict[str, Any], thread_id: str
    ) -> dict[str, Any]:
        config = own_run({"configurable": {"thread_id": thread_id}, "recursion_limit": 40})
        config = refuse_if_busy(self.graph, config)  # another process's run on the thread
        self._send(envelope, request_id, "accepted", {"thread_id": thread_id})
        for mode, chunk in self.graph.stream(
            payload["input"],
            config,
            context=payload.get("context") or {},
            stream_mode=["messages", "updates"],
        ):
            if mode == "messages":
                message, meta = chunk
                text = content_text(getattr(message, "content", ""))
                if text:
                    node = meta.get("langgraph_node", "")
                    self._send(envelope, request_id, "token", {"node": node, "text": text})
            elif mode == "updates":
                for node, update in chunk.items():
                    status = update.get("status") if isinstance(update, dict) else None
                    self._send(envelope, request_id, "update", {"node": node, "status": status})
        # The state this run left, not the thread's latest: on an image shared over ZEO another
        # process (the LangGraph server, a chat) may have answered on the thread since.
        left = run_state(self.graph, config)
        assert left is not None, "a run that ran stored at least its input"
        values = left.values
        return {
            "thread_id": thread_id,
            "status": values.get("status"),
            "response": values.get("response", ""),
            "failure": values.get("failure"),
            "cycle": (values.get("cycle") or {}).get("id"),
        }


def _stopping() -> GraphRequestError:
    return GraphRequestError(
        "the bridge is stopping: this request did not start",
        hint="send it again to a bridge that is running",
    )


def _error(exc: BatosError) -> dict[str, Any]:
    return {"error": type(exc).__name__, "message": exc.message, "hint": exc.hint or ""}
