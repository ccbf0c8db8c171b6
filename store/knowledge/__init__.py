"""The knowledge engine (fractal memory): ingestion, chunking, the catalog with its full-text
(``lexical``) and vector (``vectors``, ``embeddings``, ``encoder_onnx``) indexes, curation, and
LangGraph's memory store kept in the image (``memory_store``).

May import ``store.core`` and ``store.checkpoint``."""
