"""The mind's nodes: the states of the Prototypal State Machine, each a method of ``Mind``.

ROUTE, DECOMPOSING, DELEGATING (one facet per branch), SYNTHESIZING, the quality gate,
COMPLETE and FAILED; ``graph.mind`` wires them into the graph. No node commits: changes travel
as effects and COMPLETE hands them to the checkpointer (``graph.cycle``). Every model call
streams and is measured; each transition logs one JSON line on ``batos.mind``.

The mind degrades, it does not fail: a facet that cannot serve hands its sub-query to its
persona, a plan that fails twice becomes the fast path, a program that cannot be written leaves
the answer without its result, an answer the gate refuses twice is still given (marked so).
Each degradation is recorded (``cycle.degraded``). A cycle is FAILED only when no answer can be
given: the request is invalid or the answering model itself cannot be reached.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base.id import uuid6
from langgraph.constants import CONFIG_KEY_CHECKPOINTER
from langgraph.runtime import get_runtime
from langgraph.types import Send

from batos import settings
from batos.errors import BatosError, MindError
from graph import answer, compute, cycle, facets, thread
from graph import prompts as prompt_files
from graph.answer import MAX_ANSWER_CHARS, REFUSAL, history, repetition
from graph.mind_state import MindServices, MindState
from graph.plan import (
    Depth,
    PlanRejected,
    depth_for,
    facets_of,
    parse_plan,
    plan_quality,
    plan_schema,
)
from graph.request import check_context, check_thread_id, content_text, request_text
from prototypes.bounded import bounded_repr, strict_json
from prototypes.codex import PERSONAS, load_codex
from store.checkpoint import effects
from store.core.image import LivingImage

log = logging.getLogger("batos.mind")

#: Tokens a plan, another persona's note and the final answer may take (a facet may ask for
#: fewer or more within ``facets.NUM_PREDICT_RANGE``). Generation runs at about 30 tokens a
#: second on two cores: the answer's budget is most of a cycle's time.
PLAN_TOKENS = 200
FACET_TOKENS = 160
ANSWER_TOKENS = 480
#: A request about memory of at most GROUNDED_FAST_WORDS words, or one question of at most
#: GROUNDED_QUESTION_WORDS, is answered from its passages in one call, with no plan, by the
#: first persona routed (``mind_memory_fast``). A grounded answer, and each BABS step of a
#: plan, reads the best ``mind_passages`` passages.
GROUNDED_FAST_WORDS = 30
GROUNDED_QUESTION_WORDS = 60
#: Who answers when the router cannot say (the one ``batos`` names with no router installed).
FALLBACK_PERSONA = "BRICK"
#: The step a plan gets for a request that needs a number or date computed.
COMPUTE_STEP = {"persona": compute.AUTHOR, "facet": "compute"}
#: The persona that reads figures out of passages for a computation (``mind_pairs``).
READER = "BABS"


def prompts() -> dict[str, Any]:
    return prompt_files.load("mind")


def _emit(event: str, **fields: Any) -> None:
    log.info(json.dumps({"event": event, **fields}, default=str))


def _failure(node: str, exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, BatosError):
        return {"node": node, "reason": exc.message, "hint": exc.hint or ""}
    log.exception("mind node %s failed", node)
    return {"node": node, "reason": f"{type(exc).__name__}: {exc}", "hint": "see the log"}


class Mind:
    """The graph's nodes, with what ``build_graph`` was given.

    The image comes from the assembly, never from LangGraph's internals: a ``ZODBSaver``
    checkpointer's image, else the run's or the defaults' ``services.image``, else
    ``served_image()`` (a served graph: the image of the runtime whose saver the server
    uses). With a ``ZODBSaver`` or a served image, COMPLETE's commit travels with the
    checkpoint; otherwise COMPLETE applies it in a transaction of its own.
    """

    def __init__(
        self,
        services: MindServices | None = None,
        *,
        checkpointer: Any = None,
        served_image: Callable[[], LivingImage] | None = None,
    ) -> None:
        from store.checkpoint.saver import ZODBSaver

        self.defaults = services or MindServices()
        saver = checkpointer if isinstance(checkpointer, ZODBSaver) else None
        self._saver_image = saver.image if saver is not None else None
        self._served_image = served_image
        #: Whether the checkpointer applies COMPLETE's commit with its checkpoint.
        self.commits_with_checkpoint = saver is not None or served_image is not None
        self.writers = facets.FacetWriters()
        self._lock = threading.Lock()
        self._cached: dict[tuple[str, Any], Any] = {}

    # -- what a run uses ------------------------------------------------------------------

    @staticmethod
    def _runtime_context() -> Any:
        """The run's context as the caller sent it (None outside a graph run)."""
        try:
            return get_runtime().context
        except RuntimeError:
            return None

    def _context(self) -> dict[str, Any]:
        context = self._runtime_context()
        return context if isinstance(context, dict) else {}

    def _checked_context(self) -> dict[str, Any]:
        return check_context(self._runtime_context())

    def _services(self) -> MindServices:
        given = self._context().get("services")
        if not isinstance(given, MindServices):
            return self.defaults
        return MindServices(
            **{
                name: getattr(given, name) or getattr(self.defaults, name)
                for name in MindServices.__dataclass_fields__
            }
        )

    def _once(self, kind: str, key: Any, make: Callable[[], Any]) -> Any:
        """One ``make()`` per kind and key (a URI, or an object kept alive by the cache)."""
        with self._lock:
            slot = (kind, key if isinstance(key, str) else id(key))
            if slot not in self._cached:
                self._cached[slot] = (key, make())
            return self._cached[slot][1]

    def image(self, config: RunnableConfig | None = None) -> LivingImage:
        """The image this run works on (the class docstring says which); it was brought up
        to date by whoever opened it (``open_runtime``)."""
        if self._saver_image is not None:
            return self._saver_image
        given = self._services().image
        if given is not None:
            return given
        if self._served_image is not None:
            return self._once("image", "served", self._served_image)
        raise MindError(
            "the mind was assembled without an image",
            hint="assemble it with batos.shell.runtime.open_runtime(), or give build_graph a "
            "ZODBSaver checkpointer or services.image",
        )

    def models(self, persona: str, **options: Any) -> BaseChatModel:
        factory = self._services().models
        if factory is None:
            from batos.models import chat_model

            factory = chat_model
        return factory(persona, **options)

    def authors(self, persona: str, **options: Any) -> BaseChatModel:
        """The model that writes ``persona``'s code (facets, programs): the given factory,
        which stands in for every model, else ``batos.models.author_model``."""
        factory = self._services().models
        if factory is None:
            from batos.models import author_model

            factory = author_model
        return factory(persona, **options)

    def embedder(self) -> Any:
        """The given embedder, else the router's: the gate compares the response's vector
        with the request's, which the router made, so both come from one encoder."""
        given = self._services().embedder
        if given is not None:
            return given
        from graph.router import routing_embedder

        return routing_embedder()

    def embed(self, text: str) -> np.ndarray:
        return np.asarray(self.embedder().encode([text])[0], dtype=np.float32)

    def router(self, image: LivingImage) -> tuple[Any, bool]:
        """The router, and whether it is the default one (whose runner-up is prefetched)."""
        given = self._services().router
        if given is not None:
            return given, False
        try:
            from graph.router import load_router
        except ImportError as exc:
            raise MindError(
                "no router is installed (graph.router is missing)",
                hint="pass a persona to answer as (--persona / context persona)",
            ) from exc
        # Every cycle asks: load_router is cached per stored record, and a retrain or a change
        # of the routing priors (an audit's mission, or its undo) must reach a running server.
        return load_router(image), True

    def catalog(self, image: LivingImage) -> Any:
        given = self._services().catalog
        if given is not None:
            return given
        from store.knowledge.catalog import KnowledgeCatalog

        # Without a given embedder the catalog picks the encoder its vectors were made with.
        given = self._services().embedder
        return self._once("catalog", image, lambda: KnowledgeCatalog.open(image, given))

    def searchable_catalog(self, image: LivingImage) -> Any:
        """The catalog, or None when the image's holds nothing (then neither its encoder is
        loaded nor its layout written: opening a catalog lays one out)."""
        if self._services().catalog is None:
            from store.knowledge.catalog import holds_chunks

            with image.read() as root:
                if not holds_chunks(root):
                    return None
        return self.catalog(image)

    # -- measured model calls -------------------------------------------------------------

    def call(
        self, model: BaseChatModel, messages: list[BaseMessage], **where: Any
    ) -> tuple[str, dict[str, Any]]:
        """Stream one model call; its text and what it cost (seconds, first token, tokens,
        prompt tokens served from the KV cache, why it stopped).

        ``at`` is when it started (epoch seconds): parallel facets' calls overlap, so the time
        a cycle spent in the model is the union of the calls' intervals, not their sum.
        """
        at = time.time()
        started = time.perf_counter()
        first: float | None = None
        full: Any = None
        for chunk in model.stream(messages):
            if first is None and content_text(chunk.content):
                first = time.perf_counter() - started
            full = chunk if full is None else full + chunk
        usage = (getattr(full, "usage_metadata", None) or {}) if full is not None else {}
        details = usage.get("input_token_details") or {}
        finish = (getattr(full, "response_metadata", None) or {}) if full is not None else {}
        metric = {
            **where,
            "at": round(at, 4),
            "seconds": round(time.perf_counter() - started, 4),
            "first_token_s": None if first is None else round(first, 4),
            "input_tokens": int(usage.get("input_tokens") or 0),
            "output_tokens": int(usage.get("output_tokens") or 0),
            "cached_tokens": int(details.get("cache_read") or 0),
            "finish_reason": str(finish.get("finish_reason") or finish.get("done_reason") or ""),
        }
        return content_text(full.content if full is not None else ""), metric

    # -- nodes ----------------------------------------------------------------------------

    def route(self, state: MindState, config: RunnableConfig) -> dict[str, Any]:
        started = time.perf_counter()
        cycle_state: dict[str, Any] = {
            "id": str(uuid6()),
            "thread_id": str((config.get("configurable") or {}).get("thread_id") or ""),
            "started": time.time(),
            "synthesis_attempts": 0,
            "degraded": [],
            "truncated": False,
        }
        update: dict[str, Any] = {
            "cycle": cycle_state,
            "route": {},
            "plan": [],
            "partials": {"replace": []},
            "effects": {"replace": []},
            "metrics": {"replace": []},
            "response": "",
            "failure": None,
            "cem": {},
            "commit": None,
        }
        try:
            update.update(self._route(state, config, cycle_state))
        except Exception as exc:
            update["failure"] = _failure("route", exc)
            update["status"] = "FAILED"
        self._transition("route", cycle_state["id"], update, started)
        return update

    def _route(
        self, state: MindState, config: RunnableConfig, cycle_state: dict[str, Any]
    ) -> dict[str, Any]:
        # The CLI and the bridge check the id before they run the graph; a client of the graph
        # or a LangGraph server passes its own, and one the effects cannot name would have the
        # cycle answer and then refuse its commit.
        check_thread_id(cycle_state["thread_id"])
        context = self._checked_context()
        image = self.image(config)
        limit = settings.get_int("mind_max_request_chars")
        request = request_text(state.get("messages") or [], limit)
        cycle_state["request"] = request
        forced = context.get("persona")
        vector = None
        if forced is not None:
            name = str(forced).upper()
            if name not in PERSONAS:
                raise MindError(
                    f"unknown persona {bounded_repr(forced, 80)}",
                    hint=f"choose one of {', '.join(PERSONAS)}",
                )
            ranked, chosen = [[name, 1.0]], [name]
        else:
            try:
                ranked, chosen, vector = self._routed(image, request)
            except Exception as exc:  # a router that fails: the default persona answers
                _degrade(cycle_state, "route", "the router", _failure("route", exc))
                ranked, chosen = [[FALLBACK_PERSONA, 1.0]], [FALLBACK_PERSONA]
        if vector is None:
            try:
                vector = self.embed(request)
            except Exception as exc:  # no vector: the gate cannot weigh relevance
                _degrade(cycle_state, "route", "the request's embedding", _failure("route", exc))
        depth = depth_for(
            request, chosen, settings.get_int("mind_fast_words"), context.get("depth")
        )
        grounded = False
        derived = settings.get_str("mind_derived") == "on"
        if compute.looks_computational(request) and not (derived and compute.needs_facts(request)):
            # Its figures are all in the request: passages would only offer other numbers.
            cycle_state.update(compute=True, passages=[], grounding={"about_catalog": False})
        else:
            # Figures named but not given ("how many more in 2024 than in 2023?") come from
            # the passages, when the request is about what the catalog holds.
            self._ground(image, cycle_state, request)
            grounded = bool(cycle_state["grounding"].get("about_catalog"))
            # Without passages such a program would only have the years to subtract.
            cycle_state["compute"] = compute.looks_computational(
                request, grounded=grounded, derived=derived
            ) and (grounded or not compute.needs_facts(request))
        about_thread = self._about_thread(state, cycle_state, request, vector)
        if about_thread and grounded:
            # The user's own words answer it: passages of documents would only compete.
            cycle_state.update(passages=[], more_passages=[])
            cycle_state["grounding"]["about_catalog"] = grounded = False
            cycle_state["compute"] = compute.looks_computational(
                request, grounded=False, derived=derived
            ) and not compute.needs_facts(request)
        unplanned = depth_for(request, chosen, 10**6, None).mode == "fast"
        forced_depth = context.get("depth") in ("fast", "full")
        if cycle_state["compute"] and depth.mode == "full" and unplanned and not forced_depth:
            # A word problem is long but needs no plan: a program, then the answer.
            depth = Depth("fast", "a computation: a program, then the answer")
        elif grounded and depth.mode == "full" and not forced_depth:
            # What memory holds answers it: a plan would only split the same passages, and
            # a second persona routed to a question about documents gives it a plan whose
            # steps need not read them (BRICK's "steps" for a fee the passages state).
            single = settings.get_str("mind_memory_fast") == "single"
            if _short_or_one_question(request) and (len(chosen) == 1 or not single):
                routed = "" if len(chosen) == 1 else f" ({len(chosen)} personas routed)"
                depth = Depth("fast", f"about memory: one answer from its passages{routed}")
        elif about_thread and depth.mode == "full" and not forced_depth:
            if _short_or_one_question(request) and not cycle_state["compute"]:
                # What the user said answers it: a plan's steps would not see the thread.
                depth = Depth("fast", "about the thread: one answer from what was said")
        if depth.mode == "fast":
            chosen = chosen[:1]
        cycle_state["depth"] = depth.as_dict()
        return {
            "route": {"ranked": ranked, "chosen": chosen, "forced": forced is not None},
            "cem": {
                "request_vector": None
                if vector is None
                else np.asarray(vector, dtype=np.float32).tolist()
            },
            "status": "SYNTHESIZING" if self._fast_only(cycle_state) else "DECOMPOSING",
        }

    def _routed(self, image: LivingImage, request: str) -> tuple[list, list[str], Any]:
        router, default = self.router(image)
        found = router.route(request)
        ranked = [[str(p), round(float(s), 4)] for p, s in found.ranked]
        chosen = [str(p) for p in found.chosen]
        if not chosen or any(p not in PERSONAS for p in chosen):
            raise MindError(f"the router chose {chosen!r}, not personas of the codex")
        if default:
            from graph.router import prefetch_runner_up

            prefetch_runner_up(found)
        return ranked, chosen, found.vector

    def _ground(self, image: LivingImage, cycle_state: dict[str, Any], request: str) -> None:
        """Whether the request is about what the catalog holds, and if so its best passages.
        A catalog that cannot be searched degrades the answer to one without passages."""
        from graph.retrieval import passage, probe

        cycle_state["passages"] = []
        cycle_state["grounding"] = {"about_catalog": False, "best": None}
        try:
            catalog = self.searchable_catalog(image)
            if catalog is None:
                return
            grounding = probe(catalog, request, settings.get_float("mind_grounding"))
            cycle_state["grounding"] = grounding.as_dict()
            if grounding.about_catalog:
                shown = settings.get_int("mind_passages")
                hits, failed = self._search(catalog, request, 2 * shown)
                if failed:
                    _degrade(cycle_state, "retrieval", "the passages' order", {"reason": failed})
                cycle_state["passages"] = [passage(h) for h in hits[:shown]]
                # The next best, for a second look when the first answer finds nothing.
                cycle_state["more_passages"] = [passage(h) for h in hits[shown:]]
        except Exception as exc:
            _degrade(cycle_state, "retrieval", "the knowledge catalog", _failure("route", exc))

    def _about_thread(
        self, state: MindState, cycle_state: dict[str, Any], request: str, vector: Any
    ) -> bool:
        """Whether the request is answered by what the user said earlier on the thread
        (graph.thread), recorded in ``cycle.thread``. Earlier messages that cannot be weighed
        leave only the request's own words to say so."""
        if settings.get_str("mind_thread") != "on":
            return False
        turns = thread.earlier_turns(state.get("messages") or [])
        if not turns:
            return False
        catalog_best = (cycle_state.get("grounding") or {}).get("best")
        bar = settings.get_float("mind_thread_bar")
        try:
            found = thread.probe(request, turns, vector, self.embedder().encode, catalog_best, bar)
        except Exception as exc:  # the encoder failed: the request's words alone decide
            _degrade(cycle_state, "route", "the thread's earlier messages", _failure("route", exc))
            found = thread.probe(request, turns, None, lambda texts: None, catalog_best, bar)
        cycle_state["thread"] = found.as_dict()
        return found.about_thread

    @staticmethod
    def _search(catalog: Any, query: str, n: int) -> tuple[list[Any], str]:
        """The ``n`` best passages for ``query``, and why they are in the catalog's order when
        reranking failed ("" otherwise): the catalog's best ten reranked by the sentence in
        each that best answers it (``mind_rerank``; graph.retrieval.rerank), or the catalog's
        own order. A failed reranking costs the order, never the passages."""
        from graph.retrieval import RERANK_POOL, rerank

        if settings.get_str("mind_rerank") != "on":
            return list(catalog.search(query, n, record=False)), ""
        hits = catalog.search(query, max(n, RERANK_POOL), record=False)
        try:
            return rerank(query, hits, catalog.embedder.encode)[:n], ""
        except Exception as exc:
            log.warning("reranking passages failed, keeping the catalog's order: %s", exc)
            return list(hits[:n]), f"{type(exc).__name__}: {exc}"[:300]  # kept in state

    @staticmethod
    def _fast_only(cycle_state: dict[str, Any]) -> bool:
        return cycle_state["depth"]["mode"] == "fast" and not cycle_state.get("compute")

    def decompose(self, state: MindState) -> dict[str, Any]:
        started = time.perf_counter()
        cycle_state = dict(state["cycle"])
        chosen = state["route"]["chosen"]
        metrics: list[dict[str, Any]] = []
        computing = [dict(COMPUTE_STEP, query=cycle_state["request"])]
        plan: list[dict[str, Any]] = []
        if cycle_state["depth"]["mode"] == "full":
            try:
                plan, attempts = self._plan(cycle_state, chosen, metrics)
                cycle_state["plan_attempts"] = attempts
            except Exception as exc:
                reason = _failure("decompose", exc)
                _degrade(cycle_state, "plan", "the plan", reason)
                cycle_state["depth"] = Depth("fast", "the plan failed twice").as_dict()
            if len(plan) == 1:
                cycle_state["depth"] = Depth("fast", "the plan has one step").as_dict()
        if cycle_state.get("compute") and not any(s["facet"] == "compute" for s in plan):
            plan = computing + plan
        update: dict[str, Any] = {"plan": plan, "status": "DELEGATING"}
        update.update(cycle=cycle_state, metrics=metrics)
        self._transition("decompose", cycle_state["id"], update, started)
        return update

    def _plan(
        self, cycle_state: dict[str, Any], chosen: list[str], metrics: list
    ) -> tuple[list[dict[str, str]], int]:
        p = prompts()
        request, cycle_id = cycle_state["request"], cycle_state["id"]
        lead, most = chosen[0], settings.get_int("mind_max_facets")
        available = facets_of(chosen)
        codex = load_codex()
        listed = "\n".join(
            f"- {name}: {codex.persona(name.split('.')[0]).role.split(':')[0]}; "
            f"{name.split('.facet_')[1].replace('_', ' ')}"
            for name in available
        )
        model = self.models(
            lead,
            format=plan_schema(list(available), most),
            temperature=0.2,
            num_predict=PLAN_TOKENS,
        )
        messages: list[BaseMessage] = [
            HumanMessage(p["plan"].format(most=most, facets=listed, request=request))
        ]
        reason = ""
        for attempt in (1, 2):
            reply, metric = self.call(model, messages, node="decompose", persona=lead)
            metrics.append(metric)
            try:
                raw = parse_plan(reply, available, most)
                plan = parse_plan(reply, available, most, request)
            except PlanRejected as exc:
                reason = str(exc)
                _emit("retry", cycle=cycle_id, node="decompose", attempt=attempt, reason=reason)
                messages += [AIMessage(reply), HumanMessage(p["plan_retry"].format(reason=reason))]
                continue
            cycle_state["plan_quality"] = {
                "raw": plan_quality(_raw_steps(reply), request).as_dict(),
                "final": plan_quality(plan, request).as_dict(),
                "kept": len(plan),
                "parsed": len(raw),
            }
            return plan, attempt
        raise MindError(f"{lead}'s plan was rejected twice: {reason}")

    def delegate(self, state: MindState) -> list[Send] | str:
        if state.get("failure"):
            return "fail"
        cycle_state = state["cycle"]
        steps = state["plan"]
        if cycle_state["depth"]["mode"] == "fast":
            steps = [s for s in steps if s["facet"] == "compute"]
        if not steps:
            return "synthesize"
        task_cycle = {k: cycle_state[k] for k in ("id", "request", "thread_id")}
        lead = state["route"]["chosen"][0]
        sends = []
        for i, step in enumerate(steps):
            task = {"cycle": task_cycle, "index": i, "step": step, "lead": lead}
            if step["facet"] == "compute":  # a program takes its figures from memory too
                task["passages"] = cycle_state.get("passages") or []
            sends.append(Send("facet", task))
        return sends

    def facet(self, task: dict[str, Any], config: RunnableConfig) -> dict[str, Any]:
        started = time.perf_counter()
        step, cycle_state = task["step"], task["cycle"]
        persona, selector, query = step["persona"], step["facet"], step["query"]
        metrics: list[dict[str, Any]] = []
        found: list[dict[str, Any]] = []
        partial: dict[str, Any] = {
            "index": task["index"],
            "persona": persona,
            "facet": selector,
            "query": query,
            "degraded": "",
        }
        try:
            if selector == "compute":
                self._compute(partial, metrics, task.get("passages") or [])
            else:
                found = self._facet(task, partial, metrics, config)
        except Exception as exc:
            failure = _failure("facet", exc)
            partial.update(ok=False, reason=failure["reason"], hint=failure["hint"])
            partial["degraded"] = "; ".join(filter(None, (partial["degraded"], failure["reason"])))
            found = []
        partial["seconds"] = round(time.perf_counter() - started, 4)
        update = {"partials": [partial], "effects": found, "metrics": metrics}
        _emit(
            "facet",
            cycle=cycle_state["id"],
            persona=persona,
            facet=selector,
            kind=partial.get("kind"),
            ok=partial.get("ok"),
            degraded=partial["degraded"] or None,
            seconds=partial["seconds"],
            tokens=sum(m["output_tokens"] for m in metrics),
        )
        return update

    def _facet(
        self, task: dict[str, Any], partial: dict[str, Any], metrics: list, config: RunnableConfig
    ) -> list[dict[str, Any]]:
        """One plan step: the facet's instruction (its method, or the fallback), then by who
        takes it: the lead's own steps become its answer's outline (no call of their own),
        BABS's bring passages from memory, another persona's are answered as a short note."""
        step, cycle_state, lead = task["step"], task["cycle"], task["lead"]
        persona, selector, query = step["persona"], step["facet"], step["query"]
        image = self.image(config)
        with image.connection() as conn:  # never committed: closing it aborts
            prepared = facets.prepare(
                conn.root(),
                persona,
                selector,
                query,
                models=self.authors,
                attempts=settings.get_int("jit_attempts"),
                cycle_id=cycle_state["id"],
                writers=self.writers,
                write=settings.get_str("mind_write_facets") == "inline",
                call=self._draft_call(persona, selector, metrics),
            )
        partial.update(degraded=prepared.degraded, wrote=prepared.written is not None)
        found = [prepared.written.effect()] if prepared.written is not None else []
        if persona == "BABS":  # BABS's facets answer from the catalog
            from graph.retrieval import passage

            catalog = self.searchable_catalog(image)
            shown = settings.get_int("mind_passages")
            hits: list[Any] = []
            failed = ""
            if catalog is not None:
                hits, failed = self._search(catalog, query, shown)
            if failed:
                partial["rerank_failed"] = failed
            partial["passages"] = [passage(h) for h in hits]
            if hits:
                found.append({"kind": "catalog_retrieved", "chunks": [h.chunk_id for h in hits]})
        if persona == lead:
            partial.update(ok=True, kind="instruction", text=prepared.instruction.text)
            return found
        if persona == "BABS":
            partial.update(ok=True, kind="passages", text="")
            return found
        options = {"num_predict": FACET_TOKENS, **prepared.instruction.options}
        text, metric = self.call(
            self.models(persona, **options),
            [
                HumanMessage(
                    prepared.instruction.text
                    + "\n\n"
                    + prompts()["facet_request"].format(request=cycle_state["request"])
                )
            ],
            node="facet",
            persona=persona,
            facet=selector,
        )
        metrics.append(metric)
        if metric["finish_reason"] == "length":
            text = answer.cut_at_sentence(text)
        partial.update(ok=True, kind="note", text=text)
        return found

    def _compute(self, partial: dict[str, Any], metrics: list, passages: list) -> None:
        """A program for the request, written by BRICK's author model and run in the
        sandbox, with the cycle's passages to take figures from."""
        persona, query = partial["persona"], partial["query"]

        def write(messages: list[BaseMessage]) -> str:
            model = self.authors(persona, temperature=0.0, num_predict=compute.PROGRAM_TOKENS)
            reply, metric = self.call(
                model, messages, node="facet:program", persona=persona, facet="compute"
            )
            metrics.append(metric)
            return reply

        facts = answer.passages_text(passages)
        copied = self._copied(query, passages, facts, metrics) if passages else None
        if copied is not None:
            if copied.ok:
                partial.update(
                    kind="computed",
                    ok=True,
                    text=copied.value,
                    program=copied.source,
                    operands=list(copied.figures),
                )
                return
            partial["figures"] = copied.reason
        result = compute.compute(query, write, facts)
        partial.update(
            kind="computed",
            ok=result.ok,
            text=result.value,
            program=result.source,
            operands=list(result.figures),
        )
        if not result.ok:
            partial["degraded"] = f"the program could not be run: {result.reason}"

    def _copied(
        self, query: str, passages: list, facts: str, metrics: list
    ) -> compute.Computed | None:
        """A difference or total worked out in code from figures BABS copies out of the
        passages (``mind_pairs``, ``mind_totals``); None when the question asks for neither
        or the setting is off. Copying figures is reading, which BABS does better than a
        program that must find them in the passages; figures that fail their checks leave
        the question to a program."""
        if compute.asks_difference(query) and settings.get_str("mind_pairs") == "on":
            work, schema, budget = compute.difference, compute.PAIR_SCHEMA, compute.PAIR_TOKENS
        elif compute.asks_total(query) and settings.get_str("mind_totals") == "on":
            work, schema, budget = compute.total, compute.TOTAL_SCHEMA, compute.TOTAL_TOKENS
        else:
            return None

        def read(messages: list[BaseMessage]) -> str:
            model = self.models(READER, format=schema, temperature=0.0, num_predict=budget)
            reply, metric = self.call(
                model, messages, node="facet:figures", persona=READER, facet="compute"
            )
            metrics.append(metric)
            return reply

        evidence = "\n\n".join(str(p["text"]) for p in passages)
        return work(query, facts, read, evidence)

    def _draft_call(self, persona: str, selector: str, metrics: list) -> facets.ModelCall:
        """A facet draft's model call, streamed and measured like every call of the cycle."""

        def ask(model: BaseChatModel, messages: list[BaseMessage]) -> str:
            reply, metric = self.call(
                model, messages, node="facet:draft", persona=persona, facet=selector
            )
            metrics.append(metric)
            return reply

        return ask

    def synthesize(self, state: MindState) -> dict[str, Any]:
        started = time.perf_counter()
        cycle_state = dict(state["cycle"])
        cycle_state["synthesis_attempts"] = attempt = cycle_state.get("synthesis_attempts", 0) + 1
        if attempt == 1:
            self._record_partials(state, cycle_state)
        update: dict[str, Any] = {"cycle": cycle_state}
        try:
            text, metric = self._synthesize(state, cycle_state, attempt)
            update.update(response=text, metrics=[metric], status="GATE")
        except Exception as exc:
            update.update(failure=_failure("synthesize", exc), status="FAILED")
        self._transition("synthesize", cycle_state["id"], update, started)
        return update

    @staticmethod
    def _record_partials(state: MindState, cycle_state: dict[str, Any]) -> None:
        """Each partial that did not serve as planned, in the cycle's record; and the
        passages of BABS's steps joined to the answer's."""
        partials = sorted(state.get("partials") or [], key=lambda x: x["index"])
        for x in partials:
            if x.get("degraded"):
                what = f"{x['persona']}.{x['facet']}"
                where = "compute" if x["facet"] == "compute" else "facet"
                _degrade(cycle_state, where, what, {"reason": x["degraded"]})
            if x.get("rerank_failed"):
                reason = {"reason": x["rerank_failed"]}
                _degrade(cycle_state, "retrieval", "the passages' order", reason)
        groups = [cycle_state.get("passages") or []]
        groups += [x.get("passages") or [] for x in partials]
        cycle_state["passages"] = answer.merged_passages([g for g in groups if g])

    def _synthesize(
        self, state: MindState, cycle_state: dict[str, Any], attempt: int
    ) -> tuple[str, dict[str, Any]]:
        p = prompts()
        request, chosen = cycle_state["request"], state["route"]["chosen"]
        lead = chosen[0]
        messages = history(state.get("messages") or [])
        partials = sorted(state.get("partials") or [], key=lambda x: x["index"])
        passages = cycle_state.get("passages") or []
        second_look = attempt > 1 and cycle_state.get("gate_second_look")
        if second_look:  # the first passages did not hold it: the next best ones, afresh
            passages = cycle_state["passages"] = cycle_state.get("more_passages") or passages
        shown = answer.focus(passages, request, settings.get_int("mind_passage_words"))
        quote_first = False
        asked = attempt > 1 and cycle_state.get("gate_asked")
        if asked:
            cycle_state.pop("evidence", None)  # the first answer's quote is not this one's
            # Sent back for not giving what its question asks for: asked afresh, on the same
            # passages, for that thing first (a small model asked to "answer directly" after
            # its own reply gives the same reply again).
            messages.append(HumanMessage(answer.grounded_asked_prompt(request, shown, asked)))
        elif partials:
            messages.append(HumanMessage(answer.answer_prompt(request, partials, shown)))
        elif passages:
            quote_first = settings.get_str("mind_quote_first") == "on"
            grounded = answer.grounded_quote_prompt if quote_first else answer.grounded_prompt
            messages.append(HumanMessage(grounded(request, shown)))
        elif _about_thread(cycle_state) and cycle_state["thread"]["why"] == "conversation":
            # A question about the conversation itself ("what was my first question?") gets
            # the user's messages listed in order: a small model does not count chat turns.
            turns = thread.earlier_turns(state.get("messages") or [])
            messages.append(HumanMessage(thread.said_prompt(request, turns)))
        else:
            messages.append(HumanMessage(request))
        options: dict[str, Any] = {"num_predict": ANSWER_TOKENS}
        if passages and not partials and settings.get_str("mind_grounded_sampling") == "greedy":
            options["temperature"] = 0.0
        elif not passages and not partials and _about_thread(cycle_state):
            options["temperature"] = 0.0  # the answer quotes the thread, not a sample of it
        if asked:
            options["temperature"] = 0.0
        elif attempt > 1 and not second_look:
            messages += [
                AIMessage(state.get("response") or ""),
                HumanMessage(p["retry"].format(reason=cycle_state.get("gate_reason", ""))),
            ]
            options["temperature"] = 0.3
        text, metric = self.call(
            self.models(lead, **options), messages, node="synthesize", persona=lead
        )
        if metric["finish_reason"] == "length":
            text = answer.cut_at_sentence(text)
            cycle_state["truncated"] = True
        if quote_first:
            # The user is given the answer; the sentence it stands on, and whether it is
            # really in the passages, go to the cycle's record.
            quoted = answer.split_quoted(text, shown)
            text = quoted.answer
            cycle_state["evidence"] = quoted.as_dict()
        from graph.retrieval import render_citations

        for key in ("recited", "attributed", "sourced"):  # what this answer's citations got
            cycle_state.pop(key, None)
        if passages:
            text = answer.unechoed(text, passages)
        if passages and not partials:
            text, moved = answer.recited(text, passages, request)
            if moved:
                cycle_state["recited"] = {"cited": moved[0], "holding": moved[1]}
            elif settings.get_str("mind_attribute") == "on":
                # An answer from passages that cites none is given the one stating it.
                text, attributed = answer.attributed(text, passages, request)
                if attributed:
                    cycle_state["attributed"] = attributed
        for x in partials:
            if passages and x.get("kind") == "computed" and x.get("ok") and x.get("operands"):
                # The result's figures came from known passages: the answer cites them.
                text, changed = answer.cite_sources(text, passages, x["operands"], x["text"])
                if changed:
                    cycle_state["sourced"] = {"dropped": changed[0], "added": changed[1]}
        if passages:
            text = answer.unlabelled(text)
        numbered = [{"n": n, **x} for n, x in enumerate(passages, start=1)]
        text, cited = render_citations(text, numbered)
        cycle_state["cited"] = [passages[n - 1]["citation"] for n in cited]
        return text, metric

    @staticmethod
    def _invented(state: MindState, cycle_state: dict[str, Any], response: str) -> list[str]:
        """Figures a fast answer from passages states that they do not give (``mind_figures``
        on; a cycle with partials has notes and programs to take figures from too)."""
        passages = cycle_state.get("passages") or []
        if not passages or state.get("partials") or settings.get_str("mind_figures") == "off":
            return []
        return answer.unsupported_figures(response, passages, cycle_state["request"])

    @staticmethod
    def _restated(state: MindState, cycle_state: dict[str, Any], response: str) -> bool:
        """Whether a fast answer from passages only echoes its request (its second try is
        given the same passages: they were found, the answer did not read them)."""
        if not cycle_state.get("passages") or state.get("partials"):
            return False
        if settings.get_str("mind_restates") == "off":
            return False
        return answer.restates(response, cycle_state["request"])

    @staticmethod
    def _unasked(state: MindState, cycle_state: dict[str, Any], response: str) -> str | None:
        """What a fast answer from passages was asked for and does not give while they do
        (``mind_asked`` on): a date, code, figure or name (graph.answer.unasked)."""
        passages = cycle_state.get("passages") or []
        if not passages or state.get("partials") or settings.get_str("mind_asked") == "off":
            return None
        return answer.unasked(response, cycle_state["request"], passages)

    def gate(self, state: MindState) -> dict[str, Any]:
        started = time.perf_counter()
        cycle_state = dict(state["cycle"])
        response = (state.get("response") or "").strip()
        cem = dict(state.get("cem") or {})
        reason = ""
        computed = next(
            (
                x
                for x in state.get("partials") or []
                if x.get("kind") == "computed" and x.get("ok") and x.get("text")
            ),
            None,
        )
        asked: str | None = None  # what the question asks for and the answer does not give
        try:
            response_vector, relevance = self._relevance(cycle_state, cem, response)
            threshold = settings.get_float("mind_relevance")
            repeats, most = repetition(response), settings.get_float("mind_repetition")
            if not response:
                reason = "the answer is empty"
            elif len(response) > MAX_ANSWER_CHARS:
                reason = f"the answer is {len(response):,} characters, over {MAX_ANSWER_CHARS:,}"
            elif REFUSAL.search(response):
                reason = "the answer is a refusal"
            elif repeats > most:
                reason = (
                    f"the answer repeats itself ({repeats:.0%} of its 4-word phrases occur "
                    f"earlier in it, over {most:.0%}): say each thing once"
                )
            elif cycle_state.get("more_passages") and answer.found_nothing(response):
                # Worth a second look, in the next best passages: an answer ranked sixth to
                # tenth is still in memory.
                reason = "the answer found nothing in the passages"
                cycle_state["gate_second_look"] = True
            elif self._restated(state, cycle_state, response):
                reason = (
                    "the answer only restates the question: say what the passages give as "
                    "its answer (the name, figure or date asked for)"
                )
                asked = self._unasked(state, cycle_state, response)
            elif asked := self._unasked(state, cycle_state, response):
                reason = f"the question asks {answer.ASKED_FOR[asked]}"
            elif computed and not compute.gives(response, computed["text"]):
                reason = (
                    f"the answer does not state what the program computed, {computed['text']}: "
                    "give that result first, and do not redo the arithmetic"
                )
            elif invented := self._invented(state, cycle_state, response):
                reason = (
                    f"the answer states {', '.join(invented[:4])}, which no passage gives: "
                    "give the figure the passages give, or, if you worked it out, the figures "
                    "of the passages it comes from"
                )
            elif threshold > -1 and relevance is not None and relevance < threshold:
                reason = f"the answer's relevance {relevance:.3f} is under {threshold}"
            cem.update(
                response_vector=None if response_vector is None else response_vector.tolist(),
                relevance=None if relevance is None else cycle.finite(relevance),
            )
            cycle_state["gate"] = {
                "passed": not reason,
                "reason": reason,
                "relevance": cem["relevance"],
                "repetition": round(repeats, 3),
            }
            update: dict[str, Any] = {"cycle": cycle_state, "cem": cem}
            first = cycle_state.pop("asked_first", None)
            if reason and cycle_state["synthesis_attempts"] < 2:
                cycle_state["gate_reason"] = reason
                if asked:  # the next answer is asked afresh for that thing
                    cycle_state["gate_asked"] = asked
                    cycle_state["asked_first"] = {
                        "response": response,
                        "cited": cycle_state.get("cited"),
                    }
                update["status"] = "SYNTHESIZING"
                _emit("retry", cycle=cycle_state["id"], node="gate", reason=reason)
            elif reason and first:
                # Asked again for what its question asks, the answer did no better: the first,
                # which failed only that check, is given (with its citations), and marked.
                _degrade(cycle_state, "gate", "the answer asked again", {"reason": reason})
                update["response"] = first["response"]
                cycle_state["cited"] = first["cited"]
                cycle_state["gate"]["kept_first"] = True
            elif reason and response:
                # An answer that failed twice is still the best this cycle can give: it is
                # given, and marked, rather than none at all.
                _degrade(cycle_state, "gate", "the answer", {"reason": reason})
                if computed and not compute.gives(response, computed["text"]):
                    # The result is known and checked; an answer that contradicts it is not
                    # given, the result and its program are.
                    update["response"] = compute.stated(computed["text"], computed["program"])
                elif len(response) > MAX_ANSWER_CHARS:
                    update["response"] = answer.cut_at_sentence(response[:MAX_ANSWER_CHARS])
            elif reason:
                update.update(
                    status="FAILED",
                    failure={
                        "node": "gate",
                        "reason": f"the answer failed the quality gate twice: {reason}",
                        "hint": "rephrase the request, or ask for more depth ('full')",
                    },
                )
        except Exception as exc:
            update = {"cycle": cycle_state, "failure": _failure("gate", exc), "status": "FAILED"}
        self._transition("gate", cycle_state["id"], update, started)
        return update

    def _relevance(
        self, cycle_state: dict[str, Any], cem: dict[str, Any], response: str
    ) -> tuple[Any, float | None]:
        """The answer's vector and its cosine with the request's; (None, None) when either
        cannot be had (the check is then skipped, and that is recorded)."""
        if not response:
            return None, None
        try:
            response_vector = self.embed(response)
        except Exception as exc:
            _degrade(cycle_state, "gate", "the relevance check", _failure("gate", exc))
            return None, None
        if cem.get("request_vector") is None:
            return response_vector, None
        request_vector = np.asarray(cem["request_vector"], dtype=np.float32)
        return response_vector, float(np.dot(request_vector, response_vector))

    def _carried_by_checkpointer(self, config: RunnableConfig) -> bool:
        """Whether this run's checkpointer applies COMPLETE's commit with its checkpoint.

        A graph assembled with a ``ZODBSaver`` always has it. A served graph gets its
        checkpointer from the server per run, and none at all for a stateless run (a run
        without a thread), so that is asked of the run itself. LangGraph has no public
        way to ask, hence its config key; it is read here as a yes or no only — the image
        always comes from whoever assembled the graph (``image``)."""
        if self._saver_image is not None:
            return True
        if not self.commits_with_checkpoint:
            return False
        from store.checkpoint.saver import ZODBSaver

        carrier = (config.get("configurable") or {}).get(CONFIG_KEY_CHECKPOINTER)
        # The LangGraph server hands its graphs the custom checkpointer inside an adapter of
        # its own, which passes puts and attributes through to the saver it holds.
        carrier = getattr(carrier, "_inner", carrier)
        return isinstance(carrier, ZODBSaver) and carrier.image is self.image(config)

    def complete(self, state: MindState, config: RunnableConfig) -> dict[str, Any]:
        started = time.perf_counter()
        cycle_state = dict(state["cycle"])
        commit = cycle.commit_for(state, cycle_state)
        self.writers.forget(cycle_state["id"])
        if not self._carried_by_checkpointer(config):
            # No saver to carry the commit: apply it here, as one transaction of its own.
            kinds = cycle.EFFECT_KINDS
            checked = effects.check(commit, kinds)
            where = (cycle_state["thread_id"], "", "")
            self.image(config).transact(
                lambda root: effects.apply_commit(root, checked, where, kinds),
                note=commit["note"],
            )
        lead = state["route"]["chosen"][0]
        message = AIMessage(
            state["response"],
            name=lead.lower(),
            additional_kwargs={"batos_cycle": cycle_state["id"]},
        )
        update = {"status": "COMPLETE", "commit": commit, "messages": [message], "feedback": None}
        self._transition("complete", cycle_state["id"], update, started)
        return update

    def fail(self, state: MindState) -> dict[str, Any]:
        started = time.perf_counter()
        cycle_state = state.get("cycle") or {}
        failure = state.get("failure") or {"node": "?", "reason": "unknown", "hint": ""}
        self.writers.forget(cycle_state.get("id", ""))
        _emit(
            "abort",
            cycle=cycle_state.get("id"),
            thread=cycle_state.get("thread_id"),
            node=failure["node"],
            reason=failure["reason"],
            discarded_effects=len(state.get("effects") or []),
        )
        text = f"I could not answer: {failure['reason']}"
        if failure.get("hint"):
            text += f" (hint: {failure['hint']})"
        update: dict[str, Any] = {
            "status": "FAILED",
            "effects": {"replace": []},
            "commit": None,
            "messages": [AIMessage(text, additional_kwargs={"batos_failed": True})],
        }
        self._transition("fail", cycle_state.get("id"), update, started)
        return update

    # -- edges ------------------------------------------------------------------------------

    def after_route(self, state: MindState) -> str:
        if state.get("failure"):
            return "fail"
        return "synthesize" if self._fast_only(state["cycle"]) else "decompose"

    @staticmethod
    def after_synthesize(state: MindState) -> str:
        return "fail" if state.get("failure") else "gate"

    @staticmethod
    def after_gate(state: MindState) -> str:
        if state.get("failure"):
            return "fail"
        return "synthesize" if state.get("status") == "SYNTHESIZING" else "complete"

    def _transition(
        self, node: str, cycle_id: str | None, update: dict[str, Any], started: float
    ) -> None:
        metrics = update.get("metrics")
        metrics = metrics if isinstance(metrics, list) else []
        _emit(
            "transition",
            cycle=cycle_id,
            node=node,
            to=update.get("status"),
            seconds=round(time.perf_counter() - started, 4),
            model_seconds=round(sum(m["seconds"] for m in metrics), 4),
            input_tokens=sum(m["input_tokens"] for m in metrics),
            output_tokens=sum(m["output_tokens"] for m in metrics),
            failure=(update.get("failure") or {}).get("reason"),
        )


def _about_thread(cycle_state: dict[str, Any]) -> bool:
    return bool((cycle_state.get("thread") or {}).get("about_thread"))


def _short_or_one_question(request: str) -> bool:
    """Whether a request about memory needs no plan: it is short, or it is one question
    however it sets the scene ("If I go to every home game left this season, how much does a
    half-season ticket save me…?": 31 words, one question). A plan of such a question split
    one reading of the passages into steps and wove an answer about none of them."""
    words = len(request.split())
    if words <= GROUNDED_FAST_WORDS:
        return True
    text = request.strip()
    return words <= GROUNDED_QUESTION_WORDS and text.endswith("?") and text.count("?") == 1


def _degrade(cycle_state: dict[str, Any], where: str, what: str, failure: dict[str, Any]) -> None:
    """Record that ``what`` did not serve as planned (the cycle goes on without it).

    The same part failing for the same reason again (one facet used by three plan steps) is
    one entry whose ``times`` counts it: the record says what went wrong, not how often it
    was repeated line by line."""
    entry = {"where": where, "what": what, "reason": str(failure.get("reason") or "")[:500]}
    _emit("degraded", cycle=cycle_state.get("id"), **entry)
    entries = list(cycle_state.get("degraded") or [])
    for i, seen in enumerate(entries):
        if {k: seen.get(k) for k in entry} == entry:
            # bounded like the record's field: a count past it says no more than "often"
            entries[i] = {**seen, "times": min(int(seen.get("times", 1)) + 1, 64)}
            break
    else:
        entries.append(entry)
    cycle_state["degraded"] = entries


def _raw_steps(reply: str) -> list[dict[str, str]]:
    """The steps of a plan reply as the model wrote them (for measuring plans), or none."""
    try:
        data = strict_json(reply.strip(), strict=False)
    except (ValueError, RecursionError):
        return []
    steps = data.get("steps") if isinstance(data, dict) else None
    return [s for s in steps if isinstance(s, dict)] if isinstance(steps, list) else []
