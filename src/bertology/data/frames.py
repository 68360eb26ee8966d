"""Data held in memory: a pandas DataFrame, a Hugging Face ``datasets.Dataset``, a list of dicts or of sentences.

A notebook user usually has the data in memory already; :func:`bertology.data.loaders.load_corpus` hands such
objects here. They are read exactly as a file of the same columns would be: the same column detection and column
flags (by name or 0-based position), the same cleaning (stripped texts, empty texts and rows without a gold label
dropped and counted in ``Corpus.stats``), so a DataFrame and the CSV it was read from give the same corpus and
the same fingerprint.
"""
from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from bertology.data.columns import NO_GOLD_LABEL, clean_rows, column_names, detect_columns
from bertology.data.corpus import Example
from bertology.errors import BertologyError

#: What ``data`` may be besides a path or ``hf:`` spec, as one line for error messages.
IN_MEMORY_KINDS = "a pandas DataFrame, a datasets.Dataset, a list of dicts, a list of sentences or a Corpus"


def _is(data: object, module: str, *names: str) -> bool:
    """``data`` is an instance of one of ``module``'s classes ``names``: checked only when that module is imported
    already (an object of it cannot exist otherwise), so reading a path imports neither pandas nor datasets."""
    loaded = sys.modules.get(module)
    return loaded is not None and isinstance(data, tuple(getattr(loaded, n) for n in names if hasattr(loaded, n)))


def is_table(data: object) -> bool:
    """A table in memory with named columns: a pandas DataFrame or a ``datasets.Dataset``."""
    return _is(data, "pandas", "DataFrame") or _is(data, "datasets", "Dataset")


def read_object(data: Any, flags: dict) -> tuple[list[Example], dict, str, str]:
    """The examples of data held in memory, their stats, the source's description and the corpus's default name;
    one clear error for what cannot be read (a DatasetDict, a streaming dataset, a mixed or empty list ...)."""
    if _is(data, "pandas", "DataFrame"):
        return (*read_frame(data, flags), "pandas DataFrame", "dataframe")
    if _is(data, "pandas", "Series"):  # one column of sentences
        return read_object(data.tolist(), flags)
    if _is(data, "datasets", "Dataset"):
        source = f"datasets.Dataset {getattr(data.info, 'dataset_name', None) or ''}".strip()
        return (*read_dataset(data, flags, source), source, "dataset")
    if _is(data, "datasets", "IterableDataset"):  # streamed: no length, maybe no end
        raise BertologyError("data is a streaming datasets.IterableDataset; take the examples first, e.g. "
                             "datasets.Dataset.from_list(list(ds.take(1000))).")
    if _is(data, "datasets", "DatasetDict", "IterableDatasetDict"):
        raise BertologyError(f"data is a datasets.DatasetDict with splits {list(data)}; pass one split, e.g. "
                             f"ds[{next(iter(data), 'train')!r}].")
    if isinstance(data, Sequence) and not isinstance(data, (bytes, bytearray)) and len(data) > 0:
        return (*read_sequence(data, flags), "corpus")
    kind = type(data)
    if isinstance(data, (bytes, bytearray)):
        raise BertologyError(f"data is {type(data).__name__} ({len(data)} bytes); decode it to text first "
                             "(data.decode('utf-8').splitlines() for a list of sentences) or give the file's path.")
    what = ("an empty list" if isinstance(data, Sequence) else
            f"a {kind.__qualname__}" if kind.__module__ == "builtins" else f"a {kind.__module__}.{kind.__qualname__}")
    raise BertologyError(f"data is {what}; give a file path, hf:NAME[:CONFIG]:SPLIT, or {IN_MEMORY_KINDS}.")


def _unwidened(column: Any) -> Any:
    """An integer column that pandas widened to float because a cell is missing (``[1, 0, NaN]`` -> ``1.0, 0.0``) back
    as integers, so its labels read ``1`` as in the file it came from; a float column with no missing cell is
    the user's floats (a regression target) and stays as it is."""
    if column.dtype.kind != "f" or not column.isna().any():
        return column
    present = column.dropna()
    return column.astype("Int64") if bool((present == present.round()).all()) else column


def _cells(column: Any) -> list:
    """A column's cells as a file would hold them: Python values, and None where pandas holds "no value" (NaN,
    None, pd.NA, NaT) as a CSV's empty cell."""
    return [None if missing else value for value, missing in zip(column.tolist(), column.isna().tolist())]


def read_frame(df: Any, flags: dict, source: str = "pandas DataFrame") -> tuple[list[Example], dict]:
    """The examples of a DataFrame: its columns detected or named by ``flags`` as in a CSV with a header."""
    if getattr(df.columns, "nlevels", 1) > 1:
        raise BertologyError(f"{source}: a DataFrame with a MultiIndex header; flatten its columns first.")
    columns = [str(c) for c in df.columns]
    chosen = detect_columns(columns, flags, source)
    stats: dict = {"format": "dataframe", "columns": column_names(columns, chosen), "n_rows": len(df)}
    none = [None] * len(df)
    cells = [none if chosen[k] is None else _cells(_unwidened(df.iloc[:, chosen[k]]))
             for k in ("text", "pair", "label")]
    return clean_rows(zip(*cells), stats, source), stats


def read_dataset(ds: Any, flags: dict, source: str, stats: dict | None = None) -> tuple[list[Example], dict]:
    """The examples of a ``datasets.Dataset``; a ClassLabel column gives its names to the stats and marks -1 as
    "no gold label" (SNLI), as the ``hf:`` reader always did."""
    columns = list(ds.column_names)
    names = column_names(columns, detect_columns(columns, flags, source))
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
