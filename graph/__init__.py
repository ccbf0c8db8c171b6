"""The LangGraph graphs and their nodes: the mind (``mind``, ``mind_nodes``, ``plan``,
``facets``, ``answer``), the CPU router, the JIT graph that writes missing methods, the audit
and its missions (``audit``, ``cem``, ``missions``), retrieval and curation.

May import ``batos.training``, ``batos.models``, ``prototypes``, ``store`` and the shared
``batos`` modules; never the shell (``batos.shell``), which assembles the graphs.
"""

# Old module names (before the rooms) stay importable: images written then name them.
from batos import moved

moved.install()
