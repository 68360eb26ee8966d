"""Stand-in; replaced by S1's shared-base version at merge.

``compare_many`` honouring only the agreed contract: a loop of :func:`bertology.pipeline.compare`, one
pair run per tuned model in ``OUT/pairs/<slug>/``, the pair tables stacked with ``tuned, task, seed``
first in ``OUT/tables/``, ``OUT/manifest.json`` and a plain ``OUT/report.html`` index.
"""
from __future__ import annotations

import dataclasses
import html
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from bertology.config import CompareConfig
from bertology.errors import BertologyError
from bertology.pipeline import CompareRun, compare
from bertology.results import atomic_write_text, now_iso, write_table

KEYS = ("tuned", "task", "seed")


@dataclass(frozen=True)
class TunedModel:
    name: str
    path: str
    task: str | None = None
    seed: int | None = None

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9._~+=-]", "_", self.name.replace("/", "~"))


@dataclass
class ManyCompareRun:
    out: Path
    pairs: dict[str, CompareRun]
    tables: dict[str, pd.DataFrame]
    manifest: dict


def compare_many(config: CompareConfig, tuned: Sequence[TunedModel], *, corpus=None, overwrite: bool = False,
                 progress: bool = False, report: bool = True) -> ManyCompareRun:
    """``config.base`` against each tuned model (see module docs)."""
    names = [t.name for t in tuned]
    if len(set(names)) != len(names):
        raise BertologyError(f"Tuned model names repeat: {names}.")
    out = Path(config.out)
    pairs = {}
    for t in tuned:
        cfg = dataclasses.replace(config, tuned=t.path, out=str(out / "pairs" / t.slug))
        pairs[t.name] = compare(cfg, corpus=corpus, overwrite=overwrite, progress=progress, report=report)
    tables: dict[str, pd.DataFrame] = {}
    for name in dict.fromkeys(n for run in pairs.values() for n in run.results):
        parts = []
        for t in tuned:
            res = pairs[t.name].results.get(name)
            if res is None:
                continue
            df = res.table.rename(columns={c: f"{name}_{c}" for c in KEYS if c in res.table.columns})
            keys = pd.DataFrame({"tuned": t.name, "task": pd.Series([t.task] * len(df), dtype="string"),
                                 "seed": pd.array([t.seed] * len(df), dtype="Int64")}, index=df.index)
            parts.append(pd.concat([keys, df], axis=1))
        tables[name] = pd.concat(parts, ignore_index=True)
        write_table(out, name, tables[name])
    manifest = {"kind": "compare_many", "status": "complete", "finished": now_iso(), "base": config.base,
                "pairs": [{"tuned": t.name, "task": t.task, "seed": t.seed, "path": t.path, "dir": f"pairs/{t.slug}",
                           "report": f"pairs/{t.slug}/report.html" if report else None} for t in tuned],
                "tables": sorted(tables)}
    atomic_write_text(out / "manifest.json", json.dumps(manifest, indent=2))
    if report:
        rows = "".join(f'<li><a href="pairs/{html.escape(t.slug)}/report.html">{html.escape(t.name)}</a></li>' for t in tuned)
        atomic_write_text(out / "report.html", f"<!doctype html><title>compare_many</title><ul>{rows}</ul>")
    return ManyCompareRun(out, pairs, tables, manifest)
