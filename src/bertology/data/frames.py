"""Data held in memory: a pandas DataFrame, a Hugging Face ``datasets.Dataset``, a list of dicts or of sentences.

A notebook user usually has the data in memory already; :func:`bertology.data.loaders.load_corpus` hands such
objects here. They are read exactly as a file of the same columns would be: the same column detection and column
flags (by name or 0-based position), the same cleaning (stripped texts, empty texts and rows without a gold label
dropped and counted in ``Corpus.stats``), so a DataFrame and the CSV it was read from give the same corpus and
the same fingerprint.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from bertology.data.columns import NO_GOLD_LABEL, clean_rows, detect_columns
from bertology.data.corpus import Example
from bertology.errors import BertologyError

#: What ``data`` may be besides a path or ``hf:`` spec, as one line for error messages.
IN_MEMORY_KINDS = "a pandas DataFrame, a datasets.Dataset, a list of dicts, a list of sentences or a Corpus"


def is_frame(data: object) -> bool:
    """True for a pandas DataFrame (checked by module, so pandas is not imported for a path)."""
    return type(data).__module__.startswith("pandas") and hasattr(data, "columns") and hasattr(data, "itertuples")


def is_dataset(data: object) -> bool:
    """True for a Hugging Face ``datasets.Dataset`` (not a DatasetDict: that needs a split named; not a streaming
    IterableDataset: it has no length and maybe no end)."""
    return (type(data).__module__.startswith("datasets") and hasattr(data, "column_names") and hasattr(data, "features")
            and hasattr(data, "__len__"))


def _missing(value: object) -> bool:
    """A cell pandas holds for "no value" (NaN, None, pd.NA, NaT): read as an empty cell, as in a CSV."""
    if value is None:
        return True
    try:
        import pandas as pd

        return bool(pd.isna(value)) if not isinstance(value, (list, tuple, dict)) else False
    except (TypeError, ValueError):
        return False


def _cell(value: object) -> object:
    """A cell as a file would hold it: missing -> None, a NumPy scalar -> its Python value."""
    if _missing(value):
        return None
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        return value.item()
    return value


def _unwidened(column: Any) -> Any:
    """An integer column that pandas widened to float because a cell is missing (``[1, 0, NaN]`` -> ``1.0, 0.0``) back
    as integers, so its labels read ``1`` as in the file it came from; a float column with no missing cell is
    the user's floats (a regression target) and stays as it is."""
    if column.dtype.kind != "f" or not column.isna().any():
        return column
    present = column.dropna()
    return column.astype("Int64") if bool((present == present.round()).all()) else column


def read_frame(df: Any, flags: dict, source: str = "pandas DataFrame") -> tuple[list[Example], dict]:
    """The examples of a DataFrame: its columns detected or named by ``flags`` as in a CSV with a header."""
    if getattr(df.columns, "nlevels", 1) > 1:
        raise BertologyError(f"{source}: a DataFrame with a MultiIndex header; flatten its columns first.")
    columns = [str(c) for c in df.columns]
    chosen = detect_columns(columns, flags, source)
    names = {k: (None if i is None else columns[i]) for k, i in chosen.items()}
    stats: dict = {"format": "dataframe", "columns": names, "n_rows": len(df)}

    picked = [None if chosen[k] is None else _unwidened(df.iloc[:, chosen[k]]) for k in ("text", "pair", "label")]

    def rows() -> Iterator[tuple[object, object, object]]:
        for i in range(len(df)):
            yield tuple(None if column is None else _cell(column.iat[i]) for column in picked)

    return clean_rows(rows(), stats, source), stats


def read_dataset(ds: Any, flags: dict, source: str, stats: dict | None = None) -> tuple[list[Example], dict]:
    """The examples of a ``datasets.Dataset``; a ClassLabel column gives its names to the stats and marks -1 as
    "no gold label" (SNLI), as the ``hf:`` reader always did."""
    columns = list(ds.column_names)
    chosen = detect_columns(columns, flags, source)
    names = {k: (None if i is None else columns[i]) for k, i in chosen.items()}
    stats = {**(stats or {"format": "dataset"}), "columns": names}
    no_label: object = NO_GOLD_LABEL
    feature = (getattr(ds, "features", None) or {}).get(names["label"]) if names["label"] else None
    if getattr(feature, "names", None):  # a ClassLabel: -1 marks "no gold label" (e.g. SNLI)
        stats["label_names"] = list(feature.names)
        no_label = -1
    stats["n_rows"] = len(ds)

    def rows() -> Iterator[tuple[object, object, object]]:
        for row in ds:
            yield tuple(None if names[k] is None else row[names[k]] for k in ("text", "pair", "label"))

    return clean_rows(rows(), stats, source, no_label=no_label), stats


def read_sequence(items: Sequence[Any], flags: dict) -> tuple[list[Example], dict, str]:
    """A list of sentences (one text each; column flags do not apply) or of dicts (rows of a table, read as a
    DataFrame); returns the examples, their stats and the source's description."""
    if all(isinstance(t, str) for t in items):
        given = [k for k, v in flags.items() if v is not None]
        if given:
            raise BertologyError(f"a list of sentences has no columns: column flags ({', '.join(given)}) do not apply; "
                                 "pass a list of dicts or a DataFrame to name columns")
        stats: dict = {"format": "list", "n_rows": len(items)}
        return clean_rows(((t, None, None) for t in items), stats, "python list"), stats, "python list"
    if all(isinstance(t, Mapping) for t in items):
        import pandas as pd

        examples, stats = read_frame(pd.DataFrame.from_records(list(items)), flags, "list of dicts")
        return examples, {**stats, "format": "records"}, "list of dicts"
    kinds = sorted({type(t).__name__ for t in items})
    raise BertologyError(f"data is a list of {', '.join(kinds)}; a list must hold only sentences (str) or only rows "
                         "(dicts of column -> value). For sentence pairs or labels use a list of dicts, e.g. "
                         "[{'text': ..., 'label': ...}], or a DataFrame.")
