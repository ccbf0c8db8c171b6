"""Everything that touches disk, in three sub-packages: the living image (``core``: opening by
URI, ZEO, transactions and their retries, schema upgrades, model files), the LangGraph
checkpointer that keeps threads in the image (``checkpoint``) and the knowledge engine
(``knowledge``: catalog, ingestion, chunking, full-text and vector indexes, the memory store).
``core.layout`` owns every top-level key of the image; ``upgrades`` orders the store's steps.

The bottom room: it imports only the shared ``batos`` modules.
"""

# Old module names (before the rooms) stay importable: images written then name them.
from batos import moved

moved.install()
