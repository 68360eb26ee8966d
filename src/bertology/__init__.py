"""bertology: what fine-tuning changed inside a BERT-family encoder."""
from __future__ import annotations

__version__ = "0.1.0"

from bertology.errors import BertologyError

__all__ = ["BertologyError", "__version__"]
