"""``python -m graph.cli``: the ``batos`` command."""

import sys

from graph.cli.app import main

sys.exit(main())
