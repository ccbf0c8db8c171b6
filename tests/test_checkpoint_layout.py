"""The checkpoint layout: records in msgpack, the bucket of newest ids, one write connection.

What a put writes and reads is checked on real storages (the objects of each transaction, the
loads of a connection), not on mocks; old layouts are written as the code of their time wrote
them and read back.
"""

from __future__ import annotations

import io
import pickle
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from images import open_laid_out
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint
from persistent import Persistent
from ZODB.ConflictResolution import PersistentReference
from ZODB.POSException import ConflictError, POSKeyError
from ZODB.utils import get_pickle_metadata, p64

from batos import metrics
from batos.errors import ImageCorruptError
from store.checkpoint.layout import (
    RECENT,
    RECORD_FORMAT,
    CheckpointIndex,
    CheckpointRecord,
    OlderCheckpoints,
)
from store.checkpoint.saver import ZODBSaver
from store.core import layout
from store.core.image import LivingImage
from store.core.schema import SCHEMA_KEY, applied


def cfg(thread: str, **extra: Any) -> dict:
    return {"configurable": {"thread_id": thread, "checkpoint_ns": "", **extra}}


def put_chain(saver: ZODBSaver, thread: str, count: int) -> list[dict]:
    """``count`` checkpoints of ``thread``, each continuing the one before, small values."""
    configs, config = [], cfg(thread)
    for step in range(count):
        checkpoint = generate_checkpoint(
            channel_values={"n": step}, channel_versions={"n": str(step + 1)}
        )
        config = saver.put(config, checkpoint, {"step": step}, {"n": str(step + 1)})
        configs.append(config)
    return configs


def history(saver: ZODBSaver, thread: str) -> list[tuple]:
    return [
        (c.config, c.checkpoint, c.metadata, c.parent_config, sorted(c.pending_writes or []))
        for c in saver.list(cfg(thread))
    ]


def last_transaction_classes(image: LivingImage) -> Counter:
    """The classes of the objects the image's newest transaction wrote."""
    storage = image.db.storage
    [last] = [list(txn) for txn in storage.iterator(start=storage.lastTransaction())]
    return Counter(".".join(get_pickle_metadata(record.data)) for record in last)


def raw_state(image: LivingImage, obj: Persistent) -> Any:
    """An object's state as stored (persistent references left as ids), not as loaded."""
    data, _ = image.db.storage.load(obj._p_oid)
    unpickler = pickle.Unpickler(io.BytesIO(data))
    unpickler.persistent_load = lambda ref: ref
    unpickler.load()  # the class
    return unpickler.load()


@pytest.fixture
def file_saver(file_uri: str) -> Iterator[ZODBSaver]:
    with open_laid_out(file_uri) as image, ZODBSaver(image) as saver:
        yield saver


# -- what a put writes -------------------------------------------------------------------

RECORD = "store.checkpoint.layout.CheckpointRecord"
INDEX = "store.checkpoint.layout.CheckpointIndex"


def test_a_put_writes_its_record_and_the_bucket_of_newest_ids(file_saver: ZODBSaver) -> None:
    put_chain(file_saver, "long", 3)
    written = []
    config = file_saver.get_tuple(cfg("long")).config
    for step in range(3, 3 + 6 * RECENT):
        checkpoint = generate_checkpoint(
            channel_values={"n": step}, channel_versions={"n": str(step + 1)}
        )
        config = file_saver.put(config, checkpoint, {"step": step}, {"n": str(step + 1)})
        written.append(last_transaction_classes(file_saver.image))
    plain = Counter({RECORD: 1, INDEX: 1})
    # the namespace's tree is written once in RECENT puts (when the bucket holds 2 * RECENT
    # ids), with the ids that move into it; every other put writes two objects
    moves = len(range(2 * RECENT, 3 + 6 * RECENT + 1, RECENT))
    assert sum(w != plain for w in written) == moves
    assert all(w[RECORD] == 1 and w[INDEX] == 1 for w in written)
    assert len(list(file_saver.list(cfg("long")))) == 3 + 6 * RECENT
    # the bucket refers to its newest record only: ids, the newest record, the tree
    with file_saver._reading() as tree:
        index = tree.threads["long"].namespaces[""]
        ids, newest, older = raw_state(file_saver.image, index)
        assert isinstance(ids, bytes) and len(index._ids) >= RECENT
        assert newest[0] == index.get(index.maxKey())._p_oid and older[0] == index.older._p_oid


def test_a_long_thread_keeps_the_nodes_of_its_tree_small(file_saver: ZODBSaver) -> None:
    configs = put_chain(file_saver, "long", 80 * RECENT)
    with file_saver._reading() as tree:
        older = tree.threads["long"].namespaces[""].older
        assert isinstance(older, OlderCheckpoints) and len(older) == 79 * RECENT
        children = older.__getstate__()[0][::2]
        # what a leaf's split rewrites: a node of at most 16 children (the root 32), not 250
        assert 1 < len(children) < 2 * OlderCheckpoints.max_internal_size
        assert all(isinstance(child, OlderCheckpoints) for child in children)
    assert file_saver.get_tuple(configs[5]).metadata["step"] == 5


def test_put_writes_rewrites_only_its_record(file_saver: ZODBSaver) -> None:
    config = put_chain(file_saver, "w", 2 * RECENT + 3)[RECENT]  # one in the tree of older ids
    file_saver.put_writes(config, [("ch", "late")], "task")
    assert last_transaction_classes(file_saver.image) == Counter({RECORD: 1})
    assert file_saver.get_tuple(config).pending_writes == [("task", "ch", "late")]


def test_latest_is_read_without_loading_the_tree_of_older_ids(file_uri: str) -> None:
    with open_laid_out(file_uri) as image, ZODBSaver(image) as saver:
        configs = put_chain(saver, "t", 5 * RECENT)
    with open_laid_out(file_uri) as image, ZODBSaver(image) as saver:
        latest = saver.get_tuple(cfg("t"))
        named = latest.config["configurable"]["checkpoint_id"]
        assert named == configs[-1]["configurable"]["checkpoint_id"]
        assert latest.metadata["step"] == 5 * RECENT - 1
        with saver._reading(writer=True) as tree:
            index = tree.threads["t"].namespaces[""]
            assert isinstance(index, CheckpointIndex) and index.older is not None
            assert index.older._p_changed is None  # still a ghost: never loaded
        assert saver.get_tuple(configs[0]).metadata["step"] == 0  # from the tree of older ids
        assert [c.config for c in saver.list(cfg("t"))] == configs[::-1]
        before = {"configurable": {**configs[RECENT]["configurable"]}}
        assert [c.config for c in saver.list(cfg("t"), before=before)] == configs[:RECENT][::-1]


def test_puts_of_past_ids_keep_the_newest_in_the_bucket(file_saver: ZODBSaver) -> None:
    configs = put_chain(file_saver, "p", 3 * RECENT)
    with file_saver._reading() as tree:
        index = tree.threads["p"].namespaces[""]
        past = index.keys()[1]
    old = file_saver.get_tuple(cfg("p", checkpoint_id=past))
    file_saver.put(
        cfg("p", checkpoint_id=old.parent_config["configurable"]["checkpoint_id"]),
        old.checkpoint,
        {"step": -5},
        {},
    )
    with file_saver._reading() as tree:
        index = tree.threads["p"].namespaces[""]
        assert index.maxKey() == configs[-1]["configurable"]["checkpoint_id"]
        assert past in index.older and past not in index._ids
        assert index._ids[0] > index.older.maxKey()
        assert_chain(index)
    assert file_saver.get_tuple(cfg("p", checkpoint_id=past)).metadata["step"] == -5


def assert_chain(index: CheckpointIndex) -> None:
    """Each record refers to the record of the next older id, or (in the tree, and the
    oldest of the bucket) to none: never to a record the namespace no longer holds."""
    items = index.items()
    assert [key for key, _ in items] == index.keys() == sorted(index.keys())
    recent = set(index._ids)
    for position, (checkpoint_id, record) in enumerate(items):
        assert record.checkpoint_id in (None, checkpoint_id)
        before = items[position - 1][1] if position else None
        if checkpoint_id in recent and checkpoint_id != index._ids[0]:
            assert record.previous is before
        else:
            assert record.previous is None or record.previous is before


def test_the_chain_of_records_survives_every_change(file_saver: ZODBSaver) -> None:
    saver = file_saver
    configs = put_chain(saver, "c", 4 * RECENT)
    ids = [c["configurable"]["checkpoint_id"] for c in configs]

    def index(thread: str = "c") -> CheckpointIndex:
        with saver._reading() as tree:
            return tree.threads[thread].namespaces[""]

    def put_again(checkpoint_id: str, step: int) -> None:
        found = saver.get_tuple(cfg("c", checkpoint_id=checkpoint_id))
        saver.put(found.parent_config, found.checkpoint, {"step": step}, {})

    assert_chain(index())
    assert index()._ids == ids[-RECENT:]
    put_again(ids[-3], 100)  # replaced in the bucket
    put_again(ids[2], 101)  # replaced in the tree
    assert_chain(index())
    # dropped from the tree, the oldest of the bucket, the middle and the newest of it
    for position in (1, 2 * RECENT, 3 * RECENT, len(ids) - 2, len(ids) - 1):
        saver._write(
            lambda tree, drop=ids[position]: tree.threads["c"].drop_checkpoint("", drop),
            f"drop {position}",
        )
        assert saver.get_tuple(cfg("c", checkpoint_id=ids[position])) is None
        assert_chain(index())
    steps = [c.metadata["step"] for c in saver.list(cfg("c"))]
    assert len(steps) == len(ids) - 5 and 100 in steps and 101 in steps
    assert saver.get_tuple(cfg("c")).metadata["step"] == 100  # ids[-3] is the newest now
    assert saver.trim(["c"], keep=RECENT + 1) == len(ids) - 5 - (RECENT + 1)
    assert_chain(index())
    saver.copy_thread("c", "copy")
    assert_chain(index("copy"))
    assert [c.checkpoint for c in saver.list(cfg("copy"))] == [
        c.checkpoint for c in saver.list(cfg("c"))
    ]


def test_pack_frees_the_records_of_deleted_checkpoints(file_uri: str) -> None:
    with open_laid_out(file_uri) as image, ZODBSaver(image) as saver:
        configs = put_chain(saver, "p", 5 * RECENT)
        with saver._reading() as tree:
            oids = {key: record._p_oid for key, record in tree.threads["p"].namespaces[""].items()}
        saver.trim(["p"], keep=3)
        image.db.pack()
        kept = {c["configurable"]["checkpoint_id"] for c in configs[-3:]}
        for checkpoint_id, oid in oids.items():
            if checkpoint_id in kept:
                image.db.storage.load(oid)
            else:
                with pytest.raises(POSKeyError):  # unreachable, so packed away
                    image.db.storage.load(oid)
        assert [c.config for c in saver.list(cfg("p"))] == configs[-3:][::-1]


# -- one write connection, no empty transactions -----------------------------------------


def test_every_write_of_a_saver_goes_through_one_connection(file_uri: str) -> None:
    with open_laid_out(file_uri) as image, ZODBSaver(image) as saver:
        opened = []
        open_ = image.db.open

        def counting_open(*args: Any, **kwargs: Any) -> Any:
            conn = open_(*args, **kwargs)
            opened.append(conn)
            return conn

        image.db.open = counting_open
        put_chain(saver, "first", 1)
        [writer] = opened
        writer.getTransferCounts(clear=True)
        configs = put_chain(saver, "one", 20)
        for step, config in enumerate(configs):
            saver.put_writes(config, [("ch", step)], f"task-{step}")
            assert saver.get_tuple(config).pending_writes == [(f"task-{step}", "ch", step)]
        assert opened == [writer]  # reads borrowed the write connection: it was free
        loads, stores = writer.getTransferCounts()
        assert loads == 0 and stores >= 60  # every read found what the puts wrote in its cache

        # threads at once: writes take turns on the one connection, reads use the pool
        def work(k: int) -> None:
            put_chain(saver, f"thread-{k}", 10)

        workers = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        assert all(len(list(saver.list(cfg(f"thread-{k}")))) == 10 for k in range(4))
        assert opened[0] is writer and writer not in opened[1:]


def counters() -> dict:
    return {name: value for name, _, value in metrics.snapshot()["counters"]}


def test_writes_before_their_put_commit_nothing(file_saver: ZODBSaver) -> None:
    stored = put_chain(file_saver, "early", 1)[0]
    checkpoint = generate_checkpoint(channel_values={"n": 1}, channel_versions={"n": "2"})
    early = cfg("early", checkpoint_id=checkpoint["id"])
    before, log = counters(), len(file_saver.image.db.undoLog(0, 1000))
    file_saver.put_writes(early, [("ch", "a")], "task-1")
    file_saver.put_writes(stored, [("ch", "b")], "task-2")
    after_one = counters()
    file_saver.put_writes(stored, [("ch", "b")], "task-2")  # a retried task: stored already
    assert counters() == after_one
    assert after_one.get("transactions_committed", 0) == before.get("transactions_committed", 0) + 1
    assert after_one.get("transactions_aborted", 0) == before.get("transactions_aborted", 0)
    assert len(file_saver.image.db.undoLog(0, 1000)) == log + 1
    file_saver.put(stored, checkpoint, {}, {"n": "2"})
    assert file_saver.get_tuple(early).pending_writes == [("task-1", "ch", "a")]


# -- records: msgpack, old ones read ---------------------------------------------------


def test_records_are_stored_as_msgpack_with_references_to_large_values(
    file_saver: ZODBSaver,
) -> None:
    config = put_chain(file_saver, "m", 1)[0]
    big = generate_checkpoint(channel_values={"big": "x" * 5000}, channel_versions={"big": "1"})
    config = file_saver.put(config, big, {}, {"big": "1"})
    file_saver.put_writes(config, [("ch", "y" * 5000), ("ch", 1)], "task")
    with file_saver._reading() as tree:
        record = tree.threads["m"].namespaces[""].get(config["configurable"]["checkpoint_id"])
        state = raw_state(file_saver.image, record)
    version, data, refs, writes, write_refs, previous = state
    assert version == RECORD_FORMAT and isinstance(data, bytes) and isinstance(writes, bytes)
    assert previous is not None  # the record of the checkpoint before it
    assert len(refs) == 1 and len(write_refs) == 1  # the two large values, in records of their own
    found = file_saver.get_tuple(config)
    assert found.checkpoint["channel_values"]["big"] == "x" * 5000
    assert found.pending_writes == [("task", "ch", "y" * 5000), ("task", "ch", 1)]


def write_layout_3(image: LivingImage, monkeypatch: pytest.MonkeyPatch) -> None:
    """Turn the image's threads back into layout 3: each namespace one tree of records, each
    record its attributes pickled, as the code before ``checkpoints-4`` stored them."""
    from BTrees.OOBTree import OOBTree

    with monkeypatch.context() as patch:
        patch.setattr(CheckpointRecord, "__getstate__", Persistent.__getstate__)

        def downgrade(root: Any) -> None:
            for thread in root[layout.CHECKPOINTS].threads.values():
                for ns, index in list(thread.namespaces.items()):
                    tree = OOBTree()
                    for checkpoint_id, record in index.items():
                        record._p_changed = True
                        tree[checkpoint_id] = record
                    thread.namespaces[ns] = tree
            del root[SCHEMA_KEY]["checkpoints-4"]

        image.transact(downgrade)


def test_layout_3_image_gets_its_bucket_of_newest_ids_and_reads_the_same(
    file_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open_laid_out(file_uri) as image, ZODBSaver(image) as saver:
        configs = put_chain(saver, "old", 3 * RECENT)
        saver.put_writes(configs[-1], [("ch", "pending")], "task")
        saver.put_writes(configs[2], [("ch", "x" * 2000)], "task")
        put_chain(saver, "short", 3)
        expected = {thread: history(saver, thread) for thread in ("old", "short")}
        write_layout_3(image, monkeypatch)
    with LivingImage.open(file_uri) as image:
        with image.read() as root:
            assert "checkpoints-4" not in applied(root)
            old = root[layout.CHECKPOINTS].threads["old"].namespaces[""]
            assert type(old).__name__ == "OOBTree"
            assert isinstance(raw_state(image, old[old.maxKey()]), dict)  # pickled attributes
    with open_laid_out(file_uri) as image, ZODBSaver(image) as saver:
        with image.read() as root:
            assert "checkpoints-4" in applied(root)
            index = root[layout.CHECKPOINTS].threads["old"].namespaces[""]
            assert isinstance(index, CheckpointIndex)
            assert index._ids == [c["configurable"]["checkpoint_id"] for c in configs][-RECENT:]
            assert_chain(index)
            assert isinstance(index.older, OlderCheckpoints) and len(index.older) == 2 * RECENT
            assert len(root[layout.CHECKPOINTS].threads["short"].namespaces[""].older or ()) == 0
        assert {thread: history(saver, thread) for thread in expected} == expected
        # an old record changes: it is stored in the new form, and reads the same
        saver.put_writes(configs[-1], [("ch", "more")], "task-2")
        with saver._reading() as tree:
            record = (
                tree.threads["old"].namespaces[""].get(configs[-1]["configurable"]["checkpoint_id"])
            )
            assert raw_state(image, record)[0] == RECORD_FORMAT
        assert saver.get_tuple(configs[-1]).pending_writes == [
            ("task", "ch", "pending"),
            ("task-2", "ch", "more"),
        ]
        more = put_chain(saver, "old", 2)  # new checkpoints go into the bucket
        assert [c.config for c in saver.list(cfg("old"), limit=2)] == more[::-1]


def test_a_damaged_record_says_so() -> None:
    record = CheckpointRecord.__new__(CheckpointRecord)
    for state in (
        (RECORD_FORMAT, b"\xc1", (), b"\x90", (), None),  # not msgpack
        (RECORD_FORMAT, b"\x93\x01\x02\x03", (), b"\x90", (), None),  # three fields, not ten
        (RECORD_FORMAT, b"\x90", (), b"\x90", (), "not a record"),
        (99, b"", (), b"", (), None),  # a format this code does not know
        "nonsense",
    ):
        with pytest.raises(ImageCorruptError, match="checkpoint record") as info:
            record.__setstate__(state)
        assert "batos repair" in info.value.hint
    good = CheckpointRecord(
        ("json", b"{}"),
        ("json", b"{}"),
        checkpoint_id="c",
        parent_id=None,
        run_id=None,
        versions={},
        values={"a": ref(3)},
        writes={},
        size=0,
    ).__getstate__()
    with pytest.raises(ImageCorruptError, match="reference to value 0"):
        record.__setstate__((*good[:2], (), *good[3:]))  # the large value's record is missing


# -- concurrent changes: conflict resolution ----------------------------------------------


def ref(n: int) -> PersistentReference:
    return PersistentReference(p64(n))


def test_writes_of_two_processes_to_one_new_form_record_merge() -> None:
    def state(writes: dict) -> tuple:
        return CheckpointRecord(
            ("json", b"{}"),
            ("json", b"{}"),
            checkpoint_id="c",
            parent_id=None,
            run_id=None,
            versions={"a": "1"},
            values={"a": ref(7)},
            writes=writes,
            size=2,
        ).__getstate__()

    base = state({})
    one = state({("t1", 0): ("ch", ref(8), "")})
    two = state({("t2", 0): ("ch", ("json", b"2"), "")})
    merged = CheckpointRecord.__new__(CheckpointRecord)._p_resolveConflict(base, one, two)
    record = CheckpointRecord.__new__(CheckpointRecord)
    record.__setstate__(merged)
    assert set(record.writes) == {("t1", 0), ("t2", 0)} and record.values["a"].oid == p64(7)
    other = CheckpointRecord(
        ("json", b"{}"),
        ("json", b"{}"),
        checkpoint_id="c",
        parent_id="p",
        run_id=None,
        versions={"a": "1"},
        values={"a": ref(7)},
        writes={},
        size=2,
    ).__getstate__()
    with pytest.raises(ConflictError):
        CheckpointRecord.__new__(CheckpointRecord)._p_resolveConflict(base, one, other)
    # a task's write sent again (a retried task) keeps the first one stored
    again = CheckpointRecord.__new__(CheckpointRecord)._p_resolveConflict(
        base, one, state({("t1", 0): ("ch", ref(9), "")})
    )
    record.__setstate__(again)
    assert record.writes[("t1", 0)][1].oid == p64(8)
    # writes racing a relink (the record before it deleted by another process): no merge
    relinked = (*one[:5], ref(5))
    with pytest.raises(ConflictError):
        CheckpointRecord.__new__(CheckpointRecord)._p_resolveConflict(base, relinked, two)


@pytest.mark.slow
def test_two_clients_putting_into_one_thread_keep_every_checkpoint(
    shared_image_uri: str,
) -> None:
    errors: list[BaseException] = []
    with open_laid_out(shared_image_uri) as first, open_laid_out(shared_image_uri) as second:
        savers = [ZODBSaver(first), ZODBSaver(second)]
        start = threading.Barrier(2)

        def work(saver: ZODBSaver, k: int) -> None:
            try:
                start.wait()
                for step in range(3 * RECENT):
                    checkpoint = generate_checkpoint(
                        channel_values={"n": step}, channel_versions={"n": f"{k}.{step}"}
                    )
                    saver.put(cfg("shared"), checkpoint, {"by": k}, {"n": f"{k}.{step}"})
            except BaseException as exc:
                errors.append(exc)

        workers = [threading.Thread(target=work, args=(s, k)) for k, s in enumerate(savers)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        assert not errors
        listed = list(savers[1].list(cfg("shared")))
        assert len(listed) == 6 * RECENT
        assert Counter(c.metadata["by"] for c in listed) == {0: 3 * RECENT, 1: 3 * RECENT}
        ids = [c.config["configurable"]["checkpoint_id"] for c in listed]
        assert ids == sorted(ids, reverse=True)
        assert savers[0].get_tuple(cfg("shared")).config["configurable"]["checkpoint_id"] == ids[0]
        for saver in savers:
            saver.close()
