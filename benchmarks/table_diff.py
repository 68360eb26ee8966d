"""How far apart are two folders of tables? The largest absolute difference per table and numeric column.

    python benchmarks/table_diff.py TABLES_A TABLES_B [--rtol R]

For a change that is allowed to move numbers by rounding (issue 18: faster ranks, PCA and CKA): every
``*.parquet`` in both folders is read; non-numeric columns must be equal (they are the keys), and
for each float column the largest ``|a - b|`` (NaN equal to NaN) is printed. Exit status 1 when a
table is missing, its shape or keys differ, or a NaN sits on one side only; with ``--rtol R`` also when a
column's largest difference exceeds ``R`` times the column's largest magnitude (at least 1): the check of a GPU
run's float32 tables against the CPU's (``benchmarks/gpu.sh``), where the maps differ by kernel rounding
(~1e-6 relative) and what is computed from them by a few orders more where it divides by small gaps (PCA axes).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd


def table_diff(a: pd.DataFrame, b: pd.DataFrame) -> tuple[dict[str, float], list[str]]:
    """``({float column: max |a - b|}, problems)`` of two tables with the same rows in the same order."""
    if a.shape != b.shape or list(a.columns) != list(b.columns):
        return {}, [f"shape/columns {a.shape} vs {b.shape}"]
    diffs, problems = {}, []
    for col in a.columns:
        x, y = a[col], b[col]
        if pd.api.types.is_float_dtype(x) and pd.api.types.is_float_dtype(y):
            xv, yv = x.to_numpy(), y.to_numpy()
            if (np.isnan(xv) != np.isnan(yv)).any():
                problems.append(f"{col}: NaN on one side only")
            ok = ~np.isnan(xv) & ~np.isnan(yv)
            diffs[col] = float(np.abs(xv[ok] - yv[ok]).max()) if ok.any() else 0.0
        elif not x.equals(y):
            problems.append(f"{col}: values differ")
    return diffs, problems


def beyond(a: pd.DataFrame, diffs: dict[str, float], rtol: float) -> list[str]:
    """The columns whose largest difference exceeds ``rtol`` times their scale (``max |a|``, at least 1)."""
    out = []
    for col, d in diffs.items():
        values = np.abs(a[col].to_numpy(dtype=float))
        scale = max(1.0, float(values[~np.isnan(values)].max())) if (~np.isnan(values)).any() else 1.0
        if d > rtol * scale:
            out.append(f"{col} {d:.1e} > {rtol:g} x {scale:.3g}")
    return out


def main(argv: list[str]) -> int:
    rtol = None
    if "--rtol" in argv:
        i = argv.index("--rtol")
        rtol = float(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
    a, b = Path(argv[1]), Path(argv[2])
    bad = 0
    for pa in sorted(a.glob("*.parquet")):
        pb = b / pa.name
        if not pb.exists():
            print(f"{pa.stem}: missing in {b}")
            bad += 1
            continue
        ta = pd.read_parquet(pa)
        diffs, problems = table_diff(ta, pd.read_parquet(pb))
        if rtol is not None:
            problems += beyond(ta, diffs, rtol)
        bad += bool(problems)
        cols = ", ".join(f"{c} {d:.1e}" for c, d in diffs.items() if d > 0) or "identical"
        print(f"{pa.stem}: {cols}" + (f"; PROBLEMS: {'; '.join(problems)}" if problems else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
