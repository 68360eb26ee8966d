"""PEFT adapters (LoRA and the other methods of the ``peft`` library) as models bertology can analyse.

An adapter folder (or hub id) holds ``adapter_config.json`` and the adapter's weights, not a whole model.
It is put on its base (the ``base_model_name_or_path`` it records, or the base a comparison names) with
``peft``, the task head saved with it (``modules_to_save``) is kept, and the adapter is merged into the
weights (``merge_and_unload``): every analysis sees an ordinary model whose weights are the base's plus
the adapter's update. Merging holds a second copy of the base's weights; the manifest says so.
"""
from __future__ import annotations

import hashlib
import logging
import os
import warnings
from pathlib import Path

import torch

from bertology.errors import BertologyError

logger = logging.getLogger(__name__)

#: The file that makes a folder a PEFT adapter.
ADAPTER_CONFIG = "adapter_config.json"
#: Full-model weight files: a folder holding one of them is a model, even beside an adapter_config.json.
_FULL_WEIGHTS = ("model*.safetensors", "pytorch_model*.bin")
#: peft's task types -> the head bertology loads the base with (``load_model``'s ``kind``).
TASK_KINDS = {"SEQ_CLS": "classifier", "TOKEN_CLS": "token_classifier", "QUESTION_ANS": "qa",
              "FEATURE_EXTRACTION": "encoder"}
PEFT_MISSING = "{where} is a PEFT adapter; reading it needs the peft library: pip install 'bertology[peft]'."


def is_adapter_folder(path: str | os.PathLike) -> bool:
    """A local folder holding a PEFT adapter (``adapter_config.json``) and no full model weights."""
    folder = Path(path)
    return (folder / ADAPTER_CONFIG).is_file() and not any(any(folder.glob(g)) for g in _FULL_WEIGHTS)


def _peft(where: str):
    try:
        import peft
    except ImportError:
        raise BertologyError(PEFT_MISSING.format(where=where)) from None
    return peft


def adapter_config(where: str):
    """The adapter's ``PeftConfig`` (local folder or hub id), or one clear error."""
    peft = _peft(where)
    try:
        return peft.PeftConfig.from_pretrained(where)
    except (OSError, ValueError) as err:
        raise BertologyError(f"Could not read the PEFT adapter config of {where!r}: {err}") from None


def hub_adapter(where: str) -> bool:
    """Whether a hub id that has no ``config.json`` is a PEFT adapter (False when peft is not installed)."""
    try:
        import peft
    except ImportError:
        return False
    try:
        peft.PeftConfig.from_pretrained(where)
    except (OSError, ValueError):
        return False
    return True


def _weights_file(where: str, source: str) -> Path | None:
    """The adapter's safetensors file on disk (downloaded into the hub cache for a hub id), or None."""
    if source != "hub":
        path = Path(where) / "adapter_model.safetensors"
        return path if path.is_file() else None
    try:
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(where, "adapter_model.safetensors"))
    except Exception:  # noqa: BLE001 - no safetensors on the hub: the head size stays the base's default
        return None


def saved_head_labels(path: Path | None) -> int | None:
    """How many outputs the task head saved with a local adapter has (its last layer's rows), or None.

    peft saves ``modules_to_save`` (the task head) beside the adapter weights; the base must be loaded with
    a head of the same size for them to load. The head's output layer is its 2-D weight with the fewest
    rows (a RoBERTa head's ``dense`` is hidden x hidden, its ``out_proj`` labels x hidden).
    """
    from safetensors import safe_open

    if path is None:
        return None
    with safe_open(str(path), "pt") as f:
        shapes = [f.get_slice(k).get_shape() for k in f.keys() if "lora_" not in k and k.endswith(".weight")]
    rows = [s[0] for s in shapes if len(s) == 2]
    return min(rows) if rows else None


def unsaved_fresh_weights(fresh: list[str], weights: Path | None) -> list[str]:
    """The weights initialised fresh on the base (not in its checkpoint) that the adapter does not hold either.

    peft saves only the LoRA matrices and ``modules_to_save``; a head part outside them (DeBERTa's pooler,
    DistilBERT's pre_classifier, when not listed) is random at every load, so its outputs cannot be the
    trained model's. Saved keys look like ``base_model.model.<name>`` (``modules_to_save.default`` inside).
    """
    from safetensors import safe_open

    if not fresh:
        return []
    saved: set[str] = set()
    if weights is not None:
        with safe_open(str(weights), "pt") as f:
            saved = {k.removeprefix("base_model.model.").replace("modules_to_save.default.", "") for k in f.keys()}
    return [k for k in fresh if k not in saved]


def _name(value) -> str | None:
    """An enum member's value (peft's ``PeftType.LORA`` -> ``"LORA"``), a string as it is."""
    return None if value is None else str(getattr(value, "value", value))


def _identity(base_sha: str | None, base_name: str, adapter_sha: str | None, where: str) -> str:
    """An adapted model's identity for fingerprints: its base's and its adapter's weights together."""
    return hashlib.sha256(f"{base_sha or base_name}\n{adapter_sha or where}".encode()).hexdigest()


def load_adapter(name: str, where: str, source: str, *, base: str | None = None, kind: str = "auto",
                 trust_remote_code: bool = False, dtype: torch.dtype = torch.float32):
    """Put the adapter at ``where`` on ``base`` (default: the base it records), merge it; a ``LoadedModel``.

    ``kind="auto"`` loads the base with the head the adapter's task type needs (a sequence classifier
    for ``SEQ_CLS``...); the saved head's weights then replace the fresh ones. A base of another shape
    is one clear error naming the base the adapter records.
    """
    from bertology.models.loading import LoadedModel, load_model, quiet_transformers, weights_fingerprint

    peft = _peft(where)
    cfg = adapter_config(where)
    recorded = cfg.base_model_name_or_path
    base_name = base or recorded
    if not base_name:
        raise BertologyError(f"The adapter {name!r} does not record its base model; pass the base (--base).")
    want = TASK_KINDS.get(_name(cfg.task_type), "encoder") if kind == "auto" else kind
    labels = saved_head_labels(_weights_file(where, source)) if want in ("classifier", "token_classifier") else None
    base_loaded = load_model(base_name, want, trust_remote_code=trust_remote_code, num_labels=labels, dtype=dtype)
    try:
        with quiet_transformers(), warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # peft asks transformers a deprecated question
            wrapped = peft.PeftModel.from_pretrained(base_loaded.model, where)
            merged = wrapped.merge_and_unload()
    except (RuntimeError, ValueError, KeyError) as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()] or [type(err).__name__]
        detail = next((line for line in lines if "size mismatch" in line), lines[0])[:300]
        raise BertologyError(
            f"The PEFT adapter {name!r} does not fit the base {base_name!r} ({detail}); put it on the base it was "
            f"trained from: --base {recorded!r} (the base it records)."
        ) from None
    merged.eval()
    unsaved = unsaved_fresh_weights(base_loaded.extra.get("fresh_weights", []), _weights_file(where, source))
    if unsaved:
        logger.warning("The adapter %s does not hold %s, which its base %s lacks too: they are random here, so the "
                       "task head's outputs (ablation, the head's predictions) are not the trained model's. Save them "
                       "with the adapter (modules_to_save).", name, ", ".join(unsaved), base_name)
    adapter_sha = weights_fingerprint(where) if source != "hub" else None
    info = {"peft_type": _name(cfg.peft_type), "task_type": _name(cfg.task_type), "base": base_name,
            "recorded_base": recorded, "merged": True,
            "weights": "the adapter merged into a copy of its base (merge_and_unload); the base is held twice",
            "adapter_sha256": adapter_sha, "unsaved_head_weights": unsaved}
    for key in ("r", "lora_alpha", "target_modules", "modules_to_save"):
        value = getattr(cfg, key, None)
        if value is not None:
            info[key] = sorted(value) if isinstance(value, set) else value
    return LoadedModel(model=merged, tokenizer=base_loaded.tokenizer, name=name, source=source, path=where,
                       is_classifier=base_loaded.is_classifier,
                       weights_sha256=_identity(base_loaded.weights_sha256, base_name, adapter_sha, where),
                       extra={"adapter": info})
