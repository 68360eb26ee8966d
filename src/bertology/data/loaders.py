"""Read a corpus from a file (.txt, .csv, .tsv, .jsonl, .conllu) or a Hugging Face dataset.

:func:`load_corpus` is the one entry point. The tabular readers (text lines, CSV/TSV with GLUE layouts,
JSONL, Hugging Face datasets: they share the column detection and cleaning below) live here; the tree
and tag readers have modules of their own (:mod:`bertology.data.conllu_file`, :mod:`bertology.data.tagfile`).

Every reader returns a :class:`~bertology.data.corpus.Corpus` whose ``stats`` say which format and
columns were used and how many rows were dropped and why, so nothing disappears silently. Problems
in the user's file (missing file or column, bad encoding, malformed line) raise
:class:`~bertology.errors.BertologyError` with the file name and, where there is one, the line.

Column auto-detection (CSV/TSV/JSONL/HF, when no column flag is given), case-insensitive:

* pair of texts, first match wins: ``sentence1/sentence2``, ``premise/hypothesis``,
  ``question1/question2``, ``#1 String/#2 String`` (MRPC), ``question/sentence`` (QNLI),
  ``text_a/text_b``, ``text/text_pair``;
* otherwise one text: ``text``, ``sentence``, ``review``, ``content``, ``document``;
* label, first match wins: ``gold_label``, ``label``, ``labels``, ``quality`` (MRPC),
  ``is_duplicate`` (QQP), ``class``, ``sentiment``, ``polarity``.

CSV/TSV without a header row (e.g. Pang & Lee's ``"1","the rock is destined ..."``): pass the column
flags as 0-based positions (``text_column="1", label_column="0"``); a first row that holds known
column names is then taken as a header and skipped. Header-less files of a known layout are
recognised by their shape and get that layout's column names (:data:`HEADERLESS_LAYOUTS`: GLUE CoLA's
train/dev ``source, label, original_judgment, sentence``, e.g. ``gj04<TAB>1<TAB><TAB>Our friends ...``),
so the auto-detection and the column flags work on them as on a file with a header. With no flags,
a file whose first row holds no known column name and looks like data (a number, or a label-like
cell that recurs further down its column) is read as header-less only in the one unambiguous
layout of one label and one text column (the text is the column with the longer strings); any other
layout is refused with the columns found, since guessing there once took CoLA's source-paper column
for the label. A real but unknown header, such as ``tweet,stance``, is not mistaken for data.

After reading, the labels are checked once (:func:`label_warnings`): a label column whose every value
is distinct (an ID) or that has more distinct values than half the examples gets a warning in
``Corpus.stats["label_warnings"]``, which the run's manifest and report repeat.
"""
from __future__ import annotations

import csv
import io
import json
import logging
import os
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertology.data.columns import (
    KNOWN_NAMES,
    LABEL_COLUMNS,
    NO_GOLD_LABEL,
    PAIR_COLUMNS,
    TEXT_COLUMNS,
    ColumnFlag,
    clean_rows,
    column_names,
    detect_columns,
    dropped_note,
    has_visible_text,
    is_position,
)
from bertology.data import frames
from bertology.data.conllu_file import read_conllu
from bertology.data.corpus import Corpus, Example
from bertology.data.tagfile import TAG_FILE_EXTENSIONS, read_tag_file
from bertology.errors import BertologyError

logger = logging.getLogger(__name__)

SUPPORTED_EXTENSIONS = (".txt", ".csv", ".tsv", ".jsonl", ".conllu", ".json") + TAG_FILE_EXTENSIONS

__all__ = ["LABEL_COLUMNS", "NO_GOLD_LABEL", "PAIR_COLUMNS", "SUPPORTED_EXTENSIONS", "TEXT_COLUMNS", "load_corpus",
           "label_warnings"]


@dataclass(frozen=True)
class HeaderlessLayout:
    """A published file layout without a header row, recognised by what every cell looks like.

    ``patterns`` holds one regular expression per column that every (stripped) cell must match;
    ``None`` means any text. ``columns`` are the names the layout's documentation gives the columns.
    """

    name: str
    columns: tuple[str, ...]
    patterns: tuple[str | None, ...]


#: GLUE CoLA train/dev (and CoLA's own in_domain/out_of_domain files): the source's code (``gj04``,
#: ``c-05``), the label 0/1, the judgment as the source notated it (``*``, ``?``, ``??``, ``#`` or
#: empty), the sentence. CoLA's test file has a header (``index, sentence``); every other GLUE file
#: (SST-2, MRPC, QQP, STS-B, MNLI, QNLI, RTE, WNLI, diagnostic) has one too.
GLUE_COLA = HeaderlessLayout(
    name="GLUE CoLA",
    columns=("source", "label", "original_judgment", "sentence"),
    patterns=(r"[A-Za-z][\w-]*", r"[01]", r"[^\w\s]{0,3}", None),
)
HEADERLESS_LAYOUTS: tuple[HeaderlessLayout, ...] = (GLUE_COLA,)

#: Fewer labelled examples than this are not checked by :func:`label_warnings` (too few to judge).
MIN_LABELS_CHECKED = 10

def load_corpus(
    spec: str | os.PathLike | Any,
    *,
    text_column: ColumnFlag = None,
    pair_column: ColumnFlag = None,
    label_column: ColumnFlag = None,
    limit: int | None = None,
    name: str | None = None,
) -> Corpus:
    """Read a corpus from a path, ``hf:NAME[:CONFIG]:SPLIT``, or data in memory (a pandas DataFrame, a
    ``datasets.Dataset``, a list of dicts or of sentences, a :class:`Corpus`: :mod:`bertology.data.frames`).

    Column flags name a column (or give its 0-based position, for files without a header); left
    out, the columns are auto-detected (see the module docstring). ``limit`` keeps the first
    ``limit`` examples after cleaning. Labels are stored as strings.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise BertologyError(f"limit must be a positive integer, not {limit!r}")
    flags = {"text": text_column, "pair": pair_column, "label": label_column}
    if isinstance(spec, Corpus):
        given = [k for k, v in flags.items() if v is not None]
        if given:
            raise BertologyError(f"column flags ({', '.join(given)}) do not apply to a Corpus: its columns are read")
        return _finish(list(spec.examples), dict(spec.stats), spec.source, name or spec.name, limit, check=False)
    if isinstance(spec, (str, os.PathLike)):
        spec_str = os.fspath(spec)
        if spec_str.startswith("hf:"):
            examples, stats, default_name = _load_hf(spec_str, flags)
            return _finish(examples, stats, spec_str, name or default_name, limit)
        path = Path(spec_str)
        examples, stats = _load_file(path, flags)
        return _finish(examples, stats, str(path), name or path.stem, limit)
    examples, stats, source, default_name = frames.read_object(spec, flags)
    return _finish(examples, stats, source, name or default_name, limit)


def _finish(examples: list[Example], stats: dict, source: str, name: str, limit: int | None, *,
            check: bool = True) -> Corpus:
    """The corpus every reader ends in: refused when empty, cut to ``limit`` (recorded), labels checked once."""
    if not examples:
        raise BertologyError(f"{source} has no examples{dropped_note(stats)}.")
    if limit is not None and len(examples) > limit:
        stats["n_before_limit"] = len(examples)
        stats["limited_to"] = limit
        examples = examples[:limit]
    if check:
        label_column = (stats.get("columns") or {}).get("label")
        warnings = label_warnings([ex.label for ex in examples if ex.label is not None], label_column, source)
        for warning in warnings:
            logger.warning("%s", warning)
        if warnings:
            stats["label_warnings"] = warnings
    return Corpus(examples, name=name, source=source, stats=stats)


# --------------------------------------------------------------------------------------------------
# files


def _load_file(path: Path, flags: dict) -> tuple[list[Example], dict]:
    ext = path.suffix.lower()
    if path.is_dir():
        raise BertologyError(
            f"{path} is a folder; the data is one file ({', '.join(SUPPORTED_EXTENSIONS)}) or hf:NAME[:CONFIG]:SPLIT"
        )
    if ext not in SUPPORTED_EXTENSIONS:
        raise BertologyError(
            f"{path}: unsupported file type {ext or '(no extension)'!r}; "
            f"supported: {', '.join(SUPPORTED_EXTENSIONS)} or hf:NAME[:CONFIG]:SPLIT"
        )
    if not path.exists():
        raise BertologyError(f"No such file: {path}")
    if not path.is_file():
        raise BertologyError(f"{path} is not a file")
    text = _read_utf8(path)
    if ext == ".txt":
        given = [k for k, v in flags.items() if v is not None]
        if given:
            raise BertologyError(f"{path}: column flags ({', '.join(given)}) do not apply to a .txt file")
        return _read_txt(text)
    if ext in (".csv", ".tsv"):
        return _read_table(path, text, sep="\t" if ext == ".tsv" else ",", flags=flags)
    if ext == ".jsonl":
        return _read_jsonl(path, text, flags)
    if ext == ".json":  # SQuAD v1.1/v2.0: each question with its context, a sentence pair (compare, track)
        from bertology.data.squad import read_squad, squad_pairs

        if any(v is not None for v in flags.values()):
            raise BertologyError(f"{path}: column flags do not apply to a SQuAD .json file")
        return squad_pairs(read_squad(path))
    if ext in TAG_FILE_EXTENSIONS:  # CoNLL-2003-style word/tag columns (bertology.data.tagfile)
        return read_tag_file(path, text, flags)
    given = [k for k, v in flags.items() if v is not None]
    if given:
        raise BertologyError(f"{path}: column flags ({', '.join(given)}) do not apply to a .conllu file")
    return read_conllu(path, text)


def _read_utf8(path: Path) -> str:
    """The file's text; a UTF-8 byte-order mark is dropped; other encodings are refused."""
    data = path.read_bytes()
    bom = 3 if data.startswith(b"\xef\xbb\xbf") else 0
    try:
        return data[bom:].decode("utf-8")
    except UnicodeDecodeError as err:
        offset = bom + err.start
        line = data[:offset].count(b"\n") + 1
        raise BertologyError(
            f"{path} is not valid UTF-8 (byte offset {offset}, line {line}: byte 0x{data[offset]:02x}); "
            "re-save it as UTF-8"
        ) from None


def _read_txt(text: str) -> tuple[list[Example], dict]:
    examples, n_blank = [], 0
    for line in io.StringIO(text, newline=None):
        sentence = line.strip()
        if has_visible_text(sentence):
            examples.append(Example(text=sentence))
        else:
            n_blank += 1
    return examples, {"format": "txt", "columns": {"text": None, "pair": None, "label": None}, "n_blank_lines": n_blank}


# --------------------------------------------------------------------------------------------------
# label sanity


def _looks_continuous(values: Iterable[str]) -> bool:
    """True when every value is a number and some have a decimal point: a regression target."""
    seen_fraction = False
    for v in values:
        try:
            float(v)
        except ValueError:
            return False
        seen_fraction = seen_fraction or "." in v
    return seen_fraction


def label_warnings(labels: Sequence[str], column: str | None, source: str) -> list[str]:
    """Warnings for a label column that is probably not a label (at most one; never an error).

    An ID column has every value once; a text or other free column has more distinct values than
    half the examples. Both are legitimate only rarely (a many-class task), so they are said, with
    the numbers, not refused. Regression targets (decimal numbers) and fewer than
    :data:`MIN_LABELS_CHECKED` labels are not checked.
    """
    n = len(labels)
    counts = Counter(labels)
    if n < MIN_LABELS_CHECKED or _looks_continuous(counts):
        return []
    what = f"{source}: the label column {column!r}" if column is not None else f"{source}: the labels"
    fix = "if it is not the label, name the label column with --label-column."
    if len(counts) == n:
        return [f"{what} has a different value for each of its {n} examples: it looks like an ID, not a label; {fix}"]
    if len(counts) > n / 2:
        return [
            f"{what} has {len(counts)} distinct values for {n} examples (more than half): "
            f"it is probably not a label; {fix}"
        ]
    return []


# --------------------------------------------------------------------------------------------------
# CSV / TSV


def _read_table(path: Path, text: str, sep: str, flags: dict) -> tuple[list[Example], dict]:
    import pandas as pd

    fmt = "tsv" if sep == "\t" else "csv"
    try:
        df = pd.read_csv(
            io.StringIO(text),
            sep=sep,
            header=None,
            dtype=str,
            keep_default_na=False,
            quoting=csv.QUOTE_NONE if sep == "\t" else csv.QUOTE_MINIMAL,
            skip_blank_lines=True,
        )
    except pd.errors.EmptyDataError:
        raise BertologyError(f"{path} has no examples (the file is empty).") from None
    except (pd.errors.ParserError, csv.Error, ValueError) as err:
        raise BertologyError(f"{path}: cannot read it as {fmt.upper()}: {err}") from None
    rows = df.to_numpy().tolist()
    given = {k: v for k, v in flags.items() if v is not None}
    first = [str(c).strip() for c in rows[0]] if rows else []
    first_known = any(c.lower() in KNOWN_NAMES for c in first)
    layout = None if first_known else _headerless_layout(rows)
    if layout is not None:
        header = False
    elif given and all(is_position(v) for v in given.values()):
        header = first_known
    else:
        header = bool(given) or first_known or not _looks_like_data(rows)
    if header:
        columns = first
        rows = rows[1:]
    else:
        columns = list(layout.columns) if layout is not None else [str(i) for i in range(df.shape[1])]
    if not header and not given and layout is None:
        chosen = _guess_label_and_text(rows, str(path))
    else:
        chosen = detect_columns(columns, flags, str(path))
    stats = {
        "format": fmt,
        "header": header,
        "columns": column_names(columns, chosen),
        "n_rows": len(rows),
    }
    if layout is not None:
        stats["layout"] = layout.name
        logger.info("%s: no header row; the %s layout: columns %s", path, layout.name, list(layout.columns))

    def cell(row: list, i: int | None):
        return None if i is None else row[i]

    examples = clean_rows(
        ((cell(r, chosen["text"]), cell(r, chosen["pair"]), cell(r, chosen["label"])) for r in rows), stats, str(path)
    )
    return examples, stats


def _label_candidates(rows: list[list[str]], text_col: int) -> list[int]:
    n = len(rows)
    out = []
    for j in range(len(rows[0])):
        if j == text_col:
            continue
        distinct = {str(r[j]).strip() for r in rows}
        if 1 < len(distinct) <= max(2, min(50, n // 2)):
            out.append(j)
    return out


def _text_column_by_length(rows: list[list[str]]) -> int:
    body = rows[1:] or rows
    lengths = [sum(len(str(r[j]).strip()) for r in body) for j in range(len(rows[0]))]
    return max(range(len(lengths)), key=lengths.__getitem__)


def _first_label_recurs(rows: list[list[str]], j: int) -> bool:
    """True when the first row's cell in column ``j`` occurs again further down that column."""
    return str(rows[0][j]).strip() in {str(r[j]).strip() for r in rows[1:]}


def _is_number(cell: object) -> bool:
    return re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", str(cell).strip()) is not None


def _looks_like_data(rows: list[list[str]]) -> bool:
    """True when the first row is data, not a header: a cell is a number, or a label-like cell recurs below."""
    if not rows:
        return False
    if any(_is_number(c) for c in rows[0]):
        return True
    if len(rows) < 2:
        return False
    return any(_first_label_recurs(rows, j) for j in _label_candidates(rows, _text_column_by_length(rows)))


def _headerless_layout(rows: list[list[str]]) -> HeaderlessLayout | None:
    """The known header-less layout every row matches (see :data:`HEADERLESS_LAYOUTS`), if any."""
    if not rows:
        return None
    for layout in HEADERLESS_LAYOUTS:
        if len(rows[0]) != len(layout.patterns):
            continue
        checks = [(j, re.compile(p)) for j, p in enumerate(layout.patterns) if p is not None]
        if all(rx.fullmatch(str(r[j]).strip()) for r in rows for j, rx in checks):
            return layout
    return None


def _unknown_layout_error(rows: list[list[str]], source: str) -> BertologyError:
    """The refusal for a header-less file of no known layout: the columns found and how to name them."""
    found = "; ".join(f"{j}: {_shorten(str(c).strip())!r}" for j, c in enumerate(rows[0]))
    layouts = ", ".join(f"{lay.name} ({', '.join(lay.columns)})" for lay in HEADERLESS_LAYOUTS)
    return BertologyError(
        f"{source}: the first row looks like data, not a header, and its {len(rows[0])} column(s) match no "
        f"known header-less layout ({layouts}; or one label and one text column). Columns found (0-based, "
        f"first row): {found}. Name them by position, e.g. --text-column {_text_column_by_length(rows)} "
        f"--label-column N (and --pair-column), or add a header row."
    )


def _shorten(cell: str, width: int = 40) -> str:
    return cell if len(cell) <= width else cell[: width - 3] + "..."


def _guess_label_and_text(rows: list[list[str]], source: str) -> dict[str, int | None]:
    """Columns of a header-less file of one label and one text column (e.g. Pang & Lee); others refused."""
    text_col = _text_column_by_length(rows)
    labels = [j for j in _label_candidates(rows, text_col) if _first_label_recurs(rows, j)] if len(rows) > 1 else []
    if len(rows[0]) != 2 or len(labels) != 1:
        raise _unknown_layout_error(rows, source)
    logger.info("%s: no header row: reading column %d as text and column %d as label", source, text_col, labels[0])
    return {"text": text_col, "pair": None, "label": labels[0]}


# --------------------------------------------------------------------------------------------------
# JSONL


def _read_jsonl(path: Path, text: str, flags: dict) -> tuple[list[Example], dict]:
    records: list[tuple[int, dict]] = []
    n_blank = 0
    for lineno, line in enumerate(io.StringIO(text, newline=None), 1):
        if not line.strip():
            n_blank += 1
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise BertologyError(f"{path}, line {lineno}: not valid JSON ({err.msg}, column {err.colno})") from None
        if not isinstance(obj, dict):
            raise BertologyError(f"{path}, line {lineno}: expected a JSON object, found {type(obj).__name__}")
        records.append((lineno, obj))
    stats: dict = {"format": "jsonl", "n_rows": len(records), "n_blank_lines": n_blank}
    if not records:
        return [], stats
    keys = list(records[0][1])
    for v in flags.values():
        if isinstance(v, str) and v not in keys:
            # a key that only some records carry is fine, so look at all of them before refusing
            keys += [k for _, obj in records for k in obj if k not in keys]
            break
    chosen = detect_columns(keys, {k: (v if v is None else str(v)) for k, v in flags.items()}, str(path))
    names = column_names(keys, chosen)
    stats["columns"] = names

    def rows():
        for lineno, obj in records:
            if names["text"] not in obj:
                raise BertologyError(f"{path}, line {lineno}: no {names['text']!r} key (keys: {list(obj)})")
            pair = None
            if names["pair"] is not None:
                if names["pair"] not in obj:
                    raise BertologyError(f"{path}, line {lineno}: no {names['pair']!r} key (keys: {list(obj)})")
                pair = "" if obj[names["pair"]] is None else obj[names["pair"]]
            label = None if names["label"] is None else obj.get(names["label"])
            yield obj[names["text"]], pair, label

    return clean_rows(rows(), stats, str(path)), stats


# --------------------------------------------------------------------------------------------------
# Hugging Face datasets


def _parse_hf_spec(spec: str) -> tuple[str, str | None, str]:
    body = spec[3:]
    m = re.fullmatch(r"([^:\[\]]+)(?::([^:\[\]]+))?:([^:\[\]]+(?:\[[^\]]*\])?)", body)
    if not m:
        raise BertologyError(f"{spec!r} is not of the form hf:NAME[:CONFIG]:SPLIT (e.g. hf:glue:sst2:validation)")
    return m.group(1), m.group(2), m.group(3)


def _load_hf(spec: str, flags: dict) -> tuple[list[Example], dict, str]:
    name, config, split = _parse_hf_spec(spec)
    try:
        import datasets
    except ImportError:
        raise BertologyError(
            f"Reading {spec} needs the `datasets` package, a dependency of bertology missing from this "
            "environment: pip install datasets (or re-run make setup)"
        ) from None
    try:
        ds = datasets.load_dataset(name, config, split=split)
    except Exception as err:  # network, unknown name/config/split: all surface as one actionable message
        raise BertologyError(
            f"Could not load the Hugging Face dataset {name!r} (config {config!r}, split {split!r}): "
            f"{type(err).__name__}: {err}"
        ) from None
    from bertology.data.frames import read_dataset

    examples, stats = read_dataset(ds, flags, spec, {"format": "hf", "hf": {"name": name, "config": config, "split": split}})
    default_name = "-".join(p.replace("/", "_") for p in (name.split("/")[-1], config, re.sub(r"\[.*", "", split)) if p)
    return examples, stats, default_name
