"""ImageStore: LangGraph's BaseStore over the living image, checked against InMemoryStore."""

from __future__ import annotations

import json

import pytest
from images import open_laid_out
from langgraph.store.base import Item
from langgraph.store.memory import InMemoryStore

from store.core.image import LivingImage
from store.knowledge.embeddings import Embedder
from store.knowledge.memory_store import ImageStore


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return Embedder()


@pytest.fixture
def store(any_image: LivingImage, embedder: Embedder) -> ImageStore:
    return ImageStore(any_image, embedder=embedder)


def _strip(item: Item | None) -> tuple | None:
    return None if item is None else (item.namespace, item.key, json.dumps(item.value))


def test_behaves_like_langgraphs_in_memory_store(store: ImageStore) -> None:
    reference = InMemoryStore()
    writes = [
        (("users", "ada"), "prefs", {"theme": "dark", "age": 36, "tags": {"lang": "en"}}),
        (("users", "ada"), "notes", {"text": "likes tea", "age": 10}),
        (("users", "bob"), "prefs", {"theme": "light", "age": 51}),
        (("docs",), "d1", {"status": "draft", "score": 4.5}),
        (("docs", "v2"), "d2", {"status": "final", "score": 2}),
    ]
    for target in (store, reference):
        for namespace, key, value in writes:
            target.put(namespace, key, value)
        target.put(("users", "ada"), "notes", {"text": "likes coffee", "age": 11})
        target.delete(("docs",), "missing")
    for namespace, key, _ in writes:
        assert _strip(store.get(namespace, key)) == _strip(reference.get(namespace, key))
    filters = [
        {},
        {"theme": "dark"},
        {"age": {"$gt": 30}},
        {"age": {"$gte": 11, "$lt": 51}},
        {"tags": {"lang": "en"}},
        {"status": {"$ne": "draft"}},
        {"score": {"$lte": 4.5}},
    ]
    for prefix in [(), ("users",), ("users", "ada"), ("docs",), ("nobody",)]:
        for where in filters:
            found = store.search(prefix, filter=where, limit=100)
            try:
                theirs = {_strip(i) for i in reference.search(prefix, filter=where, limit=100)}
            except TypeError:
                # InMemoryStore cannot compare a missing field with $gt & co.; like the
                # Postgres store, ours treats the item as not matching.
                assert all(set(where) <= set(i.value) for i in found)
                continue
            assert {_strip(i) for i in found} == theirs, (prefix, where)
    for kwargs in [
        {},
        {"prefix": ("users",)},
        {"suffix": ("prefs",)},
        {"max_depth": 1},
        {"prefix": ("*",), "max_depth": 2},
        {"limit": 2, "offset": 1},
    ]:
        assert store.list_namespaces(**kwargs) == reference.list_namespaces(**kwargs), kwargs
    store.delete(("users", "bob"), "prefs")
    assert store.get(("users", "bob"), "prefs") is None
    assert ("users", "bob") not in store.list_namespaces()


def test_updates_keep_created_at_and_move_updated_at(store: ImageStore) -> None:
    store.put(("a",), "k", {"v": 1})
    first = store.get(("a",), "k")
    store.put(("a",), "k", {"v": 2})
    second = store.get(("a",), "k")
    assert second.value == {"v": 2}
    assert second.created_at == first.created_at and second.updated_at >= first.updated_at


def test_semantic_search_ranks_by_meaning(store: ImageStore) -> None:
    store.put(("mem",), "1", {"text": "The user's cat is called Miso and sleeps all day."})
    store.put(("mem",), "2", {"text": "Quarterly tax payments are due in April."})
    store.put(("mem",), "3", {"text": "The user prefers dark roast espresso."}, index=["text"])
    store.put(("mem",), "4", {"text": "not indexed"}, index=False)
    results = store.search(("mem",), query="what pet does the user have", limit=4)
    assert results[0].key == "1" and results[0].score > results[1].score
    assert results[-1].key == "4" and results[-1].score is None
    coffee = store.search(("mem",), query="favourite drink", limit=1, filter={})
    assert coffee[0].key == "3"
    assert store.search(("other",), query="cat") == []


async def test_async_api_and_bound_transactions(
    memory_image: LivingImage, embedder: Embedder
) -> None:
    store = ImageStore(memory_image, embedder=embedder)
    await store.aput(("t",), "x", {"n": 1})
    assert (await store.aget(("t",), "x")).value == {"n": 1}
    assert [i.key for i in await store.asearch(("t",))] == ["x"]
    assert await store.alist_namespaces() == [("t",)]

    def cycle(root, fail: bool) -> None:  # type: ignore[no-untyped-def]
        with store.bound(root):
            store.put(("t",), "from-cycle", {"fail": fail})
            assert store.get(("t",), "from-cycle").value == {"fail": fail}
            if fail:
                raise RuntimeError("the cycle failed")

    with pytest.raises(RuntimeError):
        memory_image.transact(lambda root: cycle(root, True))
    assert store.get(("t",), "from-cycle") is None  # gone with the aborted transaction
    memory_image.transact(lambda root: cycle(root, False))
    assert store.get(("t",), "from-cycle").value == {"fail": False}
    await store.adelete(("t",), "x")
    assert await store.aget(("t",), "x") is None


def test_memories_survive_reopen(lasting_image_uri: str, embedder: Embedder) -> None:
    with open_laid_out(lasting_image_uri) as image:
        ImageStore(image, embedder=embedder).put(("u",), "k", {"text": "remember the milk"})
    with open_laid_out(lasting_image_uri) as image:
        store = ImageStore(image, embedder=embedder)
        assert store.get(("u",), "k").value == {"text": "remember the milk"}
        assert store.search(("u",), query="groceries to buy")[0].key == "k"
