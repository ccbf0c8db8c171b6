"""BAT OS: a persistent, self-extending, multi-persona agent living in one ZODB image.

The code lives in rooms, each a package that may import only the rooms below it (the contracts in
``pyproject.toml``, checked by ``lint-imports`` in ``make lint``):

=====================  ===========================================================
``batos.shell``        the application: CLI, ZeroMQ bridge, heartbeat, doctor, the
                       served graphs' runtime — the only room that assembles the rest
``graph``              the LangGraph graphs: the mind, router, JIT, audit, missions
``batos.training``     persona LoRA adapters: training and GGUF conversion
``batos.models``       persona chat models and the backends that serve them
``prototypes``         the object model, the kernel, the guardian and the sandbox
``store``              the living image, the checkpointer and the knowledge engine
``batos.settings``,    what every room shares: the settings table, the exception
``batos.errors``,      tree, the metrics
``batos.metrics``
=====================  ===========================================================
"""

__version__ = "0.1.0"

# Images written before the code moved into these rooms name classes by their old modules.
from batos import moved as _moved

_moved.install()
