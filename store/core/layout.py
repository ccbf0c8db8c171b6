"""The image's top-level layout: every key of the root, once, and the one way to reach each.

Only the store knows the root's keys. Each is named here and reached through an accessor that
returns what the key holds and creates nothing: containers are made by upgrade steps
(``UpgradeStep``, applied by ``store.core.schema.upgrade``), never on first use, so a transaction
that records something never changes the root and stays undoable after later ones. An accessor on an
image that was never brought up to date raises ``ImageError`` saying so; ``find`` is for readers
that take a missing container as empty.

The steps that lay out the containers named here (the root's own: objects, the graph's records,
the kernel's queues) are ``ROOT_STEPS``; the checkpointer and the knowledge engine declare the
steps of the keys they hold inside, and ``store.upgrades`` puts the store's steps in order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from BTrees.IOBTree import IOBTree
from BTrees.OOBTree import OOBTree
from persistent.mapping import PersistentMapping

from batos.errors import ImageError


@dataclass(frozen=True)
class UpgradeStep:
    """One change to the image's layout; ``apply(root)`` must be safe on any earlier layout."""

    name: str
    description: str
    apply: Callable[[Any], object]  # what it returns is not used


#: The record of applied upgrade steps (``store.core.schema``).
SCHEMA = "schema"
#: Named top-level objects (personas, traits, the toolbox): name → ``UvmObject``.
OBJECTS = "objects"
#: The checkpointer's ``CheckpointTree`` (``store.checkpoint.layout``).
CHECKPOINTS = "checkpoints"
#: Commit ids the checkpointer applied: id → (time, thread_id, ns, checkpoint_id).
APPLIED_COMMITS = "applied_commits"
#: The knowledge catalog's mapping (``store.knowledge.catalog``).
CATALOG = "catalog"
#: LangGraph's long-term memory store: namespace → key → item.
MEMORY = "memory"
#: Methods the kernel is to write ahead of time: key → state.
METHOD_QUEUE = "method_queue"
#: The heartbeat's jobs (``jobs``: id → record) and its ``lease``.
HEARTBEAT = "heartbeat"
#: Methods the kernel took out: record number → plain dict.
REJECTED_METHODS = "rejected_methods"
#: Committed mind cycles: cycle id → plain record.
CYCLES = "cycles"
#: The trained router as plain data (one value, replaced whole on training).
ROUTER = "router"
#: Persona → offset added to its routing logit.
ROUTER_PRIORS = "router_priors"
#: Self-improvement missions: number → plain record.
MISSIONS = "missions"
#: Audit reports: number → plain record.
AUDIT_REPORTS = "audit_reports"
#: Lessons from accepted cycles: persona → (cycle id → lesson).
LESSONS = "lessons"
#: The persona adapter versions served: "<model>/<persona>" → {"sha256", "mission", …}.
ADAPTERS = "adapters"

#: Every top-level key of the image.
KEYS = (
    SCHEMA,
    OBJECTS,
    CHECKPOINTS,
    APPLIED_COMMITS,
    CATALOG,
    MEMORY,
    METHOD_QUEUE,
    HEARTBEAT,
    REJECTED_METHODS,
    CYCLES,
    ROUTER,
    ROUTER_PRIORS,
    MISSIONS,
    AUDIT_REPORTS,
    LESSONS,
    ADAPTERS,
)


def find(root: Any, key: str) -> Any | None:
    """What ``key`` holds, or None in an image that has no such container (reading only)."""
    return root.get(key)


def need(root: Any, key: str) -> Any:
    """What ``key`` holds; ``ImageError`` if the image was never laid out for it."""
    found = root.get(key)
    if found is None:
        raise ImageError(
            f"the image has no {key!r} yet: it was opened without its upgrade steps",
            hint="open it with batos.shell.runtime.open_runtime() or run 'batos init'",
        )
    return found


def objects(root: Any) -> Any:
    return need(root, OBJECTS)


def checkpoints(root: Any) -> Any:
    return need(root, CHECKPOINTS)


def applied_commits(root: Any) -> Any:
    return need(root, APPLIED_COMMITS)


def catalog(root: Any) -> Any:
    return need(root, CATALOG)


def memory(root: Any) -> Any:
    return need(root, MEMORY)


def method_queue(root: Any) -> Any:
    return need(root, METHOD_QUEUE)


def heartbeat(root: Any) -> Any:
    return need(root, HEARTBEAT)


def rejected_methods(root: Any) -> Any:
    return need(root, REJECTED_METHODS)


def cycles(root: Any) -> Any:
    return need(root, CYCLES)


def router_priors(root: Any) -> Any:
    return need(root, ROUTER_PRIORS)


def missions(root: Any) -> Any:
    return need(root, MISSIONS)


def audit_reports(root: Any) -> Any:
    return need(root, AUDIT_REPORTS)


def lessons(root: Any) -> Any:
    return need(root, LESSONS)


def adapters(root: Any) -> Any:
    return need(root, ADAPTERS)


def router_record(root: Any) -> Any | None:
    """The trained router's record, or None before the first training."""
    return root.get(ROUTER)


def set_router_record(root: Any, record: Any) -> None:
    """Replace the router's record (a value, not a container: training writes it whole)."""
    root[ROUTER] = record


def _add(root: Any, key: str, make: type) -> None:
    if root.get(key) is None:
        root[key] = make()


def _heartbeat(root: Any) -> None:
    _add(root, HEARTBEAT, PersistentMapping)
    if "jobs" not in root[HEARTBEAT]:
        root[HEARTBEAT]["jobs"] = OOBTree()


def _records(root: Any) -> None:
    _add(root, CYCLES, OOBTree)
    _add(root, MISSIONS, IOBTree)
    _add(root, ROUTER_PRIORS, PersistentMapping)
    _add(root, AUDIT_REPORTS, IOBTree)
    _add(root, LESSONS, PersistentMapping)
    _add(root, ADAPTERS, PersistentMapping)


def _kernel(root: Any) -> None:
    _add(root, METHOD_QUEUE, OOBTree)
    _add(root, REJECTED_METHODS, OOBTree)
    _add(root, APPLIED_COMMITS, OOBTree)
    _heartbeat(root)


ROOT_STEPS: tuple[UpgradeStep, ...] = (
    UpgradeStep(
        "root-1",
        "registry of named top-level objects (root['objects'], an OOBTree)",
        lambda root: _add(root, OBJECTS, OOBTree),
    ),
    UpgradeStep(
        "root-2",
        "the containers the kernel, the checkpointer's commits and the heartbeat fill "
        "(method queue, rejected methods, applied commits, heartbeat jobs), made up front",
        _kernel,
    ),
    UpgradeStep(
        "records-1",
        "the records of the mind and the heartbeat (cycles, missions, router priors, audit "
        "reports, lessons, served adapter versions), made up front",
        _records,
    ),
)
