"""Documents a query names: the words of a document's name that its text may never say.

A user who ingests ``/usr/share/doc/*/copyright`` and asks "Which licence covers the
libdpkg-perl package?" names a document called ``libdpkg-perl/copyright`` whose text says
"Upstream-Name: dpkg" and never "libdpkg-perl": neither the text index nor the vectors can find
it. The catalog therefore keeps, beside its indexes and derived from its documents' sources,
which documents each name word belongs to, and brings a named document's best passage forward
when its text and vectors have not already found that document (``KnowledgeCatalog.search``).

Names are never put into the text index itself: two attempts that did so (every chunk indexed
with its document's name) found named files far more often and still lost answers on questions
whose words are in their document's name anyway, because the names reordered passages that
were already right. Here the order of a query is touched only when the document it names is
missing from what is read.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import PurePosixPath
from typing import Any

import numpy as np

#: Of a name's characters, at most this many are read (a path can be long).
NAME_CHARS = 160
#: The documents the curator's summaries live in are named with this prefix; they name nothing.
SUMMARY_PREFIX = "curator://summary/"
#: A query word names documents only if at most this share of the names hold it: a word most
#: names share ("copyright" in /usr/share/doc/*/copyright) names none of them.
NAMED_SHARE = 1 / 3
#: ... and only if the text of at most this many other documents per document it names holds
#: it: "libdpkg" is in libdpkg-perl's name alone, while "file", the name of one man page, is in
#: most pages' text and names nothing.
NAMED_OUTSIDE = 1
#: At most this many documents are taken as named by one query; a longer tie is taken as none.
NAMED_DOCUMENTS = 3
_SUFFIX = re.compile(r"\.[A-Za-z0-9]{1,5}")
_CAMEL = re.compile(r"(?<=[a-z])(?=[A-Z])")
_WORD = re.compile(r"[^\W_]+")


def name_words(source: str) -> str:
    """The words of a document's name: its folder's and its file's, without the suffix.

    ``/usr/share/doc/libdpkg-perl/copyright`` gives "libdpkg perl copyright", and
    ``guides/BookingGuide_2026.txt`` "guides Booking Guide 2026".
    """
    path = PurePosixPath(source.replace("\\", "/"))
    name = path.stem if _SUFFIX.fullmatch(path.suffix) else path.name
    words = _WORD.findall(_CAMEL.sub(" ", f"{path.parent.name} {name}"))
    return " ".join(words)[:NAME_CHARS]


def terms(lexicon: Any, text: str) -> list[str]:
    """``text``'s words as the text index's lexicon splits and normalises them (its
    ``termToWordIds`` without the lookup), so a name word and a text word compare equal."""
    words: list[str] = [text]
    for element in lexicon._pipeline:
        words = element.process(words)
    return words


class Owners:
    """Which document each chunk belongs to, as sorted arrays (documents by their index)."""

    def __init__(self, chunk_sets: Sequence[Iterable[int]]) -> None:
        ids = [np.fromiter(chunks, dtype=np.int64) for chunks in chunk_sets]
        owner = [np.full(len(block), index, dtype=np.int64) for index, block in enumerate(ids)]
        ids_all = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)
        owner_all = np.concatenate(owner) if owner else np.zeros(0, dtype=np.int64)
        order = np.argsort(ids_all, kind="stable")
        self.ids = ids_all[order]
        self.owner = owner_all[order]

    def others(self, chunk_ids: Iterable[int], documents: Sequence[int]) -> int:
        """How many documents besides ``documents`` own any of ``chunk_ids`` (a summary's
        chunks belong to none)."""
        wanted = np.fromiter(chunk_ids, dtype=np.int64)
        if not len(wanted) or not len(self.ids):
            return 0
        at = np.minimum(np.searchsorted(self.ids, wanted), len(self.ids) - 1)
        owned = self.owner[at[self.ids[at] == wanted]]
        return len(np.setdiff1d(owned, np.asarray(documents, dtype=np.int64)))


def decisive(scores: Mapping[int, float], most: int) -> list[int]:
    """The keys of ``scores``, best first, as many as fit in ``most`` without splitting a
    group of equal scores: the documents a query singles out by name, and no more."""
    ranked = sorted(scores.items(), key=lambda item: (-item[1], item[0]))
    chosen: list[int] = []
    start = 0
    while start < len(ranked):
        end = start
        while end < len(ranked) and math.isclose(ranked[end][1], ranked[start][1]):
            end += 1
        if end > most:
            break
        chosen.extend(key for key, _ in ranked[start:end])
        start = end
    return chosen


class DocumentNames:
    """Every document's name words, for one version of a catalog.

    ``sources`` are the documents (summaries aside), ``naming`` maps a normalised name word to
    the indexes of the sources whose names hold it, and ``owners`` says which source each
    chunk belongs to (for how many other documents' text holds a word).
    """

    def __init__(self, lexicon: Any, sources: Sequence[str], chunk_sets: Sequence[Iterable[int]]):
        self.sources = list(sources)
        self.naming: dict[str, list[int]] = {}
        for index, source in enumerate(self.sources):
            for word in set(terms(lexicon, name_words(source))):
                self.naming.setdefault(word, []).append(index)
        self.owners = Owners(chunk_sets)

    def named(self, lexicon: Any, wordinfo: Mapping[int, Any], query: str) -> list[str]:
        """The sources ``query`` names, best first (at most ``NAMED_DOCUMENTS``; none when
        more tie).

        Documents score the summed rarity (BM25's idf, over names) of the query's words their
        names hold. A word names documents only where it is specific to them: held by at most
        ``NAMED_SHARE`` of the names, and by the text of at most ``NAMED_OUTSIDE`` other
        documents per document it names. ``wordinfo`` is the text index's postings (word id →
        chunk ids), read for that second test only.
        """
        total = len(self.sources)
        scores: dict[int, float] = {}
        # in the query's order, so the sums (and near ties) are the same in every process
        for word in dict.fromkeys(terms(lexicon, query)):
            holders = self.naming.get(word)
            if not holders or len(holders) > NAMED_SHARE * total:
                continue
            wid = lexicon.get_wid(word)
            in_text = wordinfo.get(wid, ()) if wid else ()
            most = NAMED_OUTSIDE * len(holders)
            # fewer passages than that cannot belong to more documents: no need to count
            if len(in_text) > most and self.owners.others(in_text, holders) > most:
                continue
            rarity = math.log(1.0 + (total - len(holders) + 0.5) / (len(holders) + 0.5))
            for index in holders:
                scores[index] = scores.get(index, 0.0) + rarity
        return [self.sources[index] for index in decisive(scores, NAMED_DOCUMENTS)]
