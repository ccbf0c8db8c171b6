"""``python -m batos.shell.cli``: the ``batos`` command."""

import sys

from batos.shell.cli.app import main

sys.exit(main())
