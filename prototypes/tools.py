"""Tool proxies: objects of the image whose methods ask an outside service, within a policy.

A tool proxy is a prototype under the image's ``tools`` object (``tools.weather``), made the
first time a message names it. Its methods are written by doesNotUnderstand like any other,
through the same gate (guardian, sandbox compiler, isolated trial, install), with one
difference: the code never reaches the network. It builds a *request description* with the
``request(...)`` capability the sandbox gives it — plain data: method, URL, parameters,
headers, secret headers *by name*, a JSON body — and returns it. The method's compiler
(``tool``) reads that description again as hostile data in the host, checks it against the
policy (``tools_allow``, ``tools_secrets``), reads each named secret from the environment at
that moment (a secret's value is never in the image, nor in the generated code), and hands it
to the one audited client (``prototypes.tool_client``), which answers with bounded data:
``{"status", "url", "headers", "json" | "text"}``. A method that takes ``response=None``
reads that answer in a second sandboxed call (``read_answer``) and its caller gets the value
it returns, held to bounded JSON data; ``request`` refuses in that phase.

Nothing here guards the network from the host's own code: the policy binds what *generated*
code asks for. A tool method called from inside the sandbox (by another generated method)
is refused: calls happen in the host, one level deep.
"""

from __future__ import annotations

import ast
import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard, cast
from urllib.parse import urlsplit

from persistent.mapping import PersistentMapping

from batos import settings
from batos.errors import (
    AuditRejected,
    GeneratedCodeError,
    SandboxViolation,
    SlotError,
    ToolCallFailed,
    ToolError,
    ToolRefused,
)
from prototypes import isolation, sandbox
from prototypes.bounded import bounded_repr
from prototypes.uvm import Method, UvmObject, register_compiler
from store.core import layout
from store.core.layout import UpgradeStep
from store.core.text import SURROGATE

#: The compiler name of a tool proxy's methods (``Method.compiler``).
TOOL_COMPILER = "tool"
#: The key a request description carries, so a stray dict is not taken for one.
REQUEST_KEY = "tool_request"
#: The methods a request may name (the policy narrows them per host).
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"})
#: Bounds of a request description (it comes from generated code: hostile).
MAX_URL_CHARS = 2_048
MAX_FIELDS = 32
MAX_FIELD_CHARS = 1_024
MAX_BODY_CHARS = 64_000
MAX_BODY_NODES = 2_000
#: Headers a request may not set by value: credentials go by secret name; framing, encodings
#: and hop-by-hop headers are the client's; and the headers by which services and proxies take
#: a request for another method or host, which would get around the policy's methods (a GET
#: that a service performs as a DELETE, and sends in a draft's trial as a GET).
FORBIDDEN_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "proxy-connection",
        "cookie",
        "host",
        "content-length",
        "content-encoding",
        "transfer-encoding",
        "accept-encoding",
        "te",
        "trailer",
        "upgrade",
        "expect",
        "keep-alive",
        "connection",
        "x-http-method-override",
        "x-http-method",
        "x-method-override",
        "forwarded",
    }
)
#: Fields a web framework reads as the request's real method.
_OVERRIDE_FIELDS = frozenset({"_method", "x-http-method-override"})
#: Prefixes of forbidden header names (``x-forwarded-host``, ``proxy-…``).
FORBIDDEN_HEADER_PREFIXES = ("x-forwarded-", "proxy-")
_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$")
#: A secret reference: ``env:NAME``, optionally after a scheme word (``Bearer env:NAME``).
_SECRET_REF = re.compile(r"^(?:(Bearer|Token|Basic) )?env:([A-Z_][A-Z0-9_]{0,63})$")
_EXPECT = ("json", "text")


# -- the capability: what generated code may call ----------------------------------------------


def request(
    method: str,
    url: str,
    params: Any = None,
    json: Any = None,
    headers: Any = None,
    secret_headers: Any = None,
    secret_params: Any = None,
    expect: str = "json",
) -> dict[str, Any]:
    """A request description (plain data). It sends nothing: the host does, after checking it.

    ``secret_headers`` / ``secret_params`` map a header or parameter to a secret's *name*,
    ``"env:NAME"`` (or ``"Bearer env:NAME"``); ``expect`` is ``"json"`` or ``"text"``.
    """
    return {
        REQUEST_KEY: 1,
        "method": method,
        "url": url,
        "params": params or {},
        "json": json,
        "headers": headers or {},
        "secret_headers": secret_headers or {},
        "secret_params": secret_params or {},
        "expect": expect,
    }


#: What the sandbox adds to a tool method's globals.
CAPABILITIES: dict[str, Any] = {"request": request}


# -- reading a description back, as hostile data -----------------------------------------------


@dataclass(frozen=True)
class ToolRequest:
    """A request description that passed every check of its shape (not yet the policy's)."""

    method: str
    url: str
    params: tuple[tuple[str, str], ...] = ()
    headers: tuple[tuple[str, str], ...] = ()
    secret_headers: tuple[tuple[str, str], ...] = ()
    secret_params: tuple[tuple[str, str], ...] = ()
    body: Any = None
    expect: str = "json"

    @property
    def origin(self) -> tuple[str, str, int]:
        return origin_of(self.url)

    def secrets(self) -> list[str]:
        """The environment variables this request names."""
        refs = [*self.secret_headers, *self.secret_params]
        return [_secret_name(ref) for _, ref in refs]

    def summary(self) -> str:
        return f"{self.method} {bounded_repr(self.url, 200)[1:-1]}"


def origin_of(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of an http(s) URL; ``ValueError`` when it has none."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{bounded_repr(url, 120)} is not an http:// or https:// URL")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.scheme, parts.hostname.lower(), port


def _secret_name(ref: str) -> str:
    match = _SECRET_REF.match(ref)
    assert match is not None, "checked by read_request"
    return match.group(2)


def _text_field(value: Any, what: str) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"{what} must be text or a number, not a {type(value).__name__}")
    text = value if isinstance(value, str) else json.dumps(value)
    if len(text) > MAX_FIELD_CHARS:
        raise ValueError(f"{what} is over {MAX_FIELD_CHARS} characters")
    if any(c in text for c in "\r\n\0"):
        raise ValueError(f"{what} holds a line break or NUL")
    if SURROGATE.search(text):
        raise ValueError(f"{what} holds a lone surrogate, which no request can encode")
    return text


#: What a header's value may hold: visible ASCII, spaces and tabs (RFC 9110's field-value;
#: httpx encodes values as ASCII).
_HEADER_VALUE = re.compile(r"[\t\x20-\x7e]*")
#: What a URL may not hold: controls (C0, DEL, C1), spaces and line breaks.
_URL_FORBIDDEN = re.compile("[\x00-\x20\x7f-\x9f]")


def _header_value(name: str, value: str) -> None:
    if not _HEADER_VALUE.fullmatch(value):
        raise ValueError(
            f"the value of header {bounded_repr(name, 60)} may hold only printable ASCII "
            "(percent-encode other characters, or send them in params or the body)"
        )


def _pairs(value: Any, what: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{what} must be a dict, not a {type(value).__name__}")
    if len(value) > MAX_FIELDS:
        raise ValueError(f"{what} has over {MAX_FIELDS} entries")
    return tuple(
        (_text_field(k, f"a key of {what}"), _text_field(v, f"{what}[{bounded_repr(k, 40)}]"))
        for k, v in list(value.items())
    )


def plain_data(value: Any, what: str, max_nodes: int, max_chars: int) -> Any:
    """``value`` as JSON data (None, bools, numbers, text, lists, text-keyed dicts) of at most
    ``max_nodes`` values and ``max_chars`` characters of JSON; ``ValueError`` naming ``what``.
    Tuples become lists; nothing else is taken (a set, an object, a NaN)."""
    budget = [max_nodes]

    def plain(v: Any, depth: int) -> Any:
        budget[0] -= 1
        if budget[0] < 0 or depth > 20:
            raise ValueError(f"{what} has over {max_nodes} values or 20 levels")
        if isinstance(v, str) and SURROGATE.search(v):
            raise ValueError(f"{what} holds a lone surrogate, which no request can encode")
        if v is None or isinstance(v, bool | str | int):
            return v
        if isinstance(v, float) and math.isfinite(v):
            return v
        if isinstance(v, Mapping):
            if len(v) > budget[0] or not all(isinstance(k, str) for k in v):
                raise ValueError(f"{what}'s objects need text keys and few entries")
            if any(SURROGATE.search(k) for k in v):
                raise ValueError(f"{what} holds a lone surrogate, which no request can encode")
            return {k: plain(x, depth + 1) for k, x in list(v.items())}
        if isinstance(v, list | tuple):
            if len(v) > budget[0]:
                raise ValueError(f"{what} has over {max_nodes} values")
            return [plain(x, depth + 1) for x in list(v)]
        raise ValueError(f"{what} holds a {type(v).__name__}, which is not JSON")

    data = plain(value, 0)
    if len(json.dumps(data)) > max_chars:
        raise ValueError(f"{what} is over {max_chars} characters")
    return data


def _body(value: Any) -> Any:
    return plain_data(value, "the JSON body", MAX_BODY_NODES, MAX_BODY_CHARS)


def read_request(value: Any) -> ToolRequest:
    """A method's result as a ``ToolRequest``; ``ValueError`` saying what is wrong with it."""
    if not isinstance(value, Mapping) or value.get(REQUEST_KEY) != 1:
        raise ValueError(
            f"a tool method must return request(...), not {bounded_repr(value, 120)}: "
            "build the request with request(method, url, params=..., ...) and return it"
        )
    method = value.get("method")
    if not isinstance(method, str) or method.upper() not in METHODS:
        raise ValueError(f"the method must be one of {', '.join(sorted(METHODS))}")
    url = value.get("url")
    if not isinstance(url, str) or len(url) > MAX_URL_CHARS:
        raise ValueError(f"the url must be text of at most {MAX_URL_CHARS} characters")
    parts = urlsplit(url)
    origin_of(url)
    if parts.username or parts.password:
        raise ValueError("the url may not hold a user or password: name a secret instead")
    if parts.fragment or _URL_FORBIDDEN.search(url) or SURROGATE.search(url):
        raise ValueError(
            "the url may not hold a fragment, spaces, tabs, line breaks or other control "
            "characters (percent-encode them, or pass values in params)"
        )
    headers = _pairs(value.get("headers") or {}, "headers")
    for name, header_value in headers:
        if not _HEADER_NAME.match(name):
            raise ValueError(f"{bounded_repr(name, 60)} is not a header name")
        lowered = name.lower()
        if lowered in FORBIDDEN_HEADERS or lowered.startswith(FORBIDDEN_HEADER_PREFIXES):
            raise ValueError(
                f"header {name!r} may not be set by value: credentials go in secret_headers "
                "as 'env:NAME'; the method, host, encodings and framing are the client's"
            )
        _header_value(name, header_value)
    secret_headers = _pairs(value.get("secret_headers") or {}, "secret_headers")
    secret_params = _pairs(value.get("secret_params") or {}, "secret_params")
    for name, ref in (*secret_headers, *secret_params):
        if not _SECRET_REF.match(ref):
            raise ValueError(
                f"the secret for {bounded_repr(name, 60)} must be 'env:NAME' (NAME in "
                f"capitals), not {bounded_repr(ref, 60)}"
            )
    for name, _ in secret_headers:
        if not _HEADER_NAME.match(name):
            raise ValueError(f"{bounded_repr(name, 60)} is not a header name")
        lowered = name.lower()
        if lowered in FORBIDDEN_HEADERS - {"authorization", "proxy-authorization", "cookie"} or (
            lowered.startswith(FORBIDDEN_HEADER_PREFIXES) and lowered != "proxy-authorization"
        ):
            raise ValueError(f"header {name!r} is the client's, and carries no secret")
    expect = value.get("expect", "json")
    if expect not in _EXPECT:
        raise ValueError("expect must be 'json' or 'text'")
    params = _pairs(value.get("params") or {}, "params")
    body = _body(value.get("json"))
    named = [k for k, _ in (*params, *secret_params)]
    named += list(body) if isinstance(body, dict) else []
    if any(k.lower() in _OVERRIDE_FIELDS for k in named):
        # Rails, Laravel and Symfony take a POST with a "_method" field as that method: a
        # DELETE the policy never allowed.
        raise ValueError(
            "a request may not carry a method-override field ('_method'): use the method itself"
        )
    return ToolRequest(
        method=method.upper(),
        url=url,
        params=params,
        headers=headers,
        secret_headers=secret_headers,
        secret_params=secret_params,
        body=body,
        expect=expect,
    )


# -- the policy --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolPolicy:
    """What tool proxies may ask for: the settings ``tools_*``, read when a call is made."""

    #: (scheme, host, port) → the methods allowed there.
    allow: Mapping[tuple[str, str, int], frozenset[str]]
    #: secret name → the (host, port) it may be sent to.
    secrets: Mapping[str, tuple[str, int | None]]
    timeout: float
    max_bytes: int

    @classmethod
    def from_settings(cls) -> ToolPolicy:
        allow: dict[tuple[str, str, int], frozenset[str]] = {}
        for entry in filter(None, settings.get_str("tools_allow").split(",")):
            scheme, rest = entry.split("://", 1)
            where, methods = rest.split("/", 1)
            host, _, port = where.partition(":")
            key = (scheme, host, int(port) if port else (443 if scheme == "https" else 80))
            allow[key] = allow.get(key, frozenset()) | frozenset(methods.split("+"))
        secrets: dict[str, tuple[str, int | None]] = {}
        for entry in filter(None, settings.get_str("tools_secrets").split(",")):
            name, where = entry.split("@", 1)
            host, _, port = where.partition(":")
            secrets[name] = (host, int(port) if port else None)
        return cls(
            allow,
            secrets,
            settings.get_float("tools_timeout"),
            settings.get_int("tools_max_bytes"),
        )

    def described(self) -> str:
        """The allowed origins and methods, as the prompt and the hints show them."""
        shown = [
            f"{'+'.join(sorted(m))} {scheme}://{host}:{port}"
            for (scheme, host, port), m in sorted(self.allow.items())
        ]
        return "; ".join(shown) or "none (BATOS_TOOLS_ALLOW is empty)"

    def check(self, method: str, url: str) -> None:
        """``ToolRefused`` unless ``method`` may be sent to ``url``'s origin."""
        scheme, host, port = origin_of(url)
        allowed = self.allow.get((scheme, host, port))
        entry = host if (scheme, port) == ("https", 443) else f"{scheme}://{host}:{port}"
        if allowed is None:
            if _ALLOWABLE.fullmatch(host):
                shown = host
                hint = (
                    f"add it with BATOS_TOOLS_ALLOW='{_joined(entry)}' ('batos config' shows "
                    "the value in force)"
                )
            else:
                shown = bounded_repr(host, 80)
                hint = (
                    "no allow-list entry can name it, as it is no host name or address: the "
                    "method, or the service's redirect, named it"
                )
            raise ToolRefused(
                f"host {shown} ({scheme}, port {port}) is not in tools_allow; nothing was sent",
                hint=hint,
            )
        if method not in allowed:
            raise ToolRefused(
                f"{method} is not allowed to {host} by tools_allow (allowed: "
                f"{', '.join(sorted(allowed))}); nothing was sent",
                hint=f"allow it with BATOS_TOOLS_ALLOW='{_joined(entry + '/' + method)}'",
            )

    def check_secret(self, name: str, url: str) -> None:
        scheme, host, port = origin_of(url)
        where = self.secrets.get(name)
        entry = host if (scheme, port) == ("https", 443) else f"{host}:{port}"
        if where is None:
            raise ToolRefused(
                f"secret {name} is not in tools_secrets; nothing was sent",
                hint=f"let it go to {host} with BATOS_TOOLS_SECRETS='{name}@{entry}' and "
                f"set {name} in the environment",
            )
        if where[0] != host or (where[1] is not None and where[1] != port):
            raise ToolRefused(
                f"secret {name} may only be sent to {where[0]}, not to {host}; nothing was sent",
                hint="tools_secrets names the one host each secret may go to",
            )
        if where[1] is None and (scheme, port) != ("https", 443):
            # A host named alone means https, as in tools_allow: a secret listed so never
            # travels in clear text, nor to another service on the same machine.
            raise ToolRefused(
                f"secret {name} may only be sent to {host} over https (port 443), not to "
                f"{scheme}://{host}:{port}; nothing was sent",
                hint=f"to send it there, name the port: BATOS_TOOLS_SECRETS='{name}@{entry}'",
            )

    def check_request(self, req: ToolRequest) -> None:
        """Every check of the policy for ``req``: origin, method, each secret's host."""
        self.check(req.method, req.url)
        for name in req.secrets():
            self.check_secret(name, req.url)


#: What tools_allow can name (``batos.settings``'s check of its entries, less the port).
_ALLOWABLE = re.compile(r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?")


def _joined(entry: str) -> str:
    """The allow-list in force, as a user writes it, with ``entry`` added."""
    current = [e for e in settings.get_str("tools_allow").split(",") if e]
    shown = []
    for normal in current:  # scheme://host/METHODS, written back in its shortest form
        where, _, methods = normal.rpartition("/")
        where = where.removeprefix("https://")
        shown.append(where if methods == "GET" else f"{where}/{methods}")
    return ",".join([*shown, entry])


def secret_value(name: str) -> str:
    """A secret's value, read from the environment now; ``ToolRefused`` if it is not set."""
    value = os.environ.get(name)
    if not value:
        raise ToolRefused(
            f"secret {name} is not set in the environment; nothing was sent",
            hint=f"export {name}=... in the environment of the process that calls the tool",
        )
    if not _SECRET_VALUE.fullmatch(value):
        # Said without the value: a line break or a control character would otherwise come
        # back in the HTTP library's error, and from there reach prompts and logs.
        raise ToolRefused(
            f"secret {name} holds a character a request cannot carry (a line break, a control "
            "character or non-ASCII text); nothing was sent",
            hint=f"set {name} again without it (a trailing newline read from a file is the "
            f"usual cause: export {name}=\"$(tr -d '\\n' < FILE)\")",
        )
    return value


#: What a secret's value may hold: visible ASCII and spaces, as a header or a query carries it.
_SECRET_VALUE = re.compile(r"[\x20-\x7e]{1,4096}")


def request_findings(result: Any) -> list[str]:
    """What is wrong with the shape of a draft's request, in words its author can act on."""
    try:
        read_request(result)
    except ValueError as exc:
        return [str(exc)]
    return []


def policy_findings(result: Any) -> list[str]:
    """Why the policy refuses a well-formed request ([]: it allows it), with what it allows.

    A refusal is the host's rule, not a judgement of the draft's reading of the intent: the
    mission records it apart (stage ``policy``) and the trust gate does not count it."""
    policy = ToolPolicy.from_settings()
    try:
        policy.check_request(read_request(result))
    except ToolRefused as exc:
        return [f"{exc.message} (the allowed services are: {policy.described()})"]
    return []


# -- the proxies in the image ------------------------------------------------------------------

#: Name of the toolbox among the image's top-level objects.
TOOLBOX = "tools"
#: Private markers: the ``tools`` object, and the prototype every proxy inherits from.
_TOOLBOX_MARK = "_toolbox"
_PROTOTYPE_MARK = "_tool_prototype"
_PROTOTYPE_SLOT = "_prototype"


def make_toolbox() -> UvmObject:
    """A new ``tools`` object: proxies become its slots, all children of one prototype."""
    prototype = UvmObject(
        name="tool",
        about="A proxy for an outside service; its methods return request(...) descriptions "
        "that the host sends within tools_allow.",
    )
    setattr(prototype, _PROTOTYPE_MARK, True)
    toolbox = UvmObject(
        name="tools",
        about="Tool proxies: send tools.NAME.method(...) and a proxy and its method are "
        "written on first use. Declare what a proxy is for in intents (NAME → text).",
        intents=PersistentMapping(),
    )
    setattr(toolbox, _TOOLBOX_MARK, True)
    setattr(toolbox, _PROTOTYPE_SLOT, prototype)
    return toolbox


def _add_toolbox(root: Any) -> None:
    objects = layout.objects(root)
    if TOOLBOX not in objects:
        objects[TOOLBOX] = make_toolbox()


#: The object model's step: the toolbox among the image's objects.
TOOLS_STEP = UpgradeStep(
    "tools-1",
    "the 'tools' object whose slots are tool proxies (prototypes.tools)",
    _add_toolbox,
)


def _marked(obj: UvmObject, mark: str) -> bool:
    obj._p_activate()
    return obj.__dict__.get(mark) is True


def is_toolbox(obj: Any) -> bool:
    return isinstance(obj, UvmObject) and _marked(obj, _TOOLBOX_MARK)


def is_tool(obj: Any) -> TypeGuard[UvmObject]:
    """Whether ``obj`` is a tool proxy (a descendant of the toolbox's prototype)."""
    if not isinstance(obj, UvmObject):
        return False
    return any(_marked(a, _PROTOTYPE_MARK) for a in obj._ancestors())


def proxies(toolbox: UvmObject) -> dict[str, UvmObject]:
    """The toolbox's proxies by name."""
    return {k: v for k, v in sorted(toolbox._slots().items()) if is_tool(v)}


def open_proxy(toolbox: UvmObject, name: str) -> UvmObject:
    """The proxy ``name``, made now if the toolbox has none (in the caller's transaction):
    its ``about`` is the toolbox's declared intent for the name, if any."""
    existing = toolbox._slots().get(name)
    if is_tool(existing):
        return existing
    if existing is not None:
        raise SlotError(f"tools.{name} is not a tool proxy", hint="choose another name")
    intents = toolbox._slots().get("intents") or {}
    about = intents.get(name, "") if isinstance(intents, Mapping) else ""
    proxy = UvmObject(
        toolbox.__dict__[_PROTOTYPE_SLOT],
        name=name,
        about=str(about) or f"the outside service called {name!r}",
        intents=PersistentMapping(),
    )
    setattr(toolbox, name, proxy)
    return proxy


# -- the compiler: a sandboxed method whose request the host sends -----------------------------

#: The keyword through which a tool method reads the service's answer, in a second phase:
#: ``def today(self, city, response=None)``. Called with None it builds the request; called
#: again with the answer (plain data) it returns the value the caller gets.
RESPONSE_PARAM = "response"
#: Bounds of the value a reading phase returns: it is the caller's answer, and may be put in a
#: prompt (a facet's), so it is held to JSON data of this size.
MAX_READ_NODES = 2_000
MAX_READ_CHARS = 16_000
#: Characters of a reading phase's exception quoted in the error.
MAX_READ_ERROR_CHARS = 300


@dataclass(frozen=True)
class Reading:
    """A tool method's second phase: it takes ``response``; ``max_args``: how many positional
    arguments a caller may pass (those before ``response``; None: no limit)."""

    max_args: int | None


def reading_of(selector: str, source: str) -> Reading | None:
    """Whether the method ``selector`` in ``source`` reads the answer (None: it does not).

    ``AuditRejected`` when it names ``response`` without the default None: the first call,
    which builds the request, passes none."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None  # the sandbox's compiler says what is wrong with it
    defined = [
        node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == selector
    ]
    if not defined:
        return None
    arguments = defined[-1].args
    positional = [*arguments.posonlyargs, *arguments.args]
    names = [a.arg for a in positional]
    if RESPONSE_PARAM in names:
        index = names.index(RESPONSE_PARAM)
        at = index - (len(positional) - len(arguments.defaults))
        default = arguments.defaults[at] if at >= 0 else None
        reading = Reading(max_args=max(index - 1, 0))
    elif RESPONSE_PARAM in [a.arg for a in arguments.kwonlyargs]:
        index = [a.arg for a in arguments.kwonlyargs].index(RESPONSE_PARAM)
        default = arguments.kw_defaults[index]
        unlimited = arguments.vararg is not None
        reading = Reading(max_args=None if unlimited else max(len(positional) - 1, 0))
    else:
        return None
    if not (isinstance(default, ast.Constant) and default.value is None):
        raise AuditRejected(
            f"tool method {selector!r} takes {RESPONSE_PARAM!r} without the default None",
            [
                f"{RESPONSE_PARAM!r} needs the default None: write it as a last parameter "
                f"'{RESPONSE_PARAM}=None'; the host calls the method first with none (return "
                "request(...)), then with the answer"
            ],
        )
    return reading


def _request_while_reading(*args: Any, **kwargs: Any) -> Any:
    raise SandboxViolation(
        "a tool method cannot make a request while it reads an answer",
        [
            f"request(...) cannot be called once the {RESPONSE_PARAM} is given: it is for the "
            f"first call ({RESPONSE_PARAM} None); given the {RESPONSE_PARAM}, return the value "
            "the caller needs"
        ],
    )


#: What the sandbox gives a reading phase: the name ``request``, which refuses.
READING_CAPABILITIES: dict[str, Any] = {"request": _request_while_reading}


def compile_request_builder(selector: str, source: str) -> Any:
    """The sandboxed function of a tool method: it returns a request description.
    ``AuditRejected`` when its ``response`` parameter breaks the protocol."""
    reading_of(selector, source)
    return sandbox.compile_sandboxed(selector, source, capabilities=CAPABILITIES)


def compile_reader(selector: str, source: str) -> Any:
    """The sandboxed function of a tool method's reading phase (its ``request`` refuses)."""
    return sandbox.compile_sandboxed(selector, source, capabilities=READING_CAPABILITIES)


def compile_tool(selector: str, source: str) -> Any:
    """A tool method as a callable: run the sandboxed code for its request, send it, and when
    the method reads (``response=None``) run it again, sandboxed, on the answer."""
    build = compile_request_builder(selector, source)
    reading = reading_of(selector, source)
    reader = compile_reader(selector, source) if reading is not None else None

    def call(receiver: Any, *args: Any, **kwargs: Any) -> Any:
        if sandbox.in_sandbox() or isolation.inside_child():
            raise SandboxViolation(
                "a tool is called only by the host",
                [
                    f"{selector} is a tool method: generated code cannot call it; return what "
                    "you need and let the host send the request"
                ],
            )
        where = _where(receiver, selector)
        if reading is not None:
            _check_caller(where, reading, args, kwargs)
        answer = perform(build(receiver, *args, **kwargs), where)
        if reader is None:
            return answer
        return read_answer(reader, where, receiver, args, kwargs, answer)

    call.__name__ = call.__qualname__ = selector
    call.__wrapped__ = build  # type: ignore[attr-defined]
    call.reads = reading is not None  # type: ignore[attr-defined]
    return call


#: What a tool method whose first call failed is told: the two calls, and which does what.
FIRST_CALL_RULE = (
    "request(...) sends nothing and returns no answer: it only describes the request. To "
    "read the answer, take the last parameter response=None; the first call passes None, "
    "so begin with `if response is None: return request(...)` and read response only after"
)


#: What a written tool method without a reading phase is told.
READ_RULE = (
    "the method returns the request only, so the caller would get the service's whole "
    "answer: take the last parameter response=None, return request(...) when it is None, "
    "and return the value the caller asked for from response (response['json'] for the whole "
    "body)"
)


def _where(receiver: Any, selector: str) -> str:
    name = receiver._slots().get("name") if isinstance(receiver, UvmObject) else None
    shown = name if isinstance(name, str) and name.isidentifier() else "?"
    return f"tools.{shown[:64]}.{selector}"


def arguments_short(selector: str, source: str, args: tuple, kwargs: Mapping[str, Any]) -> str:
    """Why a reading method cannot take the call's arguments ('' when it can): with fewer
    parameters than the call has arguments, the last argument would land in ``response``."""
    reading = reading_of(selector, source)
    if reading is None or reading.max_args is None or len(args) <= reading.max_args:
        return ""
    return (
        f"it is called with {len(args)} argument(s), {bounded_repr(list(args), 120)}, but "
        f"takes {reading.max_args} before {RESPONSE_PARAM}: take one parameter for each "
        f"argument of the call, then {RESPONSE_PARAM}=None last"
    )


def _check_caller(where: str, reading: Reading, args: tuple, kwargs: Mapping[str, Any]) -> None:
    """The answer a method reads is the host's: a caller may not pass one of its own."""
    if RESPONSE_PARAM in kwargs or (reading.max_args is not None and len(args) > reading.max_args):
        raise ToolRefused(
            f"{where} reads the service's answer as {RESPONSE_PARAM!r}, which only the host "
            "passes; nothing was sent",
            hint=f"call it with at most {reading.max_args} argument(s), without {RESPONSE_PARAM}=",
        )


def read_answer(
    reader: Any,
    where: str,
    receiver: Any,
    args: tuple,
    kwargs: Mapping[str, Any],
    answer: dict[str, Any],
) -> Any:
    """The reading phase run in the sandbox on ``answer`` (plain data, made by the client for
    this call); what it returns, held to JSON data within ``MAX_READ_*``.

    Raises ``ToolCallFailed`` naming the method when the code raises or returns what is not
    bounded data, and ``SandboxViolation`` when the sandbox refused what it did."""
    status = answer.get("status")
    try:
        value = reader(receiver, *args, **kwargs, **{RESPONSE_PARAM: answer})
    except SandboxViolation as exc:
        raise type(exc)(
            f"{where} was stopped while it read the answer: {exc.reason}", exc.findings
        ) from None
    except GeneratedCodeError:
        raise
    except Exception as exc:
        said = sandbox.describe_exception(exc)
        if len(said) > MAX_READ_ERROR_CHARS:  # it may quote the answer, which may be long
            said = said[: MAX_READ_ERROR_CHARS - 1] + "…"
        raise ToolCallFailed(
            f"{where} could not read the service's answer (status {status}): {said}",
            hint=f"the answer is not what the method expects; 'batos tools show' prints its "
            f"source, and removing {where} has it written again",
        ) from None
    try:
        return plain_data(value, "what it read", MAX_READ_NODES, MAX_READ_CHARS)
    except ValueError as exc:
        raise ToolCallFailed(
            f"{where} read the answer (status {status}), but {exc}",
            hint="a tool method's reading phase returns only what the caller needs, as JSON "
            "data (text, numbers, lists, dicts)",
        ) from None


def _read_isolated(
    receiver: UvmObject,
    selector: str,
    source: str,
    args: tuple,
    kwargs: Mapping[str, Any],
    answer: Mapping[str, Any],
    *,
    forgiving: bool,
) -> Any:
    """A draft's reading phase run on ``answer`` in an isolated child; its outcome's value is
    ``[True, what it read]``, or with ``forgiving`` ``[False, None]`` when it raised an
    ordinary exception (a breach of the sandbox is never forgiven)."""
    reader = compile_reader(selector, source)

    def probe(obj: UvmObject, *call_args: Any, **call_kwargs: Any) -> Any:
        try:
            return [True, reader(obj, *call_args, **call_kwargs, **{RESPONSE_PARAM: answer})]
        except GeneratedCodeError:
            raise
        except Exception:
            if not forgiving:
                raise
            return [False, None]

    return sandbox.run_isolated(probe, receiver, *args, **kwargs)


def trial_reading(
    receiver: UvmObject,
    selector: str,
    source: str,
    args: tuple,
    kwargs: Mapping[str, Any],
    expect: str = "json",
) -> list[str]:
    """What is wrong with a draft's reading phase, tried (nothing sent) on an answer with the
    expected shape and no body ([]: nothing, or no reading phase).

    The body of the real answer is unknown here, so an ordinary exception on the empty one
    counts for nothing; what counts is what no answer excuses: a request made, a tool
    called, a limit passed, a value that is not bounded JSON data."""
    if reading_of(selector, source) is None:
        return []
    empty = {"status": 200, "url": "https://example.invalid/", "headers": {}}
    empty[expect if expect in _EXPECT else "json"] = None if expect == "json" else ""
    outcome = _read_isolated(receiver, selector, source, args, kwargs, empty, forgiving=True)
    if not outcome.ok:
        return [f"with {RESPONSE_PARAM} given: {f}" for f in outcome.findings]
    returned, value = outcome.value
    if returned:
        try:
            plain_data(value, "what it read", MAX_READ_NODES, MAX_READ_CHARS)
        except ValueError as exc:
            return [f"with {RESPONSE_PARAM} given, {exc}: return JSON data the caller needs"]
    return []


#: Request methods a draft's trial may send: the safe ones (RFC 9110, 9.2.1), which only
#: read. A draft that would change something at the service is sent only once installed.
TRIAL_METHODS = frozenset({"GET", "HEAD"})
#: Distinct requests one mission may send to try its drafts; past them, drafts are judged on
#: the requests they build alone, as when sending in trials is off.
MAX_TRIAL_SENDS = 6
#: Characters of the real answer shown to the author when a draft could not read it.
MAX_PREVIEW_CHARS = 600


def sent_in_trial(described: Any, sent: dict[str, Any]) -> dict[str, Any] | None:
    """The service's real answer to a draft's request, sent by the host during the draft's
    trial, so that its reading phase is tried on what it will read for real; None when the
    request is not sent (``tools_trial_send`` is off, the method is not a safe one, or the
    mission has sent ``MAX_TRIAL_SENDS`` already).

    ``sent`` is the mission's own record, request → answer (or the error it ended in): drafts
    that build the same request share one call. The request has passed ``read_request`` and
    the policy; ``ToolError`` when sending it failed."""
    from prototypes import tool_client

    if settings.get_str("tools_trial_send") == "off":
        return None
    req = read_request(described)
    if req.method not in TRIAL_METHODS:
        return None
    key = json.dumps(
        [
            req.method,
            req.url,
            sorted(req.params),
            sorted(req.headers),
            sorted(req.secret_headers),
            sorted(req.secret_params),
            req.expect,
        ]
    )
    if key not in sent:
        if len(sent) >= MAX_TRIAL_SENDS:
            return None
        policy = ToolPolicy.from_settings()
        try:
            policy.check_request(req)
            sent[key] = tool_client.send(req, policy)
        except ToolError as exc:
            sent[key] = exc
    answer = sent[key]
    if isinstance(answer, ToolError):
        raise answer
    return cast(dict[str, Any], answer)


def perturbed(args: tuple) -> tuple | None:
    """The call's arguments each changed a little and kept of their kind (a digit or letter
    moved on, a number plus one), to see whether a draft's request depends on them; None when
    none of them can be changed so (lists, dicts, None)."""

    def moved(value: Any) -> Any:
        if isinstance(value, bool):
            return not value
        if isinstance(value, int | float):
            return value + 1
        if isinstance(value, str):
            if not value:
                return "x"
            last = value[-1]
            if last.isdigit():
                return value[:-1] + str((int(last) + 1) % 10)
            if last.isascii() and last.isalpha():
                base = ord("a") if last.islower() else ord("A")
                return value[:-1] + chr(base + (ord(last) - base + 1) % 26)
            return value + "x"
        return value

    changed = tuple(moved(a) for a in args)
    return None if changed == tuple(args) else changed


#: What a draft whose request ignores the call's arguments is told.
ARGUMENTS_RULE = (
    "the request it builds is the same whatever the arguments are: build it from the "
    "method's parameters, not from the values of this one call written into the code"
)


def answer_preview(answer: Mapping[str, Any]) -> str:
    """The body of an answer as its author is shown it: JSON, cut to ``MAX_PREVIEW_CHARS``."""
    body = answer.get("json") if "json" in answer else answer.get("text")
    text = json.dumps(body, ensure_ascii=False) if "json" in answer else str(body)
    if len(text) > MAX_PREVIEW_CHARS:
        text = text[: MAX_PREVIEW_CHARS - 1] + "…"
    return text


def read_in_trial(
    receiver: UvmObject,
    selector: str,
    source: str,
    args: tuple,
    kwargs: Mapping[str, Any],
    answer: dict[str, Any],
) -> tuple[bool, Any, list[str]]:
    """A draft's reading phase run, sandboxed in an isolated child, on the service's real
    answer: (True, what it read, []) or (False, None, what went wrong, with the answer's body
    so the next draft can read it right)."""
    outcome = _read_isolated(receiver, selector, source, args, kwargs, answer, forgiving=False)
    status = answer.get("status")
    why = (
        " (it does not know that request: check the address and each parameter's name "
        "against the service's about)"
        if isinstance(status, int) and status >= 400
        else ""
    )
    shown = f"the service answered status {status}{why} with: {answer_preview(answer)}"
    if not outcome.ok:
        said = "; ".join(outcome.findings or (outcome.summary,))
        return False, None, [f"reading the service's real answer, {said}", shown]
    try:
        value = plain_data(outcome.value[1], "what it read", MAX_READ_NODES, MAX_READ_CHARS)
    except ValueError as exc:
        return False, None, [f"reading the service's real answer, {exc}", shown]
    return True, value, []


def perform(described: Any, what: str) -> dict[str, Any]:
    """Check a request description against the policy and send it; the bounded response."""
    from prototypes import tool_client

    try:
        req = read_request(described)
    except ValueError as exc:
        raise SandboxViolation(f"tool method {what} built no usable request", [str(exc)]) from None
    policy = ToolPolicy.from_settings()
    policy.check_request(req)
    return tool_client.send(req, policy)


register_compiler(TOOL_COMPILER, compile_tool)


# -- a tool call named as data (by a facet) ----------------------------------------------------

#: Arguments a tool call named as data may carry, and characters of their JSON.
MAX_CALL_ARGS = 8
MAX_CALL_CHARS = 4_000


@dataclass(frozen=True)
class ToolCall:
    """A call of a proxy's method that generated code asked the host to make (plain data)."""

    name: str
    selector: str
    args: tuple[Any, ...] = ()

    def text(self) -> str:
        shown = ", ".join(json.dumps(a) for a in self.args)
        return f"tools.{self.name}.{self.selector}({shown})"


def read_call(value: Any) -> ToolCall:
    """``{"name", "selector", "args"}`` from generated code as a ``ToolCall``; ``ValueError``."""
    if not isinstance(value, Mapping):
        raise ValueError("'tool' must be a dict with 'name', 'selector' and 'args'")
    unknown = sorted(set(map(str, value)) - {"name", "selector", "args"})
    if unknown:
        raise ValueError(f"'tool' takes name, selector and args, not {unknown}")
    name, selector, args = value.get("name"), value.get("selector"), value.get("args", [])
    for what, text in (("name", name), ("selector", selector)):
        if not isinstance(text, str) or not text.isidentifier() or text.startswith("_"):
            raise ValueError(f"the tool's {what} must be a public name")
    if not isinstance(args, list | tuple) or len(args) > MAX_CALL_ARGS:
        raise ValueError(f"the tool's args must be a list of at most {MAX_CALL_ARGS} values")
    encoded = json.dumps(plain_data(list(args), "the tool's args", MAX_BODY_NODES, MAX_CALL_CHARS))
    # both checked to be public names above
    return ToolCall(cast(str, name), cast(str, selector), tuple(json.loads(encoded)))


def call(toolbox: UvmObject, spec: ToolCall) -> Any:
    """Make ``spec`` through an installed proxy method (never writes one: that is slow work,
    done ahead of time): what its reading phase returned, or, for a method without one, the
    response's status and body. ``ToolError`` / ``LookupError`` say why not."""
    proxy = toolbox._slots().get(spec.name)
    if not is_tool(proxy):
        known = ", ".join(proxies(toolbox)) or "none yet"
        raise LookupError(f"there is no tool {spec.name!r} (tools: {known})")
    found = proxy._lookup(spec.selector)
    if found is None or not isinstance(found[1], Method) or found[1].compiler != TOOL_COMPILER:
        raise LookupError(
            f"tools.{spec.name} has no method {spec.selector!r} yet; write it first with "
            f"'batos send tools.{spec.name} {spec.selector} ARGS...'"
        )
    answer = getattr(proxy, spec.selector)(*spec.args)
    if getattr(found[1].function(), "reads", False):
        return answer
    return {k: answer[k] for k in ("status", "json", "text") if k in answer}
