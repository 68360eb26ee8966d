"""What a structural probe's score must be judged against: the linear-chain baseline and the probe's capacity.

Part of :mod:`bertology.experiments.probe` (see its docstring for the method).

* **Linear chain** (Hewitt & Manning 2019, Table 1, LINEAR): every word attached to the next, the first word the
  root. It reads no model: its UUAS is the share of gold edges between neighbours, its DSpr how well ``|i - j|``
  orders the tree distances. A probe that does not clear it found no more than word order. Scored by the same
  functions, on the same sentences and the same bootstrap resamples as the probes.
* **Capacity**: a probe ``B`` of rank ``r`` on ``d``-dimensional vectors has ``r d`` weights. With fewer training
  words than that, the depth probe has more weights than targets and may fit the training trees through its
  capacity alone (Hewitt & Liang 2019 on probe selectivity); the run then says so and names a rank that fits.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import pandas as pd

from bertology.experiments.probe_trees import TreeSet
from bertology.metrics.trees import linear_chain_scores

if TYPE_CHECKING:
    from bertology.results import Result

#: The table of the baselines, one row per (baseline, probe, split).
BASELINE_TABLE = "probe_baseline"
_METRICS = {"distance": ("uuas", "dspr"), "depth": ("root_acc", "nspr")}
BASELINE_COLUMNS = ["baseline", "probe", "split", "uuas", "dspr", "root_acc", "nspr", "n_sentences",
                    *(f"{m}_ci_{end}" for m in ("uuas", "dspr", "root_acc", "nspr") for end in ("low", "high"))]


def linear_chain_rows(trees: TreeSet, *, n_bootstrap: int = 0, seed: int = 0) -> list[dict]:
    """The linear-chain baseline on one split's trees, as rows of :data:`BASELINE_TABLE` (the probes' columns)."""
    scores = linear_chain_scores(trees.heads, trees.keep, n_bootstrap=n_bootstrap, seed=seed)
    rows = []
    for probe, metrics in _METRICS.items():
        row: dict = {c: float("nan") for c in BASELINE_COLUMNS}
        row.update(baseline="linear_chain", probe=probe, split=trees.name, n_sentences=len(trees))
        for m in metrics:
            row[m] = float(scores[m])
            if f"{m}_ci" in scores:
                row[f"{m}_ci_low"], row[f"{m}_ci_high"] = map(float, scores[f"{m}_ci"])
        rows.append(row)
    return rows


def baseline_table(splits: Mapping[str, TreeSet], *, n_bootstrap: int = 0, seed: int = 0) -> pd.DataFrame:
    """The baselines of the dev and test splits (the ones the probes are scored on)."""
    rows = [r for name in ("dev", "test") if name in splits
            for r in linear_chain_rows(splits[name], n_bootstrap=n_bootstrap, seed=seed)]
    return pd.DataFrame(rows, columns=BASELINE_COLUMNS)


def baseline_record(table: pd.DataFrame) -> list[dict]:
    """The baseline table as JSON rows (a run's params and manifest: NaN written as null)."""
    return [{k: (None if isinstance(v, float) and v != v else v) for k, v in row.items()}
            for row in table.to_dict("records")]


def baseline_result(params: Mapping) -> "Result | None":
    """The :data:`BASELINE_TABLE` result from a probe result's ``params["linear_chain"]`` (None: a run without it)."""
    from bertology.results import Result

    rows = params.get("linear_chain")
    if rows is None:
        return None
    table = pd.DataFrame(rows, columns=BASELINE_COLUMNS)
    floats = [c for c in BASELINE_COLUMNS if c not in ("baseline", "probe", "split", "n_sentences")]
    table[floats] = table[floats].astype(float)
    return Result(BASELINE_TABLE, table, {"baseline": "linear chain (Hewitt & Manning 2019, LINEAR)"})


def capacity_warning(n_train_words: int, rank: int, hidden: int) -> str | None:
    """A warning when the training trees have fewer words than a probe has weights (``rank x hidden``), else None."""
    weights = rank * hidden
    if n_train_words >= weights:
        return None
    fits = n_train_words // hidden
    advice = (f"lower --probe-rank to {fits} or less, or give more training sentences" if fits >= 1
              else "give more training sentences")
    return (f"Structural probes: the training trees have {n_train_words:,} words for {weights:,} weights per probe "
            f"(rank {rank} x hidden {hidden}): a probe with more weights than targets may fit the training trees "
            f"by its capacity alone, not by what the layer encodes; {advice}.")
