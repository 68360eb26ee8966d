"""The one exception type users see: a message they can act on, no traceback."""
from __future__ import annotations

import difflib
import errno
from collections.abc import Iterable


class BertologyError(Exception):
    """An error caused by the user's input (paths, data, models, flags).

    The CLI prints ``str(err)`` and exits with status 2; library callers can catch it.
    """


#: How alike (difflib's ratio) a mistyped name and a known one must be for the known one to be suggested.
SUGGEST_CUTOFF = 0.6


def did_you_mean(name: object, known: Iterable[object]) -> str:
    """``" (did you mean X?)"`` for the known name closest to the mistyped ``name`` (difflib's ratio at least
    :data:`SUGGEST_CUTOFF`), else ``""``: an error leads with the likely fix before it lists every known name."""
    if not isinstance(name, str):
        return ""
    close = difflib.get_close_matches(name, [str(k) for k in known if str(k) != name], n=1, cutoff=SUGGEST_CUTOFF)
    return f" (did you mean {close[0]}?)" if close else ""


def each_with_suggestion(names: Iterable[str], known: Iterable[object], *, quoted: bool = False) -> str:
    """``names`` as a comma list (``quoted``: as ``repr`` writes them), each followed by its :func:`did_you_mean`
    (for an error naming several at once)."""
    known = list(known)
    return ", ".join(f"{n!r}{did_you_mean(n, known)}" if quoted else f"{n}{did_you_mean(n, known)}" for n in names)


def check_choice(value: object, choices: "tuple | list", setting: str, flag: str) -> None:
    """Refuse ``value`` unless it is one of ``choices``: one line naming the flag and the setting."""
    if value not in choices:
        raise BertologyError(f"{flag} ({setting}) must be one of {', '.join(map(str, choices))}, "
                             f"not {value!r}{did_you_mean(value, choices)}.")


def format_bound(bound: float) -> str:
    """A bound as a user wrote it: whole numbers in full (4294967295, not 4.29497e+09), others in short form."""
    return str(int(bound)) if float(bound).is_integer() else f"{bound:g}"


def check_range(value: float | None, setting: str, flag: str, *, minimum: float | None = None,
                maximum: float | None = None, above: float | None = None) -> None:
    """Refuse a number outside ``[minimum, maximum]`` (``above``: strictly greater than); None passes."""
    if value is None:
        return
    if above is not None and not value > above:
        raise BertologyError(f"{flag} ({setting}) must be above {above:g}, not {value!r}.")
    if minimum is not None and value < minimum:
        raise BertologyError(f"{flag} ({setting}) must be at least {format_bound(minimum)}, not {value!r}.")
    if maximum is not None and value > maximum:
        raise BertologyError(f"{flag} ({setting}) must be at most {format_bound(maximum)}, not {value!r}.")


#: errno values that mean the disk (or the user's quota) is full.
DISK_FULL = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))


def disk_full(path: object, err: OSError) -> BertologyError:
    """The one line for a write that ran out of space: which file, and what to do."""
    return BertologyError(f"No space left on the device writing {path} ({err.strerror or err}); free some space or "
                          "write the run elsewhere (--out), then run the same command again: finished parts are kept.")


#: The longest name that becomes a file or folder name (a task, a tuned model, a table): well under every
#: file system's limit of 255 bytes, with room for the suffixes bertology adds (``.parquet``, ``~s0``).
NAME_LIMIT = 100


def safe_name(kind: str, value: object) -> str:
    """``value`` when it can be one file or folder name inside a run folder; else one line naming the ``kind``
    (``task name``, ``tuned model name``, ``table name``), the value and the rule it breaks.

    The one check of every name that becomes a path: a non-empty string of at most :data:`NAME_LIMIT`
    characters, not ``.`` or ``..``, without ``/`` or ``\\`` (it would leave its folder), without a leading
    ``.`` (a hidden file) or ``-`` (read as a flag by the shell tools that list a run), without NUL or
    other control characters."""
    def refuse(rule: str) -> BertologyError:
        return BertologyError(f"The {kind} {value!r} {rule}; a name becomes a file or folder name: "
                              "use letters, digits, '_', '-' and '.' (e.g. sst2).")

    if not isinstance(value, str) or not value:
        raise refuse("is not a non-empty string")
    if value in (".", ".."):
        raise refuse("names a folder itself, not a name inside it")
    if "/" in value or "\\" in value:
        raise refuse("holds a path separator ('/' or '\\')")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise refuse("holds a NUL or other control character")
    if value[0] in ".-":
        raise refuse(f"starts with {value[0]!r}")
    if len(value) > NAME_LIMIT:
        raise refuse(f"is {len(value)} characters long, more than {NAME_LIMIT}")
    return value
