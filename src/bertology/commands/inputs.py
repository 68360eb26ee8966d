"""Small settings groups the command functions share: which columns hold the data, how models load.

Each is a frozen dataclass so a command function takes one argument per group instead of many.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from bertology.config import DTYPE_HELP, DTYPES, TRUST_REMOTE_CODE_HELP
from bertology.settings import check_fields, setting_field


@dataclass(frozen=True)
class Columns:
    """Which columns of a CSV/TSV/JSONL file hold the text, the second text of a pair and the label (None: detect)."""

    text: str | None = None
    pair: str | None = None
    label: str | None = None

    def to_dict(self) -> dict:
        """As ``load_corpus`` keywords (and the manifest's ``text_column``, ... entries)."""
        return {"text_column": self.text, "pair_column": self.pair, "label_column": self.label}


@dataclass(frozen=True)
class Loading:
    """How models are loaded: the type they run in (``--dtype``) and whether hub code may run (``--trust-remote-code``);
    declared settings, so a command may generate these flags."""

    dtype: str = setting_field("float32", DTYPE_HELP, choices=DTYPES)
    trust_remote_code: bool = setting_field(False, TRUST_REMOTE_CODE_HELP)

    def __post_init__(self) -> None:
        check_fields(self)


def resolve(device: str, loading: Loading) -> tuple[str, torch.dtype]:
    """The device (``auto`` -> what it chose) and torch dtype, checked before any model is loaded."""
    from bertology.models.device import resolve_device
    from bertology.models.precision import resolve_dtype

    resolved = resolve_device(device)  # a missing GPU or dtype is an error now, not after loading
    return str(resolved), resolve_dtype(loading.dtype, resolved)


def stderr_console():
    """The console progress bars draw on: standard error (standard output stays for what a command prints)."""
    from rich.console import Console

    return Console(stderr=True)
