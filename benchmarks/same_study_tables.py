"""Does this checkout judge a finished study as the one that wrote it did? The check behind "no study number moved".

    python benchmarks/same_study_tables.py STUDY_OUT COPY

Copies the study folder ``STUDY_OUT`` (a study's ``out``, or a synthetic study) to ``COPY``, deletes the copy's
``*study_*`` tables, writes them again from the copy's pair and seed-pair tables with the ``bertology`` on the path
(:func:`bertology.studies.summarise.write_study_tables`), and compares every one exactly with the original
(``pandas.testing.assert_frame_equal(check_exact=True)``). Exit status 1 on any difference.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from same_tables import compare_tables  # noqa: E402

from bertology.studies.summarise import write_study_tables  # noqa: E402


def main(argv: list[str]) -> int:
    src, dst = Path(argv[1]), Path(argv[2])
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    for path in (dst / "tables").glob("*study_*"):
        path.unlink()
    write_study_tables(dst)
    problems = compare_tables(src, dst, "*study_*")
    names = {p.stem for folder in (src, dst) for p in (folder / "tables").glob("*study_*.parquet")}
    for line in problems:
        print(line)
    print(f"{len(names)} study tables compared: " + ("identical" if not problems else f"{len(problems)} difference(s)"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
