"""The one exception type users see: a message they can act on, no traceback."""
from __future__ import annotations


class BertologyError(Exception):
    """An error caused by the user's input (paths, data, models, flags).

    The CLI prints ``str(err)`` and exits with status 2; library callers can catch it.
    """
