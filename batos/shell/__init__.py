"""The application shell: everything a user starts — the ``batos`` command (``cli``), the
ZeroMQ bridge (``bridge``), the APScheduler heartbeat (``heartbeat``), ``doctor`` and what the
LangGraph server loads (``served``) — all assembled by one ``runtime.open_runtime``.

The shell is the top room: it may import every other room (``graph``, ``batos.training``,
``batos.models``, ``prototypes``, ``store`` and the shared ``batos`` modules); nothing imports it.
"""
