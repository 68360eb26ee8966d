"""The ``bertology`` command line: thin wrappers that parse flags into config and call the API."""
from __future__ import annotations

from bertology.cli.app import app, main

__all__ = ["app", "main"]
