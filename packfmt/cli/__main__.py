"""``python -m packfmt.cli ...``: the same entry point as the ``packfmt`` script."""

from . import entry_point

entry_point()
