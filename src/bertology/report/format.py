"""Pure text helpers of the report: how a value reads in a cell, sorts in a column, and travels as JSON.

They hold no state and know no section, so every section module (and the template's ``num`` filter)
formats numbers the same way.
"""
from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

import pandas as pd

__all__ = ["flatten", "fmt_value", "humanize", "jsonable", "mapping", "slug", "sort_key", "sortable", "unique_text"]


def _is_missing(value: Any) -> bool:
    """True for None and NaN: the cells shown as an em dash."""
    if value is None:
        return True
    try:
        return isinstance(value, float) and math.isnan(value)
    except TypeError:  # pragma: no cover
        return False


def fmt_value(value: Any, digits: int = 4) -> str:
    """Human format for a table cell: thousands separators, 4 significant digits, — for missing."""
    if _is_missing(value):
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        try:
            value = value.item()  # numpy scalar -> python
        except (ValueError, AttributeError):
            pass
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isinf(value):
            return "∞" if value > 0 else "−∞"
        if value == 0:
            return "0"
        if value.is_integer() and abs(value) < 1e15:
            return f"{int(value):,}"
        if 1e3 <= abs(value) < 1e15:
            return f"{value:,.0f}"
        if 1e-3 <= abs(value) < 1e3:
            text = f"{value:.{digits}g}"
            # "1.000" (not "1") when 0.99996 rounds to 1: the reader must not take it for exact.
            return text if ("." in text or "e" in text) else f"{value:#.{digits}g}"
        return f"{value:.{digits}g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(fmt_value(v, digits) for v in value) if value else "—"
    if isinstance(value, Mapping):
        return json.dumps(jsonable(value), sort_keys=True)
    return str(value)


def sort_key(value: Any) -> str:
    """Raw value for client-side sorting (``data-value``)."""
    if _is_missing(value):
        return ""
    if isinstance(value, bool):
        return str(int(value))
    if hasattr(value, "item"):
        try:
            value = value.item()
        except (ValueError, AttributeError):
            pass
    if isinstance(value, (int, float)):
        return repr(float(value))
    return str(value)


def jsonable(obj: Any) -> Any:
    """A JSON-safe copy: NaN/inf -> None, unknown objects -> str."""
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, (int, str)):
        return obj
    if isinstance(obj, float):
        return None if (math.isnan(obj) or math.isinf(obj)) else obj
    if hasattr(obj, "item"):
        try:
            return jsonable(obj.item())
        except (ValueError, AttributeError):
            pass
    return str(obj)


def flatten(d: Mapping, prefix: str = "") -> list[tuple[str, Any]]:
    """Nested mappings as (dotted key, leaf value) pairs, in their order: settings read as one list."""
    out: list[tuple[str, Any]] = []
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.extend(flatten(value, f"{name}."))
        else:
            out.append((name, value))
    return out


def humanize(key: str) -> str:
    """A label for a raw key: ``n_tokens`` -> ``Tokens (count)``, dots -> ``›``."""
    if key.startswith("n_"):
        key = key[2:] + " (count)"
    text = key.replace("_", " ").replace(".", " › ")
    return text[:1].upper() + text[1:]


def mapping(value: Any) -> dict:
    """``value`` as a dict, or {} when the manifest holds something else there."""
    return dict(value) if isinstance(value, Mapping) else {}


def unique_text(series: pd.Series) -> str:
    """The distinct values of a column in a few words: one value, a range, or a short list."""
    values = sorted(pd.unique(series.dropna()).tolist(), key=lambda v: (str(type(v)), v))
    if not values:
        return "—"
    if len(values) == 1:
        return fmt_value(values[0])
    if len(values) > 4 and all(isinstance(v, (int, float)) for v in values):
        return f"{fmt_value(min(values))}–{fmt_value(max(values))}"
    return ", ".join(fmt_value(v) for v in values)


def sortable(columns: list[tuple[str, str, str]], rows: list[list[Any]]) -> dict:
    """A sortable table for the template: columns as (key, label, type), cells formatted by fmt_value."""
    return {
        "columns": [{"key": k, "label": label, "type": t} for k, label, t in columns],
        "rows": [[{"text": v if isinstance(v, str) else fmt_value(v), "value": v if isinstance(v, str) else sort_key(v)}
                  for v in row] for row in rows],
    }


def slug(text: str) -> str:
    """A file-name-safe form of a user-given name."""
    return re.sub(r"[^A-Za-z0-9_-]+", "_", text)[:40] or "relation"
