"""The crash harness, short: twenty SIGKILLs at random points while a worker thinks, ingests
and grows methods; after each, ZODB's checks pass and nothing acknowledged is lost or half
there. The full run (200+ kills) is ``bench/crash.py``."""

from __future__ import annotations

from pathlib import Path

import pytest
from images import open_laid_out

from bench import crash
from prototypes.incarnation import personas


@pytest.mark.slow
def test_twenty_kills_lose_nothing_and_leave_nothing_half_done(tmp_path: Path) -> None:
    findings = crash.run(20, seed=7, max_delay=2.0, workdir=tmp_path)
    assert findings.points == 20
    assert (findings.lost, findings.partial, findings.damaged) == (set(), set(), set())
    assert findings.acknowledged >= 5  # the kills did not all land before any work

    # The checks themselves can fail: an acknowledgement the image lacks is lost, and a cycle
    # counted twice is partial.
    journal = crash.read_journal(tmp_path / "journal.jsonl")
    invented = {"op": "cycle", "thread": "t-never", "status": "COMPLETE", "cycle": "no-such"}
    uri = f"file://{tmp_path / 'live_image.fs'}"
    with open_laid_out(uri) as image:
        image.transact(lambda root: personas(root)["BRICK"].stats.__setitem__("cycles", -1))
    seen = crash.Findings()
    crash.check_image(uri, [*journal, invented], seen)
    assert seen.lost == {"cycle t-never cycle no-such"}
    assert len(seen.partial) == 1 and "BRICK counted -1 cycles" in next(iter(seen.partial))
