"""Summarise a study directory: the ``study_*`` tables and the study report, in one call.

``summarise_study(STUDY)`` reads the study's pair tables (``STUDY/tables/<table>.parquet``) and
seed-vs-seed tables (``STUDY/tables/seedpair_<table>.parquet``), computes the seed-noise tables with
:func:`bertology.studies.noise.study_tables`, writes them beside the others (``study_*.parquet`` and
``.csv``; the same on the tasks' own dev data, ``own_study_*``, and on the out-of-domain corpus,
``study_*_ood``, when the study has those tables) and renders ``STUDY/report.html`` with :func:`bertology.report.study.render_study_report`.
From a shell: ``python -m bertology.studies.summarise STUDY [--alpha 0.05]``.
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path

import pandas as pd

from bertology.errors import BertologyError
from bertology.results import write_table
from bertology.studies.crosscoder_seeds import DIRECTIONS, FIT, study_seed_tables
from bertology.studies.noise import ALPHA, CORPORA, corpus_study_tables, corpus_table, judged

logger = logging.getLogger(__name__)

__all__ = ["read_study_tables", "summarise_study", "write_study_tables"]


def read_study_tables(study_dir: str | Path, corpus: str = "shared") -> tuple[dict[str, pd.DataFrame], dict[str, pd.DataFrame]]:
    """The base-vs-tuned tables and the ``seedpair_*`` tables of ``corpus`` under ``STUDY/tables/`` (Parquet).

    Keyed by their shared-corpus names (``attention_change``, ``seedpair_attention_change``) whatever the
    corpus (``own_attention_change`` on the tasks' own dev data; see :data:`~bertology.studies.noise.CORPORA`).
    """
    folder, names = Path(study_dir) / "tables", judged()
    found = {name: folder / f"{corpus_table(name, corpus)}.parquet" for name in names}
    base = {name: pd.read_parquet(path) for name, path in found.items() if path.exists()}
    found = {f"seedpair_{name}": folder / f"{corpus_table(f'seedpair_{name}', corpus)}.parquet" for name in names}
    seeds = {name: pd.read_parquet(path) for name, path in found.items() if path.exists()}
    return base, seeds


def write_study_tables(study_dir: str | Path, *, alpha: float = ALPHA) -> dict[str, pd.DataFrame]:
    """Compute the seed-noise tables of every corpus from ``STUDY/tables/`` and write them there.

    :func:`~bertology.studies.noise.corpus_study_tables`: ``study_*`` on the shared corpus, ``own_study_*`` on
    the tasks' own dev data and ``study_*_ood`` on the out-of-domain corpus, where the study has them.
    """
    study_dir = Path(study_dir)
    if not study_dir.is_dir():
        raise BertologyError(f"Study directory {study_dir} does not exist or is not a folder.")
    found: dict[str, pd.DataFrame] = {}
    for corpus in CORPORA:
        base, seeds = read_study_tables(study_dir, corpus)
        found.update({corpus_table(name, corpus): df for name, df in {**base, **seeds}.items()})
    names = judged()
    if not any(name in found for name in names):
        raise BertologyError(
            f"{study_dir / 'tables'} holds none of the study's pair tables ({', '.join(names)}); nothing to summarise."
        )
    tables = corpus_study_tables(found, alpha=alpha)
    directions = study_dir / "tables" / f"{DIRECTIONS}.parquet"
    if directions.exists():
        fit = study_dir / "tables" / f"{FIT}.parquet"
        read = {DIRECTIONS: pd.read_parquet(directions), **({FIT: pd.read_parquet(fit)} if fit.exists() else {})}
        tables.update(study_seed_tables(read, alpha=alpha))
    for name, df in tables.items():
        write_table(study_dir, name, df)
    return tables


def summarise_study(study_dir: str | Path, *, alpha: float = ALPHA) -> Path:
    """Write the ``study_*`` tables and ``STUDY/report.html``; return the report's path."""
    from bertology.report.study import render_study_report

    write_study_tables(study_dir, alpha=alpha)
    return render_study_report(study_dir)


def main(argv: list[str] | None = None) -> int:
    """``python -m bertology.studies.summarise STUDY [--alpha A]``."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m bertology.studies.summarise",
                                     description="Seed-noise tables and the study report of a study directory.")
    parser.add_argument("study_dir")
    parser.add_argument("--alpha", type=float, default=ALPHA, help="level of the seed-noise rule (default 0.05)")
    args = parser.parse_args(argv)
    try:
        print(summarise_study(args.study_dir, alpha=args.alpha))
    except BertologyError as err:
        print(f"Error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
