"""The report decoder's bounds hold while it reads, not after: memory, values, time, integers."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import msgpack
import pytest
from persistent.list import PersistentList

from prototypes import isolation, kernel, report
from prototypes.uvm import UvmObject

#: Most the host may grow while it refuses a 16 MB hostile report, in MiB (it grew 1.1 GB).
HOSTILE_REPORT_MIB = 100


def test_a_16_mb_hostile_report_is_refused_within_its_bound_of_memory() -> None:
    # Eight arrays of a million empty lists each, two bytes a list: the old decoder unpacked
    # all eight million lists before it counted any.
    script = textwrap.dedent(
        """
        import resource
        from prototypes import report
        million = b"\\xdd" + (1_000_001).to_bytes(4, "big") + b"\\x00" + b"\\x91\\x00" * 1_000_000
        result = b"\\xdc" + (9).to_bytes(2, "big") + b"\\x00" + million * 8
        payload = b"\\x95\\xa1R\\x90" + result + b"\\x90\\x90"
        assert len(payload) <= report.MAX_REPORT_BYTES
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
            report.Decoder([], lambda oid: None).report(payload)
            print("accepted")
        except report.ReportRefused as exc:
            print(exc)
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        print(grown // 1024)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=Path(__file__).parent.parent,
    )
    refusal, grown = done.stdout.splitlines()
    assert refusal == "it holds more than 1,000,000 values"
    assert int(grown) < HOSTILE_REPORT_MIB, f"the host grew {grown} MiB"


def test_a_container_claiming_more_than_is_left_is_refused_before_it_is_read() -> None:
    claim = b"\xdd" + (2_000_001).to_bytes(4, "big") + b"\x00"  # [LIST, …2 M items], none sent
    with pytest.raises(report.ReportRefused, match="more than 1,000,000 values"):
        report.Decoder([], lambda oid: None).report(b"\x95\xa1R\x90" + claim)


def test_decoding_stops_at_the_calls_deadline() -> None:
    payload = report.Encoder({}, None).report(list(range(100_000)), [])
    assert report.Decoder([], lambda oid: None).report(payload).result[-1] == 99_999
    late = report.Decoder([], lambda oid: None, deadline=time.monotonic() - 1)
    with pytest.raises(report.ReportRefused, match="past the call's deadline"):
        late.report(payload)


def test_the_host_counts_what_the_child_counts() -> None:
    """A report the child could send at the limit is one the host accepts: both sides count
    the same values (slot names and method entries included), and one more is refused."""
    obj = UvmObject(name="vault", items=PersistentList([1]))
    kernel.add_method(obj, "greet", "def greet(self):\n    return 'hi'\n")
    known = isolation._known_objects([obj], None)
    tokens = {id(o): i for i, o in enumerate(known)}
    for result in ([1, (2, 3), {"a": {4}}, obj], [[None] * 5] * 3, "x"):
        encoder = report.Encoder(tokens, None)
        payload = encoder.report(result, [obj, obj.items])
        decoder = report.Decoder(known, lambda oid: None)
        decoder.report(payload)
        assert decoder.nodes == encoder.nodes
    spare = report.MAX_NODES - encoder.nodes
    obj.filler = list(range(spare - 2))  # its name and its list count as two more
    full = report.Encoder(tokens, None)
    report.Decoder(known, lambda oid: None).report(full.report("x", [obj, obj.items]))
    assert full.nodes == report.MAX_NODES
    obj.filler.append(0)
    with pytest.raises(report.TooLarge):
        report.Encoder(tokens, None).report("x", [obj, obj.items])


def test_integers_cross_back_only_as_large_as_can_be_printed() -> None:
    largest = 2**report.MAX_INT_BITS - 1
    assert str(largest)  # within Python's limit on integer digits
    payload = report.Encoder({}, None).report(largest, [])
    assert report.Decoder([], lambda oid: None).report(payload).result == largest
    with pytest.raises(report.TooLarge, match="an integer of 14,001 bits"):
        report.Encoder({}, None).report(2**report.MAX_INT_BITS, [])
    wide = msgpack.ExtType(1, (2**14_003).to_bytes(1_751, "big", signed=True))
    with pytest.raises(report.ReportRefused, match="more than 14,000 bits"):
        report.Decoder([], lambda oid: None).report(msgpack.packb(["R", [], wide, [], []]))


@pytest.mark.parametrize(
    "payload",
    [
        b"\x95\xa1R\x91\x80",  # an empty map where a new object's kind goes: unhashable
        b"\x95\xa1R\x90\xc0\x90",  # cut short after the result
        b"\x95\xa1R\x90\xc0\x90\x90\xc0",  # a byte after the end
    ],
    ids=["map-as-kind", "cut-short", "trailing-byte"],
)
def test_a_malformed_envelope_is_refused_by_a_named_rule(payload: bytes) -> None:
    with pytest.raises(report.ReportRefused):
        report.Decoder([], lambda oid: None).report(payload)
