"""Everything that touches disk: the living image by URI, ZEO, transactions and their retries,
schema upgrades, the checkpointer, the knowledge catalog and memory store, model files."""
