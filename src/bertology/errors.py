"""The one exception type users see: a message they can act on, no traceback."""
from __future__ import annotations


class BertologyError(Exception):
    """An error caused by the user's input (paths, data, models, flags).

    The CLI prints ``str(err)`` and exits with status 2; library callers can catch it.
    """


def check_choice(value: object, choices: "tuple | list", setting: str, flag: str) -> None:
    """Refuse ``value`` unless it is one of ``choices``: one line naming the flag and the setting."""
    if value not in choices:
        raise BertologyError(f"{flag} ({setting}) must be one of {', '.join(map(str, choices))}, not {value!r}.")


def check_range(value: float | None, setting: str, flag: str, *, minimum: float | None = None,
                maximum: float | None = None, above: float | None = None) -> None:
    """Refuse a number outside ``[minimum, maximum]`` (``above``: strictly greater than); None passes."""
    if value is None:
        return
    if above is not None and not value > above:
        raise BertologyError(f"{flag} ({setting}) must be above {above:g}, not {value!r}.")
    if minimum is not None and value < minimum:
        raise BertologyError(f"{flag} ({setting}) must be at least {minimum:g}, not {value!r}.")
    if maximum is not None and value > maximum:
        raise BertologyError(f"{flag} ({setting}) must be at most {maximum:g}, not {value!r}.")
