"""Are two run folders' tables identical? The check behind "the reshape changed no number".

    python benchmarks/same_tables.py RUN_A RUN_B

Every ``tables/*.parquet`` of either run is compared exactly (same columns, dtypes, rows, values;
NaN equals NaN), and the numbers the two reports print are compared after removing what a render
legitimately changes (timestamps, run paths, wall times). Exit status 1 on any difference.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pandas as pd

#: What differs between two renders of the same numbers: the manifest as printed (its key order,
#: fingerprint, timings and package list are provenance, not results), wall times, timestamps, fingerprints.
VOLATILE = (
    r'<pre class="manifest">.*?</pre>',
    r'<tr><th scope="row">[^\n]*?(?:timing_s|Wall time)[^\n]*?</tr>',  # how long it took, not what it found
    r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:\+00:00|Z)?",
    r"\b[0-9a-f]{16}\b",
)


def compare_tables(a: Path, b: Path, pattern: str = "*") -> list[str]:
    """One line per table (those whose name matches ``pattern``) that is missing on one side or differs."""
    names = sorted({p.stem for p in (a / "tables").glob(f"{pattern}.parquet")}
                   | {p.stem for p in (b / "tables").glob(f"{pattern}.parquet")})
    problems = []
    for name in names:
        pa, pb = a / "tables" / f"{name}.parquet", b / "tables" / f"{name}.parquet"
        if not (pa.exists() and pb.exists()):
            problems.append(f"{name}: only in {a if pa.exists() else b}")
            continue
        try:
            pd.testing.assert_frame_equal(pd.read_parquet(pa), pd.read_parquet(pb), check_exact=True)
        except AssertionError as err:
            problems.append(f"{name}: {str(err).splitlines()[0]}")
    return problems


def report_numbers(run: Path) -> list[str]:
    """The numbers the report's HTML prints, in page order, with render-specific text removed."""
    html = (run / "report.html").read_text(encoding="utf-8")
    html = re.sub(r"<script.*?</script>", "", html, flags=re.S)  # the embedded manifest and viewer data
    html = html.replace(str(run), "RUN")
    for pattern in VOLATILE:
        html = re.sub(pattern, "", html, flags=re.S)
    return re.findall(r"[-+−]?\d+(?:\.\d+)?(?:e[-+]?\d+)?", html)


def main(argv: list[str]) -> int:
    a, b = (Path(x) for x in argv[1:3])
    problems = compare_tables(a, b)
    n = len(list((a / "tables").glob("*.parquet")))
    if (a / "report.html").exists() and (b / "report.html").exists():
        na, nb = report_numbers(a), report_numbers(b)
        if na != nb:
            first = next((i for i, (x, y) in enumerate(zip(na, nb)) if x != y), min(len(na), len(nb)))
            problems.append(f"report: {len(na)} vs {len(nb)} numbers; first difference at #{first}: "
                            f"{na[first] if first < len(na) else '-'} vs {nb[first] if first < len(nb) else '-'}")
        else:
            print(f"report: the same {len(na)} numbers")
    for line in problems:
        print(line)
    print(f"{n} tables compared: " + ("identical" if not problems else f"{len(problems)} difference(s)"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
