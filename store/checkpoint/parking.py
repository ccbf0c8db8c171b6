"""Writes for checkpoints not stored yet, held in memory until their put stores them.

``ZODBSaver`` keeps one ``ParkedWrites``: a put_writes whose checkpoint is not in the image
parks here, and the put of that checkpoint takes them into its own transaction.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict

from store.checkpoint.layout import TaskWrites

log = logging.getLogger("batos.checkpointer")

#: Seconds writes for a checkpoint not stored yet wait for its put. A put normally follows
#: within milliseconds; one that never comes (an earlier put of the run failed) must not pin
#: memory forever.
PARKED_SECONDS = 600.0
#: Checkpoints whose writes may wait at once (and failed puts remembered); the oldest go first.
MAX_PARKED = 4096

#: (thread_id, checkpoint_ns, checkpoint_id)
CheckpointKey = tuple[str, str, str]


class ParkedWrites:
    """Writes for checkpoints whose put has not been stored yet, held until it is.

    LangGraph hands a step's put and its tasks' put_writes to a thread pool, so a task's writes
    often arrive before the put of their checkpoint. Stored at once they would belong to a
    checkpoint that may never exist (its put can still fail). Held here, they are stored by the
    put itself, in its one transaction, or dropped if it fails. A crash loses them together
    with their checkpoint, and no run can resume from a checkpoint that was never stored.

    A put_writes reads ``generation`` (puts stored so far), then looks for its checkpoint in
    the image, and parks only if it is not there. A put marks its checkpoint as under way
    before its transaction and stamps it with the new generation after it, both under the lock
    ``park`` takes. So a put that commits between the look and the park is never missed (its
    stamp is newer than what the writer read: look again), and a checkpoint stored before the
    look but not found by it was deleted since (drop the writes). Stamps are kept for the last
    MAX_PARKED puts; a writer that waited longer than that looks again.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._parked: OrderedDict[CheckpointKey, tuple[float, list[TaskWrites]]] = OrderedDict()
        self._putting: Counter[CheckpointKey] = Counter()
        self._failed: OrderedDict[CheckpointKey, None] = OrderedDict()
        self._stored: OrderedDict[CheckpointKey, int] = OrderedDict()
        self._generation = 0

    def begin_put(self, key: CheckpointKey) -> list[TaskWrites]:
        """Mark ``key``'s put as under way and hand it the writes parked for it."""
        with self._cond:
            self._putting[key] += 1
            self._failed.pop(key, None)
            entry = self._parked.pop(key, None)
        return entry[1] if entry else []

    def end_put(self, key: CheckpointKey, *, stored: bool) -> None:
        with self._cond:
            self._putting[key] -= 1
            if not self._putting[key]:
                del self._putting[key]
            if stored:
                self._generation += 1
                self._stored[key] = self._generation
                self._stored.move_to_end(key)
                if len(self._stored) > MAX_PARKED:
                    self._stored.popitem(last=False)
            else:
                self._forget(key)
            self._cond.notify_all()

    def put_failed(self, key: CheckpointKey) -> None:
        """``key``'s put failed before it began: drop its writes, now and when they come."""
        with self._cond:
            self._forget(key)

    def settle(self, key: CheckpointKey) -> int | None:
        """Wait out a put of ``key`` under way; None if puts of ``key`` failed, else the
        generation to hand to ``park``."""
        with self._cond:
            while key in self._putting:
                self._cond.wait()
            return None if key in self._failed else self._generation

    def park(self, key: CheckpointKey, writes: TaskWrites, generation: int) -> bool:
        """Hold ``writes`` for ``key``'s put, or drop them; False if that put began or was
        stored since ``generation`` was read (before looking): look in the image again."""
        with self._cond:
            stamp = self._stored.get(key)
            if key in self._failed or (stamp is not None and stamp <= generation):
                return True  # dropped: the put failed, or the checkpoint was deleted since
            if (
                key in self._putting
                or stamp is not None
                or self._generation - generation >= MAX_PARKED
            ):
                return False
            now = time.monotonic()
            entry = self._parked.get(key)
            if entry is None:
                self._parked[key] = (now, [writes])
            else:
                entry[1].append(writes)
            self._expire(now)
            return True

    def drop_thread(self, thread_id: str) -> None:
        with self._cond:
            for key in [k for k in self._parked if k[0] == thread_id]:
                del self._parked[key]

    def parked(self) -> int:
        with self._cond:
            return len(self._parked)

    def _forget(self, key: CheckpointKey) -> None:
        self._parked.pop(key, None)
        self._stored.pop(key, None)
        self._failed[key] = None
        while len(self._failed) > MAX_PARKED:
            self._failed.popitem(last=False)

    def _expire(self, now: float) -> None:
        while self._parked:
            key, (since, _) = next(iter(self._parked.items()))
            if len(self._parked) <= MAX_PARKED and now - since < PARKED_SECONDS:
                return
            del self._parked[key]
            log.warning(
                "dropped writes for checkpoint %s of thread %r: its put never came", key[2], key[0]
            )
