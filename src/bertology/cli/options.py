"""Typer options that several commands share, declared once so every command spells them the same way.

A constant where every command uses the flag identically; otherwise a small factory that fixes the
flag's spelling (and its usual help text) and takes what rightly differs between commands: the
default (``--batch-size 32`` to compare, ``20`` to probe) or a help text naming what the flag drives
in that command (what ``--seed`` seeds). Commands import from here, never from each other.
"""
from __future__ import annotations

from typing import Any

import typer

from bertology.config import TRUST_REMOTE_CODE_HELP

#: The corpus formats every ``--data``-like flag accepts.
DATA_FORMATS = ".txt/.csv/.tsv/.jsonl/.conllu/.json (SQuAD) file, a .conll/.bio/.iob tag file, or hf:NAME[:CONFIG]:SPLIT"


def data_option(default: Any = ..., help: str = f"A {DATA_FORMATS}.") -> Any:  # noqa: A002 - typer's keyword
    """``--data``: the corpus (required unless ``default`` is given)."""
    return typer.Option(default, "--data", help=help)


DATA_OPT = data_option()
TEXT_COL = typer.Option(None, "--text-column", help="Column with the (first) sentence; auto-detected for GLUE layouts.")
PAIR_COL = typer.Option(None, "--pair-column", help="Column with the second sentence of a pair.")
LABEL_COL = typer.Option(None, "--label-column", help="Column with the label.")
TRUST_REMOTE_CODE_OPT = typer.Option(False, "--trust-remote-code", help=TRUST_REMOTE_CODE_HELP)


def model_option(default: Any = "minilm", help: str = "Model: hub id, local folder, or built-in 'minilm'.") -> Any:  # noqa: A002
    """``--model``: the one model a command works on."""
    return typer.Option(default, "--model", help=help)


def base_option(default: Any = "minilm", help: str = "Pretrained model: hub id, local folder, or 'minilm'.") -> Any:  # noqa: A002
    """``--base``: the pretrained side of a comparison."""
    return typer.Option(default, "--base", help=help)


def tuned_option(default: Any, help: str, metavar: str | None = None) -> Any:  # noqa: A002
    """``--tuned``: the fine-tuned side of a comparison (``compare`` takes it repeatedly, as NAME=PATH)."""
    return typer.Option(default, "--tuned", help=help, metavar=metavar)


def out_option(default: Any, help: str) -> Any:  # noqa: A002
    """``--out``: where a command writes (a run folder or a file; each command has its own default)."""
    return typer.Option(default, "--out", help=help)


def overwrite_option(help: str = "Replace a different run already in --out.") -> Any:  # noqa: A002
    """``--overwrite``: replace what is already in ``--out`` instead of refusing (or resuming)."""
    return typer.Option(False, "--overwrite", help=help)


def no_report_option(help: str = "Write tables and figures only, no report.html.") -> Any:  # noqa: A002
    """``--no-report``: skip report.html."""
    return typer.Option(False, "--no-report", help=help)


def seed_option(help: str = "Seed of every random choice.") -> Any:  # noqa: A002
    """``--seed`` (default 0): ``help`` says what it seeds in this command."""
    return typer.Option(0, "--seed", help=help)


def max_length_option(default: int, help: str, min: int | None = None) -> Any:  # noqa: A002
    """``--max-length``: tokens per input; ``help`` says whether longer ones are skipped, truncated or refused."""
    return typer.Option(default, "--max-length", help=help, min=min)


def epochs_option(default: float, help: str, min: int | None = None) -> Any:  # noqa: A002
    """``--epochs``: passes over the training data."""
    return typer.Option(default, "--epochs", help=help, min=min)

