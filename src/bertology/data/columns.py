"""Which columns of a table hold the text, the second text and the label, and how its rows become examples.

Shared by every tabular reader: the files' (:mod:`bertology.data.loaders`: CSV/TSV, JSONL, ``hf:`` datasets) and the
objects' in memory (:mod:`bertology.data.frames`: DataFrames, ``datasets.Dataset``, lists of dicts), so a table reads
the same whichever way it arrives. The detection rules are in the loaders' module docstring.
"""
from __future__ import annotations

import logging
import re
import unicodedata
from collections.abc import Iterable, Sequence

from bertology.data.corpus import Example
from bertology.errors import BertologyError

logger = logging.getLogger(__name__)

#: A column flag: a name, or a 0-based position (an int or its digits) for a file without a header.
ColumnFlag = str | int | None

PAIR_COLUMNS: tuple[tuple[str, str], ...] = (
    ("sentence1", "sentence2"),
    ("premise", "hypothesis"),
    ("question1", "question2"),
    ("#1 string", "#2 string"),
    ("question", "sentence"),
    ("text_a", "text_b"),
    ("text", "text_pair"),
)
TEXT_COLUMNS: tuple[str, ...] = ("text", "sentence", "review", "content", "document")
LABEL_COLUMNS: tuple[str, ...] = (
    "gold_label",
    "label",
    "labels",
    "quality",
    "is_duplicate",
    "class",
    "sentiment",
    "polarity",
    "score",  # GLUE STS-B: a regression target (bertology finetune --task auto chooses regression for it)
)
KNOWN_NAMES = frozenset(TEXT_COLUMNS + LABEL_COLUMNS + tuple(n for pair in PAIR_COLUMNS for n in pair))

#: Label value that SNLI/MNLI use for "annotators did not agree": such rows are dropped.
NO_GOLD_LABEL = "-"


def is_position(flag: ColumnFlag) -> bool:
    if isinstance(flag, bool):
        return False
    return isinstance(flag, int) or (isinstance(flag, str) and re.fullmatch(r"\s*\d+\s*", flag) is not None)


def resolve_flag(flag: ColumnFlag, columns: Sequence[str], what: str, source: str) -> int:
    """Index of the column a flag names: exact name, then case-insensitive name, then position."""
    if isinstance(flag, str):
        if flag in columns:
            return list(columns).index(flag)
        folded = [i for i, c in enumerate(columns) if c.strip().lower() == flag.strip().lower()]
        if folded:
            return folded[0]
    if is_position(flag):
        pos = int(flag)
        if pos < len(columns):
            return pos
        raise BertologyError(
            f"{source}: {what} column position {pos} is out of range; the file has {len(columns)} "
            f"column(s) (0-based): {list(columns)}"
        )
    raise BertologyError(f"{source}: no {what} column {flag!r}; available columns: {list(columns)}")


def detect_columns(columns: Sequence[str], flags: dict, source: str) -> dict[str, int | None]:
    """Column index for text, pair and label: flags first, then the known names."""
    chosen: dict[str, int | None] = {
        k: (None if v is None else resolve_flag(v, columns, k, source)) for k, v in flags.items()
    }
    lower: dict[str, int] = {}
    for i, c in enumerate(columns):
        lower.setdefault(str(c).strip().lower(), i)
    if chosen["text"] is None:
        for a, b in PAIR_COLUMNS:
            if a in lower and b in lower:
                chosen["text"] = lower[a]
                if flags["pair"] is None:
                    chosen["pair"] = lower[b]
                break
        else:
            for n in TEXT_COLUMNS:
                if n in lower:
                    chosen["text"] = lower[n]
                    break
    if chosen["text"] is None:
        raise BertologyError(
            f"{source}: cannot tell which column holds the text; available columns: {list(columns)}. "
            f"Name it with --text-column (and --pair-column / --label-column), or give 0-based positions "
            f"for a file without a header row (e.g. --text-column 1 --label-column 0)."
        )
    if chosen["label"] is None and flags["label"] is None:
        for n in LABEL_COLUMNS:
            if n in lower and lower[n] not in (chosen["text"], chosen["pair"]):
                chosen["label"] = lower[n]
                break
    return chosen


def column_names(columns: Sequence[str], chosen: dict[str, int | None]) -> dict[str, str | None]:
    """The names of the columns :func:`detect_columns` chose (``text``, ``pair``, ``label``): the stats' ``columns``."""
    return {k: (None if i is None else columns[i]) for k, i in chosen.items()}


def has_visible_text(text: str) -> bool:
    """Whether ``text`` holds a character other than whitespace and invisible format characters (zero-width
    spaces and joiners, the BOM, soft hyphens: Unicode category Cf), which tokenisers drop, leaving no tokens."""
    return any(not (c.isspace() or unicodedata.category(c) == "Cf") for c in text)


def clean_rows(
    rows: Iterable[tuple[object, object, object]], stats: dict, source: str, no_label: object = NO_GOLD_LABEL
) -> list[Example]:
    """Strip texts; drop rows with an empty text (or pair) or with no gold label; count the drops."""
    examples: list[Example] = []
    n_empty = n_no_gold = 0
    for text, pair, label in rows:
        label = None if label is None else str(label).strip()
        if label == "":
            label = None
        if label is not None and label == str(no_label):
            n_no_gold += 1
            continue
        text = "" if text is None else str(text).strip()
        if pair is not None:
            pair = str(pair).strip()
        if not has_visible_text(text) or (pair is not None and not has_visible_text(pair)):
            n_empty += 1
            continue
        examples.append(Example(text=text, text_pair=pair, label=label))
    stats["n_empty_text"] = n_empty
    stats["n_no_gold_label"] = n_no_gold
    if n_empty:
        logger.warning("%s: dropped %d row(s) with an empty text", source, n_empty)
    if n_no_gold:
        logger.info("%s: dropped %d row(s) without a gold label (%r)", source, n_no_gold, no_label)
    return examples


def dropped_note(stats: dict) -> str:
    parts = []
    if stats.get("n_rows"):
        parts.append(f"{stats['n_rows']} row(s) read")
    for key, why in (("n_empty_text", "with an empty text"), ("n_no_gold_label", "without a gold label")):
        if stats.get(key):
            parts.append(f"{stats[key]} dropped {why}")
    return f" ({'; '.join(parts)})" if parts else ""
