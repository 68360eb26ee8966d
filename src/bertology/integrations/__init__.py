"""bertology inside other libraries' loops: :class:`BertologyCallback` for a Hugging Face ``Trainer``.

Importing this package imports transformers (the callback subclasses ``TrainerCallback``).
"""
from bertology.integrations.trainer import BertologyCallback, CallbackSettings

__all__ = ["BertologyCallback", "CallbackSettings"]
