"""The one exception tree of BAT OS; every message says what to do next.

    BatosError
     ├── ConfigurationError          a setting has a value we cannot use
     ├── ImageError                  the living image cannot be opened or used
     │    ├── ImageURIError          unknown scheme or malformed URI
     │    ├── ImageNotFoundError     no image at that path (and the command does not create)
     │    ├── ImageLockedError       another process holds the FileStorage lock
     │    ├── ImageCorruptError      damaged history or records, or not a FileStorage
     │    ├── ImageGlobalRefused     a record names code BAT OS does not load from an image
     │    ├── PlainMethodRefused     a stored method is plain Python, which BAT OS does not run
     │    └── TransactionFailed      retries exhausted on conflicts (TransientError)
     ├── ObjectPathError             no object at a dotted path in the image
     ├── ModelError                  model weights or backends
     │    ├── ModelFileError         a model part is missing or fails its checksum
     │    └── PromptTooLong          a prompt does not fit the model's context
     ├── DoesNotUnderstand           a public message no slot or parent answers
     │                                (also an AttributeError, so hasattr/getattr work)
     ├── SlotError                   a slot name or value a prototype cannot hold
     │                                (also a ValueError)
     ├── GeneratedCodeError          method code (LLM-written or hand-written) was refused
     │    ├── AuditRejected           the PersistenceGuardian found problems (all listed)
     │    ├── SandboxViolation        the code broke the sandbox policy while running
     │    │    └── SandboxLimitExceeded   it ran out of time or memory
     │    └── MissionFailed           doesNotUnderstand gave up after every attempt
     ├── CheckpointError              a checkpointer request is malformed or names nothing
     │    ├── CheckpointConfigError   no usable thread or checkpoint id (also a ValueError)
     │    ├── CheckpointNotFound      no such thread or checkpoint (a LookupError, ValueError)
     │    ├── MalformedCommit         a commit channel's value is malformed (also a ValueError)
     │    ├── ThreadMovedOn           another run stored a newer checkpoint first (a ValueError)
     │    ├── ThreadBusy              another process's run is answering on the thread now
     │    └── CheckpointSerializationError  a state value cannot be encoded (a TypeError)
     ├── CatalogError                 the knowledge catalog cannot do what was asked
     │    ├── DocumentError           one input document cannot be ingested
     │    └── ArchiveError            a curator archive is missing or unreadable
     ├── ToolError                    a tool proxy's call to an outside service failed
     │    ├── ToolRefused             the request is outside tools_allow / tools_secrets
     │    └── ToolCallFailed          the service timed out, failed or sent an unreadable body
     ├── MindError                    a request to the mind cannot be answered
     │    ├── RoutingError            a request the router cannot route (empty, too large)
     │    ├── CycleFailed             a cycle ended FAILED; the image is unchanged
     │    └── CycleInterrupted        the user stopped a cycle (Ctrl-C); the image is unchanged
     └── GraphRequestError            a graph's input or context is malformed (a ValueError,
                                      so the LangGraph server shows its message to clients)

Each class carries an ``exit_code`` the CLI uses, so scripts can tell failures apart.
``GenerationCancelled`` stands outside the tree on purpose: it is a stop the caller asked for,
not an error (see its docstring).
"""

from __future__ import annotations

import re


class BatosError(Exception):
    """Root of every error BAT OS raises on purpose."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(f"{message}\n  hint: {hint}" if hint else message)


class ConfigurationError(BatosError):
    """A setting holds a value BAT OS cannot use."""

    exit_code = 2


class ImageError(BatosError):
    """The living image cannot be opened or used."""

    exit_code = 3


class ImageURIError(ImageError):
    """The image URI has an unknown scheme or is malformed."""


class ImageNotFoundError(ImageError):
    """No image exists where the URI points, and the command only uses existing ones."""


class ImageLockedError(ImageError):
    """Another process holds the image's FileStorage lock."""


class ImageCorruptError(ImageError):
    """Committed history or an object record is damaged, or the file is not a FileStorage.

    Raised before anything on disk changes; ``batos repair`` recovers what can be read.
    """


_DOTTED_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+")


class ImageGlobalRefused(ImageError):
    """A record names a class or function BAT OS does not load from an image.

    Unpickling a record can call whatever it names, so only the globals on the allow-list
    (``store.core.image_globals``) are resolved; this one was not, and nothing it names ran.
    ``oid`` is the record's object id where it is known.
    """

    def __init__(self, module: str, name: str, *, oid: bytes | None = None) -> None:
        self.module = module
        self.name = name
        self.oid = oid
        record = f"record 0x{oid.hex()}" if oid is not None else "a record"
        named = f"{module}.{name}"
        if not _DOTTED_NAME.fullmatch(named) or len(named) > 200:
            # A forged record can name anything: shown cut short and escaped, never raw.
            shown = repr(named[:80])
            hint = "open this image only if you trust everyone who could write it"
        elif not name[:1].isupper():
            # Likely a function (os.system): allowing it would let the record call it.
            shown = named
            hint = (
                "a function, most likely: an image BAT OS writes names none, so this one was "
                "written by something else; open it only if you trust everyone who could write it"
            )
        else:
            shown = named
            hint = (
                "if you stored it there yourself, or trust everyone who could write this image, "
                f"allow it with BATOS_IMAGE_GLOBALS='{named}' (a whole module: 'MODULE.*')"
            )
        super().__init__(
            f"{record} of the image names {shown}, which BAT OS does not load from an image "
            "unless it is allowed; nothing was run",
            hint=hint,
        )


class PlainMethodRefused(ImageError):
    """A method stored in the image is plain Python (compiler ``plain``), which runs
    unsandboxed; BAT OS never stores one, so one found there is not run unless the
    ``image_plain_methods`` setting allows it."""

    def __init__(self, selector: str, *, oid: bytes | None = None) -> None:
        self.selector = selector
        record = f"record 0x{oid.hex()}" if oid is not None else "a record"
        super().__init__(
            f"method {selector[:80]!r} ({record} of the image) is plain Python, "
            "which BAT OS does not run from an image: it would run unsandboxed; nothing was run",
            hint="BAT OS stores only sandboxed methods, so this one was stored from Python or "
            "by something else: if you stored it yourself, or trust everyone who could write "
            "this image, set BATOS_IMAGE_PLAIN_METHODS=on; otherwise remove it with "
            "'batos methods remove PATH SELECTOR'",
        )


class TransactionFailed(ImageError):
    """A transaction kept conflicting after every retry; nothing was committed.

    Conflicts are transient: resubmitting the same work later is safe.
    """


class ObjectPathError(BatosError, LookupError):
    """No object lives at the given path in the image."""

    exit_code = 4


class ModelError(BatosError):
    """A language model or its weights cannot be used."""

    exit_code = 5


class ModelFileError(ModelError):
    """A model file part is missing or does not match its pinned checksum."""


class PromptTooLong(ModelError):
    """A prompt (with the reply scored after it) holds more tokens than the model's context.
    Retrying the same prompt fails the same way; a caller with many prompts to make (the
    curator, one per cluster) can skip this one and go on."""


class DoesNotUnderstand(BatosError, AttributeError):
    """A public message that neither the receiver nor any parent answers.

    Subclassing AttributeError keeps ``hasattr`` and ``getattr(obj, name, default)``
    behaving as Python programmers expect.
    """

    exit_code = 6

    def __init__(self, receiver: object, selector: str, *, hint: str | None = None) -> None:
        self.receiver = receiver
        self.selector = selector
        BatosError.__init__(
            self,
            f"{receiver!r} does not understand {selector!r}",
            hint=hint
            or "add a slot or method with that name, or give the object a parent that has one",
        )


class SlotError(BatosError, ValueError):
    """A prototype cannot take this slot: a name it could never answer, or a value it
    cannot copy or store."""


class GeneratedCodeError(BatosError):
    """Method code was refused or failed; ``findings`` lists every reason, one line each.

    The findings are written to be fed back to the model that wrote the code.
    """

    exit_code = 7
    #: What to do when the raiser gave no hint of its own.
    default_hint: str | None = None

    def __init__(
        self, message: str, findings: list[str] | None = None, *, hint: str | None = None
    ) -> None:
        self.findings = list(findings or [])
        self.reason = message  # the message without its findings, to rebuild the error
        listed = "".join(f"\n  - {finding}" for finding in self.findings)
        super().__init__(message + listed, hint=hint or self.default_hint)
        self.message = message + listed


class AuditRejected(GeneratedCodeError):
    """The PersistenceGuardian rejected method source before it ever ran."""


class SandboxViolation(GeneratedCodeError):
    """Code running in the sandbox tried something the policy forbids, or crashed it."""

    default_hint = (
        "nothing was changed; rewrite the method within the sandbox's rules "
        "('batos methods' shows its source, 'batos methods remove' takes it out)"
    )


class SandboxLimitExceeded(SandboxViolation):
    """Code running in the sandbox used more wall time or memory than allowed."""

    default_hint = (
        "nothing was changed; make the method do less, or raise BATOS_SANDBOX_SECONDS or "
        "BATOS_SANDBOX_MEMORY_MB if the work is legitimate"
    )


class MissionFailed(GeneratedCodeError):
    """doesNotUnderstand could not produce a working method; the image is unchanged."""


class CheckpointError(BatosError):
    """A checkpoint request is malformed or names something that does not exist."""

    exit_code = 8


class CheckpointConfigError(CheckpointError, ValueError):
    """The config passed to the checkpointer lacks a usable thread or checkpoint id."""


class MalformedCommit(CheckpointError, ValueError):
    """A graph's ``commit`` channel holds what is not a well-formed commit of known effects
    (a ValueError, so the LangGraph server shows a client its reason)."""


class CheckpointNotFound(CheckpointError, LookupError, ValueError):
    """No thread or checkpoint with the requested id exists in the image.

    Also a ValueError: the LangGraph server passes the message of those (reason and hint) to
    its clients, and only "An internal error occurred" of a LookupError.
    """


class ThreadMovedOn(CheckpointError, ValueError):
    """A run continued the thread's latest checkpoint, and another run (most often in another
    process sharing the image) stored a newer one first; the run's step was not stored.

    A ValueError, so the LangGraph server shows a client its reason and hint.
    """


class ThreadBusy(CheckpointError, ValueError):
    """A request was sent on a thread whose latest checkpoint is a run still in progress
    (another process's, most often); nothing of the request was stored."""


class CheckpointSerializationError(CheckpointError, TypeError):
    """A state value cannot be encoded by the checkpointer's serializer; nothing was written."""


class CatalogError(BatosError):
    """The knowledge catalog cannot do what was asked."""

    exit_code = 9


class DocumentError(CatalogError):
    """One input document cannot be ingested (unreadable, binary, empty, too large)."""


class ArchiveError(CatalogError):
    """A curator archive does not exist or cannot be read back."""


class ToolError(BatosError):
    """A tool proxy's request to an outside service could not be made or read."""

    exit_code = 11


class ToolRefused(ToolError):
    """The request is outside the policy (``tools_allow``, ``tools_secrets``); nothing was
    sent. The hint names the setting that would allow it."""


class ToolCallFailed(ToolError):
    """The service was asked and did not answer usefully: timeout, connection refused, a body
    over ``tools_max_bytes`` or one that does not parse as the request expected."""


class MindError(BatosError):
    """A request to the mind (``graph.mind``) cannot be answered as asked."""

    exit_code = 10


class RoutingError(MindError, ValueError):
    """A request the router cannot route: empty, not text, or read from an unusable file."""


class CycleFailed(MindError):
    """A mind cycle ended FAILED: nothing it computed reached the image.

    ``state`` holds the cycle's final graph state (route, plan, partial answers, failure).
    """

    def __init__(self, message: str, *, hint: str | None = None, state: dict | None = None):
        super().__init__(message, hint=hint)
        self.state = dict(state or {})


class CycleInterrupted(MindError):
    """The user stopped a mind cycle before it ended (Ctrl-C): nothing it computed reached the
    image, and its thread holds the request with an answer marked interrupted.

    Exit code 130, as for any command a SIGINT ends.
    """

    exit_code = 130


class GraphRequestError(BatosError, ValueError):
    """A graph's input or run context is malformed; nothing ran.

    Also a ValueError: the LangGraph server passes the message of those to its clients.
    """

    exit_code = 2


class GenerationCancelled(BaseException):
    """The caller stopped a model call in progress (``batos.models.cancel``; the chat's Ctrl-C).

    A ``BaseException``, as ``KeyboardInterrupt`` is, not a ``BatosError``: the mind turns the
    ``Exception``s of its model calls into fallbacks (a facet that fails is answered directly,
    a rejected plan is retried) or a FAILED cycle; a stop the user asked for must pass through
    all of them and end the run, leaving what to record to the caller that asked for it.
    """
