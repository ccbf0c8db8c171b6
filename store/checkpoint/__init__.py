"""The LangGraph checkpointer that keeps every thread in the image (``saver``), its record
layout (``layout``), parked writes (``parking``) and a cycle's side effects (``effects``).

May import ``store.core``; not the knowledge engine."""
