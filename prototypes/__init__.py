"""The object model: ``UvmObject`` and its methods, the persona codex and its incarnation, and
the generative kernel (doesNotUnderstand, PersistenceGuardian, sandbox, isolation); no LangGraph,
no disk."""
