"""The embedded backend's engine: one llama.cpp model per process, persona LoRAs swapped in place.

An ``Engine`` loads a base GGUF once. Persona adapters are loaded once into RAM (an LRU of
``adapter_capacity`` entries: disk → RAM → active); switching persona sets the active adapter
on the context — the weights are never reloaded. The KV cache a persona built is kept aside
when another persona speaks (``PrefixCache``) and put back when it speaks again, so its system
prompt and shared context are evaluated once, not at every turn of a cycle. One generation runs
at a time per engine; callers queue in arrival order (``FairLock``), and a caller's cancel event
ends its wait or its generation at the next token. ``llama_cpp`` is imported here only, so the
rest of BAT OS starts without it.
"""

from __future__ import annotations

import atexit
import codecs
import contextlib
import ctypes
import logging
import random
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from batos import settings
from batos.errors import ModelError, PromptTooLong
from batos.models.cancel import raise_if_cancelled
from store.core.text import well_formed

log = logging.getLogger("batos.llm.engine")

DEFAULT_N_CTX = 4096
N_BATCH = 512


#: How often a waiter for the engine looks at its cancel event, in seconds.
CANCEL_POLL_S = 0.1


class FairLock:
    """A ticket lock: waiters get the lock in the order they asked for it; waits can time out
    or be cancelled."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._next = 0
        self._serving = 0
        self._abandoned: set[int] = set()

    def acquire(self, timeout: float | None = None, cancel: threading.Event | None = None) -> bool:
        """Wait for the lock in arrival order; False (the place in line given up) once
        ``timeout`` seconds pass or ``cancel`` is set."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            ticket = self._next
            self._next += 1
            while self._serving != ticket:
                remaining = None if deadline is None else deadline - time.monotonic()
                if (remaining is not None and remaining <= 0) or (cancel and cancel.is_set()):
                    self._abandoned.add(ticket)
                    return False
                if cancel is not None:  # nothing notifies a set event: look at it now and then
                    remaining = min(remaining or CANCEL_POLL_S, CANCEL_POLL_S)
                self._cond.wait(remaining)
            return True

    def release(self) -> None:
        with self._cond:
            self._serving += 1
            while self._serving in self._abandoned:
                self._abandoned.discard(self._serving)
                self._serving += 1
            self._cond.notify_all()

    @property
    def waiting(self) -> int:
        with self._cond:
            return self._next - self._serving - len(self._abandoned)


@dataclass(frozen=True)
class Sampling:
    """Sampling settings of one call; names follow Ollama's PARAMETERs."""

    temperature: float = 0.7
    top_k: int = 40
    top_p: float = 0.9
    min_p: float = 0.05
    repeat_penalty: float = 1.1
    num_predict: int = 512
    seed: int | None = None
    stop: tuple[str, ...] = ()
    #: A JSON schema (as JSON text) the output must follow: sampled under llama.cpp's grammar.
    json_schema: str | None = None


@dataclass
class Usage:
    """What one generation cost; the last item every ``Engine.generate`` stream yields."""

    prompt_tokens: int = 0
    #: Prompt tokens whose keys and values were already in the cache (not evaluated again).
    cached_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = "stop"
    queued_s: float = 0.0
    swap_s: float = 0.0
    first_token_s: float | None = None
    total_s: float = 0.0
    adapters: tuple[str, ...] = field(default_factory=tuple)
    token_ids: list[int] = field(default_factory=list)


@dataclass
class _Loaded:
    handle: Any
    stamp: tuple[int, int]


@dataclass(frozen=True)
class _Stashed:
    """One sequence's KV cache, copied out of the context, and the tokens it holds."""

    adapters: tuple[Path, ...]
    tokens: tuple[int, ...]
    data: bytes


def common_prefix(a: Iterable[int], b: Iterable[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class PrefixCache:
    """KV caches set aside, least recently used first out, within a byte budget.

    The context holds one KV cache at a time, built under one adapter set. Evaluating a prompt
    is most of a short call's cost on a CPU (about 90 tokens a second for the default model on
    two cores, against 30 generated), and a cycle alternates personas — plan, facets, answer —
    so without this each turn evaluated its persona's system prompt and context again.
    """

    #: A stashed cache is put back only when it matches this many more prompt tokens than the
    #: live one. Copying a token's keys and values back costs microseconds against about ten
    #: milliseconds to evaluate it, so a few tokens already pay.
    MIN_GAIN = 4

    def __init__(self) -> None:
        self._entries: OrderedDict[int, _Stashed] = OrderedDict()
        self._next = 0

    @property
    def nbytes(self) -> int:
        return sum(len(e.data) for e in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, entry: _Stashed, budget: int) -> None:
        if len(entry.data) > budget:
            return
        for key, old in list(self._entries.items()):  # a cache this one extends is redundant
            if old.adapters == entry.adapters and entry.tokens[: len(old.tokens)] == old.tokens:
                del self._entries[key]
        self._entries[self._next] = entry
        self._next += 1
        while self.nbytes > budget:
            self._entries.popitem(last=False)

    def take(self, adapters: tuple[Path, ...], tokens: Sequence[int], beat: int) -> _Stashed | None:
        """Remove and return the entry under ``adapters`` sharing the longest prefix with
        ``tokens``, if it beats ``beat`` tokens by ``MIN_GAIN``."""
        best, best_key = beat + self.MIN_GAIN - 1, None
        for key, entry in self._entries.items():
            if entry.adapters == adapters:
                shared = common_prefix(entry.tokens, tokens)
                if shared > best:
                    best, best_key = shared, key
        return None if best_key is None else self._entries.pop(best_key)

    def drop(self, adapter: Path) -> None:
        """Forget the caches built under ``adapter`` (its file changed: they no longer fit)."""
        for key, entry in list(self._entries.items()):
            if adapter in entry.adapters:
                del self._entries[key]

    def clear(self) -> None:
        self._entries.clear()


class Engine:
    """A base model loaded once, with its persona adapters, serving one generation at a time."""

    def __init__(
        self,
        gguf: Path,
        *,
        n_ctx: int = DEFAULT_N_CTX,
        n_threads: int | None = None,
        last_n: int = 64,
        capacity: int | None = None,
    ) -> None:
        try:
            import llama_cpp
        except ImportError as exc:
            raise ModelError(
                "llama-cpp-python is not installed",
                hint="run 'make setup' (it builds llama-cpp-python)",
            ) from exc
        self._lib = llama_cpp
        self.gguf = Path(gguf)
        self.n_ctx = n_ctx
        self.capacity = capacity or settings.get_int("adapter_capacity")
        started = time.perf_counter()
        try:
            self.llama = llama_cpp.Llama(
                str(self.gguf),
                n_ctx=n_ctx,
                n_batch=N_BATCH,
                last_n_tokens_size=last_n,
                n_threads=n_threads or settings.get_int("llm_threads"),
                verbose=False,
            )
        except (ValueError, RuntimeError) as exc:
            raise ModelError(
                f"llama.cpp cannot load {self.gguf}: {exc}",
                hint="check BATOS_MODEL names a valid GGUF model",
            ) from exc
        self.load_s = time.perf_counter() - started
        self.lock = FairLock()
        self._registry = threading.Lock()
        self._loaded: OrderedDict[Path, _Loaded] = OrderedDict()
        self._active: tuple[Path, ...] = ()
        self.prefixes = PrefixCache()
        self._formatter = self._chat_formatter()
        log.info("loaded %s (n_ctx=%d) in %.2fs", self.gguf.name, n_ctx, self.load_s)
        _LIVE.add(self)

    # --- prompts ---------------------------------------------------------------------

    def _chat_formatter(self) -> Any:
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        template = self.llama.metadata.get("tokenizer.chat_template")
        if not template:
            raise ModelError(
                f"{self.gguf.name} carries no chat template",
                hint="use a GGUF converted with its tokenizer's chat template",
            )
        model = self.llama._model
        eos, bos = self.llama.token_eos(), self.llama.token_bos()
        return Jinja2ChatFormatter(
            template=template,
            eos_token=model.token_get_text(eos) if eos != -1 else "",
            bos_token=model.token_get_text(bos) if bos != -1 else "",
        )

    def prompt_tokens(self, messages: Sequence[dict[str, str]]) -> list[int]:
        """``messages`` rendered by the GGUF's own chat template, tokenized."""
        result = self._formatter(messages=list(messages))
        return self.llama.tokenize(
            well_formed(result.prompt).encode("utf-8"),
            add_bos=not result.added_special,
            special=True,
        )

    # --- adapters --------------------------------------------------------------------

    def loaded_adapters(self) -> list[Path]:
        with self._registry:
            return list(self._loaded)

    @property
    def active_adapters(self) -> tuple[Path, ...]:
        return self._active

    def _handle(self, path: Path) -> Any:
        """The loaded adapter for ``path`` (loading it, and evicting the least recently used)."""
        try:
            st = path.stat()
        except OSError as exc:
            raise ModelError(
                f"adapter {path} cannot be read: {exc.strerror}",
                hint="train it with 'batos personas train' or remove the ADAPTER line",
            ) from None
        stamp = (st.st_size, st.st_mtime_ns)
        with self._registry:
            loaded = self._loaded.get(path)
            if loaded is not None and loaded.stamp == stamp:
                self._loaded.move_to_end(path)
                return loaded.handle
            with _llama_log_muted():
                handle = self._lib.llama_adapter_lora_init(
                    self.llama._model.model, str(path).encode("utf-8")
                )
            if not handle:
                raise ModelError(
                    f"adapter {path.name} does not fit the base model {self.gguf.name}",
                    hint="an adapter must be trained on this exact base; retrain it with "
                    "'batos personas train' or point BATOS_MODEL at its base",
                )
            if loaded is not None:  # the file changed on disk: the new one replaces it
                self._free(path, loaded)
                self.prefixes.drop(path)
            self._loaded[path] = _Loaded(handle, stamp)
            log.info("adapter %s loaded into RAM", path.name)
            self._evict(keep=path)
            return handle

    def _evict(self, keep: Path | None = None) -> None:
        """Free least recently used adapters beyond capacity; never an active one or ``keep``."""
        for old in list(self._loaded):
            if len(self._loaded) <= self.capacity:
                break
            if old not in self._active and old != keep:
                self._free(old, self._loaded[old])

    def _free(self, path: Path, loaded: _Loaded) -> None:
        if path in self._active:  # a replaced file while active: detach before freeing
            self._lib.llama_set_adapters_lora(self.llama._ctx.ctx, None, 0, None)
            self._active = ()
        self._lib.llama_adapter_lora_free(loaded.handle)
        self._loaded.pop(path, None)
        log.info("adapter %s evicted from RAM", path.name)

    def activate(self, adapters: Sequence[Path]) -> float:
        """Make ``adapters`` the active ones (caller holds ``lock``); seconds the swap took."""
        wanted = tuple(adapters)
        handles = [self._handle(p) for p in wanted]
        if wanted == self._active:
            return 0.0
        started = time.perf_counter()
        count = len(handles)
        array = (self._lib.llama_adapter_lora_p_ctypes * count)(*handles) if count else None
        scales = (ctypes.c_float * count)(*([1.0] * count)) if count else None
        self._stash()
        if self._lib.llama_set_adapters_lora(self.llama._ctx.ctx, array, count, scales):
            self._forget_cache()
            raise ModelError(
                f"llama.cpp refused adapters {[p.name for p in wanted]}",
                hint="check they were converted for this base model",
            )
        # The cached keys and values were computed under the old adapter: set aside above,
        # they must not serve the new one.
        self._forget_cache()
        self._active = wanted
        elapsed = time.perf_counter() - started
        with self._registry:
            self._evict()
        return elapsed

    # --- the KV caches of other prompts and personas -----------------------------------

    def _stash(self) -> None:
        """Copy the live KV cache aside (caller holds ``lock``), if the budget allows."""
        budget = settings.get_int("llm_prefix_cache_mb") * 2**20
        llama, lib = self.llama, self._lib
        if budget == 0 or llama.n_tokens == 0:
            return
        size = int(lib.llama_state_seq_get_size(llama._ctx.ctx, 0))
        if size > budget:
            return
        buffer = (ctypes.c_uint8 * size)()
        written = int(lib.llama_state_seq_get_data(llama._ctx.ctx, buffer, size, 0))
        if written <= 0:
            return
        tokens = tuple(int(t) for t in llama.input_ids[: llama.n_tokens])
        self.prefixes.put(_Stashed(self._active, tokens, bytes(buffer)[:written]), budget)

    def _reuse(self, tokens: Sequence[int]) -> None:
        """Put back the stashed KV cache that shares the most of ``tokens``' prefix under the
        active adapters, when it shares more than the live one (caller holds ``lock``)."""
        llama, lib = self.llama, self._lib
        live = common_prefix(llama.input_ids[: llama.n_tokens], tokens)
        found = self.prefixes.take(self._active, tokens, live)
        if llama.n_tokens - live >= PrefixCache.MIN_GAIN:
            self._stash()  # generate() is about to overwrite the live cache's tail
        if found is None:
            return
        self._forget_cache()
        buffer = (ctypes.c_uint8 * len(found.data)).from_buffer_copy(found.data)
        if int(lib.llama_state_seq_set_data(llama._ctx.ctx, buffer, len(found.data), 0)) == 0:
            log.warning("a stashed KV cache could not be restored; evaluating the prompt")
            self._forget_cache()
            return
        count = len(found.tokens)
        llama.input_ids[:count] = found.tokens
        llama.n_tokens = count
        # The logits are not part of the sequence's state: generate() must decode at least
        # one token before it samples.
        llama._requires_eval = True

    def _forget_cache(self) -> None:
        """Empty the KV cache. Only its cell metadata is cleared (data=False): zeroing the
        buffers too costs a memset of the whole cache, tens of ms, for no change in output."""
        self.llama.reset()
        memory = self._lib.llama_get_memory(self.llama._ctx.ctx)
        if memory is not None:
            self._lib.llama_memory_clear(memory, False)

    def close(self, timeout: float = 1.0) -> bool:
        """Free the adapters and the model now; False (nothing freed) while a generation still
        holds the engine after ``timeout`` seconds."""
        if not self.lock.acquire(timeout=timeout):
            return False
        try:
            with self._registry:
                if self._active:
                    self._lib.llama_set_adapters_lora(self.llama._ctx.ctx, None, 0, None)
                    self._active = ()
                for path, loaded in list(self._loaded.items()):
                    self._lib.llama_adapter_lora_free(loaded.handle)
                    self._loaded.pop(path, None)
                self.prefixes.clear()
            self.llama.close()
            return True
        finally:
            self.lock.release()

    def prefetch(self, adapters: Sequence[Path]) -> threading.Thread:
        """Load ``adapters`` into RAM in the background, taking a turn in the queue."""

        def load() -> None:
            if not self.lock.acquire(timeout=settings.get_float("llm_timeout")):
                return
            try:
                for path in adapters:
                    self._handle(path)
            except ModelError as exc:
                log.warning("prefetch failed: %s", exc.message)
            finally:
                self.lock.release()

        thread = threading.Thread(target=load, name="batos-adapter-prefetch", daemon=True)
        thread.start()
        return thread

    # --- scoring ---------------------------------------------------------------------

    def loglikelihood(
        self,
        messages: Sequence[dict[str, str]],
        continuation: str,
        *,
        adapters: Sequence[Path] = (),
        timeout: float | None = None,
    ) -> tuple[float, int]:
        """The log-probability of ``continuation`` as the assistant's reply to ``messages``:
        (sum of the tokens' natural log-probabilities, how many tokens). Nothing is sampled.

        Only the reply's tokens are decoded with their logits (llama.cpp computes logits for
        the rows a batch flags, so a long prompt costs a plain prompt evaluation, and reuses
        the KV cache of an earlier call that shares its prefix, as ``generate`` does).
        """
        import numpy as np

        started = time.monotonic()
        wait = timeout or settings.get_float("llm_timeout")
        if not self.lock.acquire(timeout=wait):
            raise ModelError(
                f"the model stayed busy for {wait:.0f}s; the scoring was dropped",
                hint="raise BATOS_LLM_TIMEOUT or send fewer requests at once",
            )
        llama, lib = self.llama, self._lib
        try:
            self.activate(adapters)
            prompt = self.prompt_tokens(messages)
            reply = llama.tokenize(
                well_formed(continuation).encode("utf-8"), add_bos=False, special=False
            )
            tokens = prompt + reply
            if not reply:
                return 0.0, 0
            if len(tokens) > self.n_ctx:
                raise PromptTooLong(
                    f"the prompt and reply are {len(tokens)} tokens; the context holds "
                    f"{self.n_ctx}",
                    hint="score a shorter text",
                )
            self._reuse(tokens)
            # The logits of the prompt's last token give the reply's first token: evaluate
            # up to it as a plain prompt, then it and the reply with every row's logits.
            split = len(prompt) - 1
            live = common_prefix(llama.input_ids[: llama.n_tokens], tokens)
            llama.n_tokens = min(live, split)
            if llama.n_tokens < split:
                llama.eval(tokens[llama.n_tokens : split])
            total, n_vocab = 0.0, llama.n_vocab()
            tail = tokens[split:]
            for start in range(0, len(tail) - 1, N_BATCH):
                if time.monotonic() - started > wait:
                    raise ModelError(
                        f"scoring ran past its {wait:.0f}s timeout",
                        hint="raise BATOS_LLM_TIMEOUT or score a shorter text",
                    )
                chunk = tail[start : start + N_BATCH]
                n_past = llama.n_tokens
                llama._ctx.kv_cache_seq_rm(-1, n_past, -1)
                llama._batch.set_batch(batch=chunk, n_past=n_past, logits_all=True)
                llama._ctx.decode(llama._batch)
                llama.input_ids[n_past : n_past + len(chunk)] = chunk
                llama.n_tokens = n_past + len(chunk)
                rows = np.ctypeslib.as_array(
                    lib.llama_get_logits(llama._ctx.ctx), shape=(len(chunk) * n_vocab,)
                ).reshape(len(chunk), n_vocab)
                following = tail[start + 1 : start + 1 + len(chunk)]
                for row, token in zip(rows, following, strict=False):
                    peak = float(row.max())
                    lse = peak + float(np.log(np.exp(row - peak).sum()))
                    total += float(row[token]) - lse
            # The next generate() must decode a token before it samples.
            llama._requires_eval = True
            return total, len(reply)
        except BaseException:
            self._forget_cache()
            raise
        finally:
            self.lock.release()

    # --- generation ------------------------------------------------------------------

    def _grammar(self, json_schema: str | None) -> Any:
        """llama.cpp's grammar for a JSON schema, converted once per schema (the grammar is
        text; each generation builds its own sampler state from it)."""
        if json_schema is None:
            return None
        grammars = self.__dict__.setdefault("_grammars", {})
        if json_schema not in grammars:
            try:
                grammars[json_schema] = self._lib.LlamaGrammar.from_json_schema(
                    json_schema, verbose=False
                )
            except (ValueError, RuntimeError, KeyError) as exc:
                raise ModelError(
                    f"llama.cpp cannot turn the JSON schema into a grammar: {exc}",
                    hint="keep structured output schemas to objects, arrays, enums and strings",
                ) from exc
        return grammars[json_schema]

    def generate(
        self,
        messages: Sequence[dict[str, str]],
        *,
        adapters: Sequence[Path] = (),
        sampling: Sampling = Sampling(),
        timeout: float | None = None,
        cancel: threading.Event | None = None,
    ) -> Iterator[str | Usage]:
        """Stream text pieces for ``messages``, then one ``Usage``; waits its turn first.

        Setting ``cancel`` stops the wait or the generation at its next token with
        ``GenerationCancelled`` (the engine is free again at once).
        """
        started = time.monotonic()
        deadline = started + (timeout or settings.get_float("llm_timeout"))
        if not self.lock.acquire(timeout=deadline - started, cancel=cancel):
            raise_if_cancelled(cancel)
            raise ModelError(
                f"the model stayed busy for {timeout}s; the request was dropped",
                hint="raise BATOS_LLM_TIMEOUT or send fewer requests at once",
            )
        try:
            raise_if_cancelled(cancel)
            usage = Usage(
                queued_s=time.monotonic() - started, adapters=tuple(p.name for p in adapters)
            )
            usage.swap_s = self.activate(adapters)
            tokens = self.prompt_tokens(messages)
            self._reuse(tokens)
            usage.cached_tokens = common_prefix(self.llama.input_ids[: self.llama.n_tokens], tokens)
            yield from self._run(tokens, sampling, deadline, usage, started, cancel)
        finally:
            self.lock.release()

    def _run(
        self,
        tokens: list[int],
        sampling: Sampling,
        deadline: float,
        usage: Usage,
        started: float,
        cancel: threading.Event | None,
    ) -> Iterator[str | Usage]:
        llama, lib = self.llama, self._lib
        usage.prompt_tokens = len(tokens)
        room = self.n_ctx - len(tokens)
        if room < 1:
            raise PromptTooLong(
                f"the prompt is {len(tokens)} tokens; the context holds {self.n_ctx}",
                hint="shorten the conversation or the texts it quotes, or raise PARAMETER "
                "num_ctx in modelfiles/base.Modelfile",
            )
        limit = room if sampling.num_predict <= 0 else min(room, sampling.num_predict)
        usage.finish_reason = "length"
        llama.set_seed(sampling.seed if sampling.seed is not None else random.getrandbits(31))
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pending = ""
        hold = max((len(s) for s in sampling.stop), default=0)
        try:
            for token in llama.generate(
                tokens,
                top_k=sampling.top_k,
                top_p=sampling.top_p,
                min_p=sampling.min_p,
                temp=sampling.temperature,
                repeat_penalty=sampling.repeat_penalty,
                grammar=self._grammar(sampling.json_schema),
            ):
                if usage.first_token_s is None:
                    usage.first_token_s = time.monotonic() - started
                if lib.llama_vocab_is_eog(llama._model.vocab, token):
                    usage.finish_reason = "stop"
                    break
                usage.completion_tokens += 1
                usage.token_ids.append(token)
                pending += decoder.decode(llama.detokenize([token]))
                cut = min(
                    (i for i in (pending.find(s) for s in sampling.stop) if i >= 0), default=-1
                )
                if cut >= 0:
                    pending = pending[:cut]
                    usage.finish_reason = "stop"
                    break
                safe = len(pending) - _partial_stop(pending, sampling.stop, hold)
                if safe > 0:
                    yield pending[:safe]
                    pending = pending[safe:]
                if usage.completion_tokens >= limit:
                    break
                raise_if_cancelled(cancel)
                if time.monotonic() > deadline:
                    raise ModelError(
                        f"generation ran past its {deadline - started:.0f}s timeout",
                        hint="raise BATOS_LLM_TIMEOUT or ask for a shorter answer (num_predict)",
                    )
        except BaseException:
            # A failed or abandoned generation must not leave a half-written KV cache behind.
            self._forget_cache()
            raise
        pending += decoder.decode(b"", final=True)
        if pending:
            yield pending
        usage.total_s = time.monotonic() - started
        yield usage


@contextlib.contextmanager
def _llama_log_muted() -> Iterator[None]:
    """Silence llama.cpp's log while loading an adapter: it prints a line per tensor that
    cannot use a repacked CPU buffer (harmless), and a failed load is our own ModelError."""
    logger = logging.getLogger("llama-cpp-python")
    level = logger.level
    logger.setLevel(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logger.setLevel(level)


def _partial_stop(text: str, stops: Sequence[str], hold: int) -> int:
    """Length of the longest tail of ``text`` that could still grow into a stop string."""
    for size in range(min(hold, len(text)), 0, -1):
        tail = text[-size:]
        if any(s.startswith(tail) for s in stops):
            return size
    return 0


_ENGINES: dict[tuple[str, int, int], Engine] = {}
#: Every engine still alive, shared or not, for closing at exit.
_LIVE: weakref.WeakSet[Engine] = weakref.WeakSet()
_ENGINES_LOCK = threading.Lock()


def engine(gguf: Path, n_ctx: int = DEFAULT_N_CTX) -> Engine:
    """The process-wide engine for ``gguf`` at ``n_ctx``, loading the model on first use."""
    threads = settings.get_int("llm_threads")
    key = (str(Path(gguf).resolve()), n_ctx, threads)
    with _ENGINES_LOCK:
        if key not in _ENGINES:
            _ENGINES[key] = Engine(Path(gguf), n_ctx=n_ctx, n_threads=threads)
        return _ENGINES[key]


def loaded_engines() -> list[Engine]:
    with _ENGINES_LOCK:
        return list(_ENGINES.values())


@atexit.register
def _close_engines() -> None:
    """Free every engine before the interpreter tears its modules down: left to
    ``Llama.__del__`` at that point, llama-cpp-python's own clean-up finds its functions already
    gone and prints a TypeError traceback per model."""
    with _ENGINES_LOCK:
        _ENGINES.clear()
    for eng in list(_LIVE):
        with contextlib.suppress(Exception):
            eng.close(timeout=0.5)
