"""The one HTTP client tool proxies use: a checked request sent with httpx, its answer read
within bounds and handed back as plain data.

Only ``prototypes.tools.perform`` calls ``send``, after the request passed the policy. Here:
redirects are followed by hand, each hop checked against ``tools_allow`` again (and a secret
is sent to its own origin only); the whole call, redirects and body included, has one deadline
(``tools_timeout``), held on every read and write of the socket (a service that dribbles its
headers, or sends ``102 Processing`` for ever, is cut off at the deadline); the answer is
asked for unencoded, a gzip or deflate one is decompressed here at most ``tools_max_bytes``
at a time and refused past it (a bomb stops at the limit), and any other encoding is refused
unread; the environment's proxies and ``.netrc`` are ignored (``trust_env=False``), so no
credential of the host's leaks into a call; and every secret value the request carried is
written as its name (``env:NAME``) wherever the answer or an error holds it (the final URL,
an echo, a refused redirect), before anything is cut to length, since both go on to
generated code and prompts.

Exceptions are translated at this boundary, in one table (``_FAILURES``)::

    httpx.TimeoutException   → ToolCallFailed  (raise BATOS_TOOLS_TIMEOUT, or try later)
    httpx.ConnectError       → ToolCallFailed  (is the service up? is the URL right?)
    httpx.HTTPError (other)  → ToolCallFailed
    a request httpx cannot build → ToolRefused
    redirect off the policy  → ToolRefused
    body over the limit, in an encoding not asked for, not JSON when JSON was expected
                             → ToolCallFailed
"""

from __future__ import annotations

import atexit
import logging
import re
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote, quote_plus

import httpcore
import httpx

from batos.errors import ToolCallFailed, ToolRefused
from prototypes.bounded import bounded_repr, strict_json
from prototypes.tools import ToolPolicy, ToolRequest, origin_of, secret_value

log = logging.getLogger("batos.tools")

#: Redirects followed before the call fails.
MAX_REDIRECTS = 3
#: Response headers handed back, and the characters of each value.
MAX_HEADERS = 32
MAX_HEADER_CHARS = 1_024
#: Characters of an unreadable body quoted in the error.
QUOTED_BODY_CHARS = 80
_REDIRECTS = frozenset({301, 302, 303, 307, 308})

_client: httpx.Client | None = None
_client_lock = threading.Lock()

#: The deadline (``time.monotonic()``) of the call this thread is making, if any.
_call = threading.local()


@contextmanager
def _deadline(at: float) -> Iterator[None]:
    _call.deadline = at
    try:
        yield
    finally:
        _call.deadline = None


def _left(timeout: float | None, error: type[Exception]) -> float | None:
    """``timeout`` cut to what is left of this thread's call; ``error`` once nothing is."""
    at = getattr(_call, "deadline", None)
    if at is None:
        return timeout
    left = at - time.monotonic()
    if left <= 0:
        raise error("the call's deadline passed")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A socket whose every read and write waits at most until the call's deadline.

    httpx's timeouts hold per read: a service that sends a header line, or a ``102
    Processing``, just inside each one would keep a call open for ever."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        wrapped = self._inner.start_tls(
            ssl_context, server_hostname, _left(timeout, httpcore.ConnectTimeout)
        )
        return _DeadlineStream(wrapped)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    """httpcore's sockets, each stream held to the call's deadline."""

    def __init__(self) -> None:
        self._inner = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        stream = self._inner.connect_tcp(
            host, port, _left(timeout, httpcore.ConnectTimeout), local_address, socket_options
        )
        return _DeadlineStream(stream)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def _shared_client() -> httpx.Client:
    global _client
    with _client_lock:
        if _client is None:
            transport = httpx.HTTPTransport(trust_env=False)
            # httpcore takes a network backend (its hook for the sockets); httpx's transport
            # does not pass one through, so it is set on the pool the transport built.
            pool = transport._pool
            assert isinstance(pool, httpcore.ConnectionPool), "no proxy: trust_env is off"
            pool._network_backend = _DeadlineBackend()
            _client = httpx.Client(
                transport=transport,
                follow_redirects=False,
                trust_env=False,
                # Unencoded: httpx decodes a whole chunk before anything can count its size.
                headers={"User-Agent": "batos-tools/1", "Accept-Encoding": "identity"},
            )
            atexit.register(_client.close)
        return _client


_FAILURES: tuple[tuple[type[httpx.HTTPError], str, str], ...] = (
    (
        httpx.TimeoutException,
        "did not answer within {timeout:g} s (tools_timeout)",
        "try again later, or raise BATOS_TOOLS_TIMEOUT if the service is slow by nature",
    ),
    (
        httpx.ConnectError,
        "could not be reached ({error})",
        "check that the service is up and that the tool's URL is right ('batos tools show')",
    ),
    (
        httpx.HTTPError,
        "failed: {error}",
        "try again; if it keeps failing, check the tool's URL ('batos tools show')",
    ),
)


def _translated(
    exc: httpx.HTTPError, req: ToolRequest, timeout: float, scrub: Callable[[str], str]
) -> ToolCallFailed:
    for kind, text, hint in _FAILURES:
        if isinstance(exc, kind):
            said = text.format(timeout=timeout, error=bounded_repr(scrub(str(exc)), 200)[1:-1])
            return ToolCallFailed(f"{req.summary()} {said}", hint=hint)
    raise AssertionError("httpx.HTTPError is the last row")  # pragma: no cover


def _with_secrets(req: ToolRequest, url: str) -> tuple[dict[str, str], dict[str, str]]:
    """Headers and parameters with every named secret read from the environment now."""
    headers = dict(req.headers)
    params = dict(req.params)
    for target, refs in ((headers, req.secret_headers), (params, req.secret_params)):
        for name, ref in refs:
            scheme_word, _, env_name = ref.rpartition(" ")
            value = secret_value(env_name.removeprefix("env:"))
            target[name] = f"{scheme_word} {value}" if scheme_word else value
    return headers, params


def _scrubber(req: ToolRequest) -> Callable[[str], str]:
    """A function writing every form of every secret ``req`` carries as ``env:NAME``: the
    final URL holds a secret parameter, a service may echo one back, an error may quote the
    request, and all of it goes on to generated code (a reading phase) and into prompts."""
    marks: dict[str, str] = {}
    for name in req.secrets():
        value = secret_value(name)
        for form in {value, quote(value, safe=""), quote_plus(value, safe="")}:
            marks[form] = f"env:{name}"
    if not marks:
        return lambda text: text
    pattern = re.compile("|".join(re.escape(f) for f in sorted(marks, key=len, reverse=True)))
    return lambda text: pattern.sub(lambda m: marks[m.group(0)], text)


def send(req: ToolRequest, policy: ToolPolicy) -> dict[str, Any]:
    """Send ``req`` (already checked against ``policy``); ``{"status", "url", "headers",
    "json" | "text"}``. ``ToolCallFailed`` / ``ToolRefused`` say what went wrong, with no
    secret value in what they say."""
    scrub = _scrubber(req)
    started = time.monotonic()
    try:
        with _deadline(started + policy.timeout):
            return _send(req, policy, started, scrub)
    except (ToolCallFailed, ToolRefused) as exc:  # every message, whoever wrote it
        raise type(exc)(
            scrub(exc.message), hint=None if exc.hint is None else scrub(exc.hint)
        ) from None


def _send(
    req: ToolRequest, policy: ToolPolicy, started: float, scrub: Callable[[str], str]
) -> dict[str, Any]:
    deadline = started + policy.timeout
    first_origin = origin_of(req.url)
    method, url, body = req.method, req.url, req.body
    headers, params = _with_secrets(req, url)
    client = _shared_client()
    for hop in range(MAX_REDIRECTS + 1):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ToolCallFailed(
                f"{req.summary()} did not finish within {policy.timeout:g} s (tools_timeout)",
                hint="raise BATOS_TOOLS_TIMEOUT if the service is slow by nature",
            )
        try:
            outgoing = client.build_request(
                method,
                url,
                params=params or None,
                headers=headers,
                json=body,
                timeout=httpx.Timeout(remaining),
            )
        except (httpx.InvalidURL, UnicodeError, ValueError, TypeError) as exc:
            # read_request refuses what it knows of; this is the rest, said as the draft's.
            raise ToolRefused(
                f"{req.summary()} cannot be sent as built: "
                f"{bounded_repr(scrub(str(exc)), 200)[1:-1]}; nothing was sent",
                hint="build the request from plain text and numbers: printable header values, "
                "a URL without control characters",
            ) from None
        try:
            response = client.send(outgoing, stream=True)
        except httpx.HTTPError as exc:
            raise _translated(exc, req, policy.timeout, scrub) from exc
        try:
            location = response.headers.get("location")
            if response.status_code in _REDIRECTS and location:
                if hop == MAX_REDIRECTS:
                    raise ToolCallFailed(
                        f"{req.summary()} was redirected more than {MAX_REDIRECTS} times",
                        hint="call the final URL directly",
                    )
                target = str(response.url.join(location))
                if response.status_code == 303 or (
                    response.status_code in (301, 302) and method == "POST"
                ):
                    method, body = "GET", None
                try:
                    policy.check(method, target)
                except (ToolRefused, ValueError) as exc:
                    reason = exc.message if isinstance(exc, ToolRefused) else str(exc)
                    raise ToolRefused(
                        f"{req.summary()} was redirected to "
                        f"{bounded_repr(scrub(target), 200)[1:-1]}, which is refused: "
                        f"{scrub(reason)}",
                        hint=exc.hint
                        if isinstance(exc, ToolRefused)
                        else "call the service's final address, over http or https",
                    ) from None
                if origin_of(target) != first_origin:
                    # A secret goes to its own origin only, as browsers drop credentials.
                    headers, params = dict(req.headers), {}
                else:
                    params = {}  # the Location already carries its query
                url = target
                continue
            raw = _read_bounded(response, req, policy, deadline, scrub)
        finally:
            response.close()
        answer = _answer(response, raw, req, scrub)
        log.info(
            "tool call %s %s → %d, %d bytes, %.2f s",
            req.method,
            bounded_repr(scrub(str(response.url.copy_with(query=None))), 200),
            response.status_code,
            len(raw),
            time.monotonic() - started,
        )
        return answer
    raise AssertionError("the loop returns or raises")  # pragma: no cover


def _read_bounded(
    response: httpx.Response,
    req: ToolRequest,
    policy: ToolPolicy,
    deadline: float,
    scrub: Callable[[str], str],
) -> bytes:
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > policy.max_bytes:
        raise ToolCallFailed(
            f"{req.summary()} answered with {declared} bytes, over tools_max_bytes "
            f"({policy.max_bytes})",
            hint="ask the service for less (a narrower query, fewer fields), or raise "
            "BATOS_TOOLS_MAX_BYTES",
        )
    decoder = _decoder(response, req)
    chunks: list[bytes] = []
    total = 0

    def take(chunk: bytes) -> None:
        nonlocal total
        total += len(chunk)
        if total > policy.max_bytes:
            raise ToolCallFailed(
                f"{req.summary()} answered with over {policy.max_bytes} bytes "
                "(tools_max_bytes); the rest was not read",
                hint="ask the service for less, or raise BATOS_TOOLS_MAX_BYTES",
            )
        chunks.append(chunk)

    def inflate(decoder: Any, raw: bytes) -> None:
        # At most one byte past the room left comes out: that byte is already too many.
        take(decoder.decompress(raw, max(policy.max_bytes - total, 0) + 1))
        while decoder.unconsumed_tail:
            take(decoder.decompress(decoder.unconsumed_tail, policy.max_bytes - total + 1))

    head = b""
    try:
        for raw in response.iter_raw():
            if time.monotonic() > deadline:
                raise ToolCallFailed(
                    f"{req.summary()} did not finish sending within {policy.timeout:g} s "
                    "(tools_timeout)",
                    hint="raise BATOS_TOOLS_TIMEOUT if the service is slow by nature",
                )
            if decoder is None:
                take(raw)
                continue
            if decoder is _DEFLATE_UNSEEN:  # zlib-wrapped, or raw as some servers send it
                head += raw
                if len(head) < 2:  # its first two bytes tell which, however they arrive
                    continue
                decoder, raw = _deflate_decoder(head), head
            inflate(decoder, raw)
        if decoder is _DEFLATE_UNSEEN and head:
            decoder = _deflate_decoder(head)
            inflate(decoder, head)
        if decoder is not None:
            take(decoder.flush())
    except httpx.HTTPError as exc:
        raise _translated(exc, req, policy.timeout, scrub) from exc
    except zlib.error as exc:
        raise ToolCallFailed(
            f"{req.summary()} answered with a compressed body that does not decompress ({exc})",
            hint="try again; if it keeps failing, the service is sending a broken answer",
        ) from None
    return b"".join(chunks)


def _decoder(response: httpx.Response, req: ToolRequest) -> Any:
    """A zlib decompressor for the answer's ``Content-Encoding`` (None: unencoded).

    The client asks for none; a service that sends gzip or deflate anyway is decoded here,
    a bounded piece at a time. Anything else (brotli, zstd, encodings stacked) is refused
    unread: their decoders in httpx have no bound on what one chunk becomes."""
    encoding = response.headers.get("content-encoding", "").strip().lower()
    if encoding in ("", "identity"):
        return None
    if encoding in ("gzip", "x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if encoding == "deflate":
        return _DEFLATE_UNSEEN
    raise ToolCallFailed(
        f"{req.summary()} answered in an encoding it was not asked for "
        f"(Content-Encoding {bounded_repr(encoding, 60)}); nothing of it was read",
        hint="the service should answer unencoded (or in gzip)",
    )


class _DeflateUnseen:
    """A deflate answer whose first bytes are not read yet: they tell its form (an empty
    body never does, and flushes to nothing)."""

    def flush(self) -> bytes:
        return b""


_DEFLATE_UNSEEN = _DeflateUnseen()


def _deflate_decoder(first: bytes) -> Any:
    """'deflate' is zlib's wrapped format by the RFC, and raw deflate from some servers (as
    browsers and httpx accept): the wrapped one starts with a header whose 16 bits are a
    multiple of 31."""
    wrapped = len(first) >= 2 and first[0] & 0x0F == 8 and (first[0] << 8 | first[1]) % 31 == 0
    return zlib.decompressobj() if wrapped else zlib.decompressobj(-zlib.MAX_WBITS)


def _answer(
    response: httpx.Response, raw: bytes, req: ToolRequest, scrub: Callable[[str], str]
) -> dict[str, Any]:
    """The answer as plain data, every secret written as its name before anything is cut
    (a cut first would leave the prefix of a secret that a service echoed after padding)."""
    headers = {}
    for name, value in list(response.headers.items())[:MAX_HEADERS]:
        headers[scrub(name.lower())] = scrub(value)[:MAX_HEADER_CHARS]
    answer: dict[str, Any] = {
        "status": response.status_code,
        "url": scrub(str(response.url)),
        "headers": headers,
    }
    try:
        text = raw.decode(response.encoding or "utf-8", errors="replace")
    except (LookupError, UnicodeError):  # a charset that is no text encoding ("rot13", "idna")
        text = raw.decode("utf-8", errors="replace")
    if req.expect == "text":
        answer["text"] = scrub(text)
        return answer
    try:
        # Parsed before it is scrubbed (a secret of digits inside a number would break the
        # JSON), then every text in it scrubbed (_cleaned); the error paths scrub the text.
        data = strict_json(text, max_int_digits=None) if text.strip() else None
    except (ValueError, RecursionError) as exc:
        text = scrub(text)
        if not response.is_success:  # an error page: its status says what went wrong
            answer["json"], answer["text"] = None, text[:MAX_HEADER_CHARS]
            return answer
        reason = exc if isinstance(exc, ValueError) else "nested too deeply"
        raise ToolCallFailed(
            f"{req.summary()} answered {response.status_code} with a body that is not JSON "
            f"({reason}); it begins {bounded_repr(text[:QUOTED_BODY_CHARS], 120)}",
            hint="check the tool's URL ('batos tools show'); if the service answers in text, "
            "the method should build request(..., expect='text')",
        ) from None
    answer["json"] = _cleaned(data, req, scrub)
    return answer


_SECRET_NAME = re.compile(r"env:\w+")


def _cleaned(data: Any, req: ToolRequest, scrub: Callable[[str], str]) -> Any:
    """``data`` with its texts scrubbed again once parsed: JSON may spell a secret with
    escapes (``\\u0073…``, ``\\/``) that the raw text did not show."""

    def clean(value: Any) -> Any:
        if isinstance(value, str):
            return scrub(value)
        if isinstance(value, int) and not isinstance(value, bool):
            # A secret of digits echoed as a number is the secret (its name goes on instead);
            # a number that merely holds its digits among others is data, left as it is.
            named = scrub(str(value))
            return named if _SECRET_NAME.fullmatch(named) else value
        if isinstance(value, dict):
            return {clean(k): clean(v) for k, v in value.items()}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    try:
        return clean(data)
    except RecursionError:  # fail closed: an answer too deep to clean is not handed on
        raise ToolCallFailed(
            f"{req.summary()} answered with JSON nested too deeply to read",
            hint="ask the service for less, or a flatter form",
        ) from None
