"""CoNLL-2003-style tag files: one word per line in whitespace-separated columns, a blank line between sentences.

``EU NNP B-NP B-ORG`` (CoNLL-2003: word, POS, chunk, NER) or ``EU B-ORG``: any number of columns, the same on
every line of the file. The word is the first column and the tag the last unless ``--text-column`` /
``--label-column`` give their 0-based positions (a negative position counts from the end). ``-DOCSTART-``
lines (document boundaries) are skipped. A line with another number of columns is refused with the file,
the line and the count it should have. Each sentence becomes an :class:`~bertology.data.corpus.Example`
whose ``words`` are the first column, ``tags`` the tag column and ``text`` the words joined by spaces.
"""
from __future__ import annotations

import io
from collections import Counter
from pathlib import Path

from bertology.data.corpus import Example
from bertology.errors import BertologyError

#: File extensions read as tag files.
TAG_FILE_EXTENSIONS = (".conll", ".bio", ".iob")
DOCSTART = "-DOCSTART-"


def _position(flag: str | int | None, default: int, n_columns: int, what: str, path: Path, flag_name: str) -> int:
    """A column position from a flag (``"3"``, ``-1``), checked against the file's column count."""
    if flag is None:
        return default % n_columns
    try:
        pos = int(flag)
    except (TypeError, ValueError):
        raise BertologyError(
            f"{path}: {flag_name} {flag!r} must be a 0-based column number for a tag file "
            f"(it has {n_columns} columns; default {what}: {'first' if default == 0 else 'last'})."
        ) from None
    if not -n_columns <= pos < n_columns:
        raise BertologyError(f"{path}: {flag_name} {pos} is outside the file's {n_columns} columns (0..{n_columns - 1}).")
    return pos % n_columns


def read_tag_file(path: Path, text: str, flags: dict) -> tuple[list[Example], dict]:
    """Sentences of a tag file (see the module docstring); ``flags``: ``text`` = word column, ``label`` = tag column."""
    if flags.get("pair") is not None:
        raise BertologyError(f"{path}: --pair-column does not apply to a tag file (one sentence per block).")
    examples: list[Example] = []
    sentence: list[tuple[int, list[str]]] = []
    n_columns: int | None = None
    first_line = 0
    word_col = tag_col = 0
    n_docstart = 0

    def flush() -> None:
        if sentence:
            words = tuple(cols[word_col] for _, cols in sentence)
            examples.append(Example(text=" ".join(words), words=words, tags=tuple(cols[tag_col] for _, cols in sentence)))
            sentence.clear()

    for lineno, raw in enumerate(io.StringIO(text, newline=None), 1):
        cols = raw.split()
        if not cols:
            flush()
            continue
        if cols[0] == DOCSTART:
            n_docstart += 1
            flush()
            continue
        if n_columns is None:
            n_columns, first_line = len(cols), lineno
            if n_columns < 2:
                raise BertologyError(
                    f"{path}, line {lineno}: a tag file needs a word and a tag column per line, found 1 column ({raw.strip()!r})."
                )
            word_col = _position(flags.get("text"), 0, n_columns, "word column", path, "--text-column")
            tag_col = _position(flags.get("label"), -1, n_columns, "tag column", path, "--label-column")
            if word_col == tag_col:
                raise BertologyError(f"{path}: the word and tag columns are both column {word_col}; name different ones.")
        elif len(cols) != n_columns:
            raise BertologyError(
                f"{path}, line {lineno}: ragged columns: found {len(cols)} whitespace-separated columns, but line "
                f"{first_line} has {n_columns} ({raw.strip()[:60]!r}); every word line needs the same columns."
            )
        sentence.append((lineno, cols))
    flush()
    tag_counts = Counter(t for ex in examples for t in ex.tags or ())
    stats = {
        "format": "tags",
        "columns": {"text": word_col, "pair": None, "label": None, "tags": tag_col, "n_columns": n_columns},
        "n_sentences": len(examples),
        "n_words": sum(len(ex.words or ()) for ex in examples),
        "n_docstart_lines": n_docstart,
        "tag_counts": dict(sorted(tag_counts.items())),
    }
    return examples, stats
