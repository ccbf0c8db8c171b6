"""Text that UTF-8 can hold.

Python text may hold a lone UTF-16 surrogate — a file name's undecodable byte read with
surrogateescape, a PDF's broken character map decoded with surrogatepass, a client's JSON
``"\\udce9"`` — which UTF-8, a tokenizer and a JSON body all refuse.
"""

from __future__ import annotations

import re

#: A UTF-16 surrogate, paired or not.
SURROGATE = re.compile("[\ud800-\udfff]")


def well_formed(text: str) -> str:
    """``text`` with lone surrogates replaced by U+FFFD (pairs joined into their character)."""
    if SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
