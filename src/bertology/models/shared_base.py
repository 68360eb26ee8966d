"""One copy of the base for an adapter compared with it: the adapted model built on the base already in memory.

``compare --base B --tuned ADAPTER`` loads ``B`` once. The tuned model is then built without loading ``B`` again: its
skeleton is made on the ``meta`` device (no memory), every tensor the base has under the same name and shape is the
base's own tensor (the same storage: ``data_ptr`` equal), and only the tensors the base lacks (the task head) are
allocated and initialised as ``from_pretrained`` initialises missing weights. The adapter is then merged with peft's
safe merge (``merge_and_unload(safe_merge=True)``), which writes each merged target matrix into a new tensor, never
into the shared one: the base's outputs stay what they were. In the end the tuned model's own tensors are the merged
target matrices and the task head (peft's ``modules_to_save``); everything else is the base's.

:func:`to_device_together` moves such a pair to a device keeping the shared tensors shared (``model.to(device)`` on
each model would give each its own copy).
"""
from __future__ import annotations

import copy
import logging

import torch
from torch import nn

logger = logging.getLogger(__name__)

#: ``load_model``'s head kinds -> the transformers auto class the adapter's model is built with.
KIND_CLASSES = {"encoder": "AutoModel", "classifier": "AutoModelForSequenceClassification",
                "token_classifier": "AutoModelForTokenClassification", "qa": "AutoModelForQuestionAnswering"}


def _encoder(model: nn.Module) -> nn.Module:
    """The bare encoder of a task model (``base_model``), or the model itself."""
    return getattr(model, "base_model", None) or model


def _tensors(module: nn.Module):
    """``(store, name, tensor)`` for the module's own parameters and buffers (not its children's)."""
    for store in (module._parameters, module._buffers):
        for name, tensor in list(store.items()):
            if tensor is not None:
                yield store, name, tensor


def skeleton_on_base(base_model: nn.Module, kind: str, *, num_labels: int | None, dtype: torch.dtype,
                     trust_remote_code: bool = False) -> tuple[nn.Module, list[str]]:
    """A model of ``kind`` (a head kind of :data:`KIND_CLASSES`) whose tensors are ``base_model``'s wherever it has
    them (same name inside the encoder, or the same full name outside it, and the same shape and dtype), in eval mode.
    Returns the model and the names of the tensors made fresh (the head the base lacks), as ``from_pretrained``'s
    missing keys."""
    import transformers

    config = copy.deepcopy(_encoder(base_model).config)
    if num_labels is not None and kind in ("classifier", "token_classifier"):
        config.num_labels = num_labels
    cls = getattr(transformers, KIND_CLASSES[kind])
    with torch.device("meta"):
        model = cls.from_config(config, attn_implementation="eager", dtype=dtype, trust_remote_code=trust_remote_code)
    encoder = _encoder(model)
    enc_path = next(path for path, module in model.named_modules() if module is encoder)
    base_modules, base_enc_modules = dict(base_model.named_modules()), dict(_encoder(base_model).named_modules())
    fresh: list[str] = []
    for path, module in model.named_modules():
        inside = enc_path == "" or path == enc_path or path.startswith(enc_path + ".")
        relative = path if enc_path == "" else path[len(enc_path) + 1:]
        source = base_enc_modules.get(relative) if inside else base_modules.get(path)
        made = False
        for store, name, tensor in _tensors(module):
            other = None if source is None else (source._parameters if store is module._parameters
                                                 else source._buffers).get(name)
            if other is not None and other.shape == tensor.shape and other.dtype == tensor.dtype:
                # the base's storage under a Parameter of the tuned model's own: rebinding it never touches the base
                store[name] = nn.Parameter(other.detach(), requires_grad=False) if isinstance(tensor, nn.Parameter) else other
            else:
                new = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu")
                store[name] = nn.Parameter(new, requires_grad=False) if isinstance(tensor, nn.Parameter) else new
                fresh.append(f"{path}.{name}" if path else name)
                made = True
        if made:
            model._init_weights(module)
    return model.eval(), fresh


def sharing_counts(base_model: nn.Module, tuned_model: nn.Module) -> dict:
    """How many of the tuned model's tensors are the base's own (same storage) and how many are its own, with the
    parameters its own tensors hold."""
    base_ptrs = {t.data_ptr() for t in (*base_model.parameters(), *base_model.buffers())}
    tensors = [*tuned_model.parameters(), *tuned_model.buffers()]
    own = [t for t in tensors if t.data_ptr() not in base_ptrs]
    return {"shared_tensors": len(tensors) - len(own), "own_tensors": len(own),
            "own_parameters": int(sum(t.numel() for t in own))}


def to_device_together(models, device: torch.device | str, dtype: torch.dtype | None = None) -> None:
    """Move ``models`` to ``device`` (their floating tensors to ``dtype`` when given) in eval mode, each tensor once:
    tensors that share storage (an adapted model and its base, :func:`skeleton_on_base`) share it there too."""
    device = torch.device(device)
    moved: dict[tuple, torch.Tensor] = {}
    for model in models:
        for module in model.modules():
            for store, name, tensor in _tensors(module):
                key = (tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tensor.stride(), tensor.storage_offset())
                new = moved.get(key)
                if new is None:
                    to = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
                    new = moved[key] = tensor.detach().to(device, to)
                if new.data_ptr() == tensor.data_ptr():
                    continue  # already there
                store[name] = nn.Parameter(new, requires_grad=tensor.requires_grad) if isinstance(tensor, nn.Parameter) else new
        model.eval()
