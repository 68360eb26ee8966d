"""Encoder families as data: :func:`adapter_for` looks one up by ``config.model_type``."""
from bertology.models.adapters import families as _families  # noqa: F401  (registers every family)
from bertology.models.adapters.base import (
    Adapter,
    adapter_for,
    get_path,
    register_adapter,
    registered,
    supported_model_types,
)

__all__ = ["Adapter", "adapter_for", "get_path", "register_adapter", "registered", "supported_model_types"]
