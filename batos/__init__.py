"""BAT OS: a persistent, self-extending, multi-persona agent living in one ZODB image.

This package holds what every layer shares: the exception tree and the settings table.
"""

__version__ = "0.1.0"
