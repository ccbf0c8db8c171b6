"""The graphs and what wires them to the rest: the JIT graph, retrieval and curation nodes,
opening the image (``boot``); chat models in ``llm``, persona training in ``training``, the
``batos`` command in ``cli``."""
