"""PEFT adapters (LoRA and the other methods of the ``peft`` library) as models bertology can analyse.

An adapter folder (or hub id) holds ``adapter_config.json`` and the adapter's weights, not a whole model.
It is put on its base (the ``base_model_name_or_path`` it records, or the base a comparison names) with
``peft``, the task head saved with it (``modules_to_save``) is kept, and the adapter is merged into the
weights (``merge_and_unload``): every analysis sees an ordinary model whose weights are the base's plus
the adapter's update. Put on a base already in memory (the base of a comparison), the merged model shares every
tensor the adapter does not change with that base (:mod:`bertology.models.shared_base`); loaded on its own, it holds
a second copy of the base's weights. The manifest says which.
"""
from __future__ import annotations

import hashlib
import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bertology.errors import BertologyError

logger = logging.getLogger(__name__)

#: The file that makes a folder a PEFT adapter.
ADAPTER_CONFIG = "adapter_config.json"
#: Full-model weight files: a folder holding one of them is a model, even beside an adapter_config.json.
_FULL_WEIGHTS = ("model*.safetensors", "pytorch_model*.bin")
#: The trained model's label names and bertology's own config fields (the tag field...), saved beside an adapter made
#: by ``finetune --method lora``: the base's config lacks them, and a tagger's or classifier's task reads them.
TASK_CONFIG = "task_config.json"
#: peft's task types -> the head bertology loads the base with (``load_model``'s ``kind``).
TASK_KINDS = {"SEQ_CLS": "classifier", "TOKEN_CLS": "token_classifier", "QUESTION_ANS": "qa",
              "FEATURE_EXTRACTION": "encoder"}


def is_adapter_folder(path: str | os.PathLike) -> bool:
    """A local folder holding a PEFT adapter (``adapter_config.json``) and no full model weights."""
    folder = Path(path)
    return (folder / ADAPTER_CONFIG).is_file() and not any(any(folder.glob(g)) for g in _FULL_WEIGHTS)


def import_peft(needs: str):
    """The ``peft`` module, or one clear error: "``needs`` needs the peft library" and the extra that installs it."""
    try:
        import peft
    except ImportError:
        raise BertologyError(f"{needs} needs the peft library: pip install 'bertology[peft]'.") from None
    return peft


def task_config_fields(config) -> dict:
    """The fields of a trained model's config that its task reads and its base lacks: ``id2label``, ``label2id``,
    ``problem_type`` and bertology's own (``bertology_*``, e.g. a tagger's tag field)."""
    d = config.to_dict()
    keep = [k for k in d if k in ("id2label", "label2id", "problem_type") or k.startswith("bertology_")]
    return {k: d[k] for k in keep if d[k] is not None}


def save_task_config(config, folder: str | os.PathLike) -> None:
    """Write :data:`TASK_CONFIG` (:func:`task_config_fields` of ``config``) into an adapter folder."""
    import json

    (Path(folder) / TASK_CONFIG).write_text(json.dumps(task_config_fields(config), indent=2, sort_keys=True))


def apply_task_config(model: torch.nn.Module, where: str, source: str) -> dict:
    """Put a local adapter's :data:`TASK_CONFIG` (when it has one) on the adapted model's config; what was put."""
    import json

    path = Path(where) / TASK_CONFIG
    if source == "hub" or not path.is_file():
        return {}
    try:
        fields = json.loads(path.read_text())
    except ValueError as err:
        raise BertologyError(f"{path} is not JSON ({err}); save the adapter again.") from None
    if "id2label" in fields:
        fields["id2label"] = {int(k): v for k, v in fields["id2label"].items()}
    if len(fields.get("id2label", {})) not in (0, getattr(model.config, "num_labels", 0)):
        return {}  # labels of another head size (the head was not saved): the base's stay
    for key, value in fields.items():
        setattr(model.config, key, value)
    return fields


def adapter_config(where: str):
    """The adapter's ``PeftConfig`` (local folder or hub id), or one clear error."""
    peft = import_peft(f"{where} is a PEFT adapter; reading it")
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


@dataclass(frozen=True)
class AdapterPlan:
    """How an adapter will be loaded: its config, the base it goes on, the head kind and size to load it with."""

    name: str
    where: str
    source: str
    config: Any
    base: str
    kind: str
    num_labels: int | None
    weights: Path | None  # the adapter's safetensors file (in the hub cache for a hub id), located once


def plan_adapter(name: str, where: str, source: str, *, base: str | None = None, kind: str = "auto") -> AdapterPlan:
    """Read the adapter's config and decide its base (``base``, default the one it records) and head.

    ``kind="auto"`` loads the base with the head the adapter's task type needs (a sequence classifier for
    ``SEQ_CLS``...), with as many outputs as the head saved with the adapter has.
    """
    cfg = adapter_config(where)
    base_name = base or cfg.base_model_name_or_path
    if not base_name:
        raise BertologyError(f"The adapter {name!r} does not record its base model; pass the base (--base).")
    want = TASK_KINDS.get(_name(cfg.task_type), "encoder") if kind == "auto" else kind
    weights = _weights_file(where, source)
    labels = saved_head_labels(weights) if want in ("classifier", "token_classifier") else None
    return AdapterPlan(name, where, source, cfg, base_name, want, labels, weights)


def merge_adapter(plan: AdapterPlan, base_model: torch.nn.Module, fresh: list[str], *,
                  shares_base: bool = False) -> tuple[torch.nn.Module, dict]:
    """Put the adapter on ``base_model`` (loaded as the plan says) and merge it; the merged model and what was done.

    The saved head's weights replace the fresh ones. A base of another shape is one clear error naming the
    base the adapter records; head weights neither the base nor the adapter holds (``fresh``) are named.
    ``shares_base``: ``base_model``'s tensors are another model's too (:mod:`bertology.models.shared_base`), so the
    merge writes each merged matrix into a new tensor (peft's safe merge), never into the shared one.
    """
    peft = import_peft(f"{plan.where} is a PEFT adapter; reading it")
    recorded = plan.config.base_model_name_or_path
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # peft asks transformers a deprecated question
            merged = peft.PeftModel.from_pretrained(base_model, plan.where).merge_and_unload(safe_merge=shares_base)
    except (RuntimeError, ValueError, KeyError) as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()] or [type(err).__name__]
        detail = next((line for line in lines if "size mismatch" in line), lines[0])[:300]
        raise BertologyError(
            f"The PEFT adapter {plan.name!r} does not fit the base {plan.base!r} ({detail}); put it on the base it "
            f"was trained from: --base {recorded!r} (the base it records)."
        ) from None
    merged.eval()
    unsaved = unsaved_fresh_weights(fresh, plan.weights)
    if unsaved:
        logger.warning("The adapter %s does not hold %s, which its base %s lacks too: they are random here, so the "
                       "task head's outputs (ablation, the head's predictions) are not the trained model's. Save them "
                       "with the adapter (modules_to_save).", plan.name, ", ".join(unsaved), plan.base)
    info = {"peft_type": _name(plan.config.peft_type), "task_type": _name(plan.config.task_type), "base": plan.base,
            "recorded_base": recorded, "merged": True,
            "weights": ("the adapter merged into a model sharing its base's tensors (merge_and_unload, safe merge): only "
                        "the merged target matrices and the saved head are its own" if shares_base else
                        "the adapter merged into a copy of its base (merge_and_unload); the base is held twice"),
            "unsaved_head_weights": unsaved}
    for key in ("r", "lora_alpha", "target_modules", "modules_to_save"):
        value = getattr(plan.config, key, None)
        if value is not None:
            info[key] = sorted(value) if isinstance(value, set) else list(dict.fromkeys(value)) if isinstance(
                value, list) else value  # peft repeats the head names it adds to modules_to_save
    return merged, info


def adapted_identity(base_sha: str | None, base_name: str, adapter_sha: str | None, where: str) -> str:
    """An adapted model's identity for fingerprints: its base's and its adapter's weights together."""
    return hashlib.sha256(f"{base_sha or base_name}\n{adapter_sha or where}".encode()).hexdigest()
