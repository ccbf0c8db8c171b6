"""The application shell: everything a user starts — the ``batos`` command (``cli``), the
ZeroMQ bridge (``bridge``), the APScheduler heartbeat (``heartbeat``) and ``doctor``.

The shell is the top room: it may import every other room (``graph``, ``batos.training``,
``batos.models``, ``prototypes``, ``store`` and the shared ``batos`` modules); nothing imports it.
"""
