"""Documents for ingest tests, made in memory: a minimal PDF, a Debian copyright file."""

from __future__ import annotations

#: A ToUnicode map sending the letter A to half of a UTF-16 surrogate pair: pypdf, which
#: decodes these maps with "surrogatepass", hands back a lone surrogate for every A shown.
BROKEN_TO_UNICODE = b"""/CIDInit /ProcSet findresource begin
12 dict begin
begincmap
1 begincodespacerange
<00> <FF>
endcodespacerange
1 beginbfchar
<41> <D800>
endbfchar
endcmap
CMapName currentdict /CMap defineresource pop
end
end"""

#: The shape of the copyright file Debian installs with each package (DEP-5): a lone "."
#: stands for an empty line in a continued field, and ended the old sentence splitter.
DEBIAN_COPYRIGHT = """\
Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: purrd
Source: https://example.org/purrd

Files: *
Copyright: 2019-2024 Felix Catus <felix@example.org>
License: GPL-2+
 This program is free software; you can redistribute it and/or modify it under the
 terms of the GNU General Public License as published by the Free Software Foundation.
 .
 This program is distributed in the hope that it will be useful, but WITHOUT ANY
 WARRANTY.
 .
 On Debian systems, the complete text of the GNU General Public License version 2 can
 be found in "/usr/share/common-licenses/GPL-2".
"""


def make_pdf(text: str, to_unicode: bytes | None = None) -> bytes:
    """A one-page PDF showing ``text`` in Helvetica, with a correct xref table, and with
    ``to_unicode`` as the font's ToUnicode map if given."""
    stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode("latin-1")
    font = b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica"
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d >>\nstream\n%s\nendstream" % (len(stream), stream),
        font + (b" /ToUnicode 6 0 R >>" if to_unicode else b" >>"),
    ]
    if to_unicode:
        objects.append(b"<< /Length %d >>\nstream\n%s\nendstream" % (len(to_unicode), to_unicode))
    return _pdf(objects)


def make_shared_stream_pdf(pages: int, lines: int) -> bytes:
    """A PDF of ``pages`` pages that all draw one content stream of ``lines`` lines of text:
    a small file whose extracted text is ``pages`` times the stream's."""
    stream = (
        b"BT /F1 12 Tf 72 720 Td "
        + b"".join(
            b"(Line %05d of the one stream every page draws.) Tj 0 -14 Td " % n
            for n in range(lines)
        )
        + b"ET"
    )
    kids = b" ".join(b"%d 0 R" % (5 + n) for n in range(pages))
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, pages),
        b"<< /Length %d >>\nstream\n%s\nendstream" % (len(stream), stream),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    objects += [
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 3 0 R "
        b"/Resources << /Font << /F1 4 0 R >> >> >>"
    ] * pages
    return _pdf(objects)


def make_drawing_pdf(pages: int, draws: int, nops: int, *, nested: bool = False) -> bytes:
    """A PDF whose text is one line a page but whose drawing is ``nops`` no-op operators
    (``q Q``, 4 bytes each): drawn by every one of ``pages`` pages as their shared content
    stream when ``draws`` is 0, else kept in a form the one page draws ``draws`` times
    (through a small form of its own, which draws the large one, when ``nested``)."""
    text = b"BT /F1 12 Tf 72 720 Td (Penguins swim.) Tj ET\n"
    noops = b"q Q\n" * nops
    font = b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"
    if draws == 0:
        kids = b" ".join(b"%d 0 R" % (6 + n) for n in range(pages))
        objects = [
            b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, pages),
            b"<< /Length %d >>\nstream\n%s\nendstream" % (len(text), text),
            b"<< /Length %d >>\nstream\n%s\nendstream" % (len(noops), noops),
            font,
        ]
        objects += [
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents [3 0 R 4 0 R] "
            b"/Resources << /Font << /F1 5 0 R >> >> >>"
        ] * pages
        return _pdf(objects)
    large = (
        b"<< /Type /XObject /Subtype /Form /BBox [0 0 9 9] /Resources << /Font << /F1 5 0 R >>"
        b" >> /Length %d >>"
        b"\nstream\n%s\nendstream"
    )
    if nested:  # the page draws Small once; Small draws Big ``draws`` times
        drawn = b"/Small Do\n"
        small = b"/Big Do\n" * draws
        forms = b"/XObject << /Small 6 0 R >>"
        extra = [
            b"<< /Type /XObject /Subtype /Form /BBox [0 0 9 9] "
            b"/Resources << /XObject << /Big 7 0 R >> >> /Length %d >>\nstream\n%s\nendstream"
            % (len(small), small),
            large % (len(noops), noops),
        ]
    else:
        drawn = b"/Big Do\n" * draws
        forms = b"/XObject << /Big 6 0 R >>"
        extra = [large % (len(noops), noops)]
    content = text + drawn
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> " + forms + b" >> >>",
        b"<< /Length %d >>\nstream\n%s\nendstream" % (len(content), content),
        font,
        *extra,
    ]
    return _pdf(objects)


def make_deflated_pdf(drawing: bytes) -> bytes:
    """A one-page PDF showing "Penguins swim." followed by ``drawing``, deflated."""
    import zlib

    content = b"BT /F1 12 Tf 72 720 Td (Penguins swim.) Tj ET\n" + drawing
    packed = zlib.compress(content, 9)
    return _pdf(
        [
            b"<< /Type /Catalog /Pages 2 0 R >>",
            b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
            b"/Resources << /Font << /F1 5 0 R >> >> >>",
            b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(packed)
            + packed
            + b"\nendstream",
            b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        ]
    )


def _pdf(objects: list[bytes]) -> bytes:
    """A PDF file of ``objects`` (numbered from 1, the catalog first), with its xref table."""
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )
    return bytes(out)
