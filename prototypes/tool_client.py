"""The one HTTP client tool proxies use: a checked request sent with httpx, its answer read
within bounds and handed back as plain data.

Only ``prototypes.tools.perform`` calls ``send``, after the request passed the policy. Here:
redirects are followed by hand, each hop checked against ``tools_allow`` again (and a secret
is sent to its own origin only); the whole call, redirects and body included, has one deadline
(``tools_timeout``); the body is read in chunks and refused past ``tools_max_bytes`` *as it
is decoded* (a gzip bomb stops at the limit); the environment's proxies and ``.netrc`` are
ignored (``trust_env=False``), so no credential of the host's leaks into a call; and every
secret value the request carried is written as its name (``env:NAME``) wherever the answer
holds it (the final URL, an echo), since the answer goes on to generated code and prompts.

Exceptions are translated at this boundary, in one table (``_FAILURES``)::

    httpx.TimeoutException   → ToolCallFailed  (raise BATOS_TOOLS_TIMEOUT, or try later)
    httpx.ConnectError       → ToolCallFailed  (is the service up? is the URL right?)
    httpx.HTTPError (other)  → ToolCallFailed
    redirect off the policy  → ToolRefused
    body over the limit, not JSON when JSON was expected → ToolCallFailed
"""

from __future__ import annotations

import atexit
import json
import logging
import re
import threading
import time
from typing import Any, cast
from urllib.parse import quote, quote_plus

import httpx

from batos.errors import ToolCallFailed, ToolRefused
from prototypes.bounded import bounded_repr
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


def _shared_client() -> httpx.Client:
    global _client
    with _client_lock:
        if _client is None:
            _client = httpx.Client(
                follow_redirects=False,
                trust_env=False,
                headers={"User-Agent": "batos-tools/1"},
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


def _translated(exc: httpx.HTTPError, req: ToolRequest, timeout: float) -> ToolCallFailed:
    for kind, text, hint in _FAILURES:
        if isinstance(exc, kind):
            said = text.format(timeout=timeout, error=bounded_repr(str(exc), 200)[1:-1])
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


def send(req: ToolRequest, policy: ToolPolicy) -> dict[str, Any]:
    """Send ``req`` (already checked against ``policy``); ``{"status", "url", "headers",
    "json" | "text"}``. ``ToolCallFailed`` / ``ToolRefused`` say what went wrong."""
    started = time.monotonic()
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
        outgoing = client.build_request(
            method,
            url,
            params=params or None,
            headers=headers,
            json=body,
            timeout=httpx.Timeout(remaining),
        )
        try:
            response = client.send(outgoing, stream=True)
        except httpx.HTTPError as exc:
            raise _translated(exc, req, policy.timeout) from exc
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
                        f"{req.summary()} was redirected to {bounded_repr(target, 200)[1:-1]}, "
                        f"which is refused: {reason}",
                        hint=exc.hint if isinstance(exc, ToolRefused) else None,
                    ) from None
                if origin_of(target) != first_origin:
                    # A secret goes to its own origin only, as browsers drop credentials.
                    headers, params = dict(req.headers), {}
                else:
                    params = {}  # the Location already carries its query
                url = target
                continue
            raw = _read_bounded(response, req, policy, deadline)
        finally:
            response.close()
        answer = _without_secrets(_answer(response, raw, req), req)
        log.info(
            "tool call %s %s → %d, %d bytes, %.2f s",
            req.method,
            bounded_repr(str(response.url.copy_with(query=None)), 200),
            response.status_code,
            len(raw),
            time.monotonic() - started,
        )
        return answer
    raise AssertionError("the loop returns or raises")  # pragma: no cover


def _read_bounded(
    response: httpx.Response, req: ToolRequest, policy: ToolPolicy, deadline: float
) -> bytes:
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > policy.max_bytes:
        raise ToolCallFailed(
            f"{req.summary()} answered with {declared} bytes, over tools_max_bytes "
            f"({policy.max_bytes})",
            hint="ask the service for less (a narrower query, fewer fields), or raise "
            "BATOS_TOOLS_MAX_BYTES",
        )
    chunks, total = [], 0
    try:
        for chunk in response.iter_bytes():
            total += len(chunk)
            if total > policy.max_bytes:
                raise ToolCallFailed(
                    f"{req.summary()} answered with over {policy.max_bytes} bytes "
                    "(tools_max_bytes); the rest was not read",
                    hint="ask the service for less, or raise BATOS_TOOLS_MAX_BYTES",
                )
            if time.monotonic() > deadline:
                raise ToolCallFailed(
                    f"{req.summary()} did not finish sending within {policy.timeout:g} s "
                    "(tools_timeout)",
                    hint="raise BATOS_TOOLS_TIMEOUT if the service is slow by nature",
                )
            chunks.append(chunk)
    except httpx.HTTPError as exc:
        raise _translated(exc, req, policy.timeout) from exc
    return b"".join(chunks)


def _without_secrets(answer: dict[str, Any], req: ToolRequest) -> dict[str, Any]:
    """``answer`` with every secret value the request carried written as its name
    (``env:NAME``): the final URL holds a secret parameter, and a service may echo one back,
    while the answer goes on to generated code (a reading phase) and into prompts."""
    marks: dict[str, str] = {}
    for name in req.secrets():
        value = secret_value(name)
        for form in {value, quote(value, safe=""), quote_plus(value, safe="")}:
            marks[form] = f"env:{name}"
    if not marks:
        return answer
    pattern = re.compile("|".join(re.escape(f) for f in sorted(marks, key=len, reverse=True)))

    def clean(value: Any) -> Any:
        if isinstance(value, str):
            return pattern.sub(lambda m: marks[m.group(0)], value)
        if isinstance(value, dict):
            return {clean(k): clean(v) for k, v in value.items()}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    try:
        return cast(dict[str, Any], clean(answer))
    except RecursionError:  # fail closed: an answer too deep to clean is not handed on
        raise ToolCallFailed(
            f"{req.summary()} answered with JSON nested too deeply to read",
            hint="ask the service for less, or a flatter form",
        ) from None


def _answer(response: httpx.Response, raw: bytes, req: ToolRequest) -> dict[str, Any]:
    headers = {}
    for name, value in list(response.headers.items())[:MAX_HEADERS]:
        headers[name.lower()] = value[:MAX_HEADER_CHARS]
    answer: dict[str, Any] = {
        "status": response.status_code,
        "url": str(response.url),
        "headers": headers,
    }
    text = raw.decode(response.encoding or "utf-8", errors="replace")
    if req.expect == "text":
        answer["text"] = text
        return answer
    try:
        answer["json"] = json.loads(text) if text.strip() else None
    except (ValueError, RecursionError) as exc:
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
    return answer
