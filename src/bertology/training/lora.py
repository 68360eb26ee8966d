"""LoRA in the lab (``--method lora``): the encoder wrapped with ``peft``'s low-rank adapters, the task head trained
fully, the run saved as a PEFT adapter folder (which :mod:`bertology.models.peft_adapter` loads back as a model).

:func:`wrap_lora` puts the adapters into the trainer's model in place (``peft.get_peft_model`` mutates the model it
wraps), so every trainer keeps calling its own model; the head's modules (every top-level module outside the
encoder) are peft's ``modules_to_save``. :class:`AdapterSaving` stands in for the trainer's
:class:`~bertology.training.loop.TrainTask` so that checkpoints and the final model folder hold the adapter
(LoRA matrices + head) and a resumed run loads them back (``load_weights``) before the optimiser state.

Every task head trains this way. The biaffine parser's head is bertology's own module, not a Hugging Face head: the
adapters go into its encoder alone (peft's ``FEATURE_EXTRACTION``), the head trains fully and is saved beside the
adapter as a full parser folder saves it (:data:`~bertology.models.parser.HEAD_WEIGHTS`,
:data:`~bertology.models.parser.HEAD_CONFIG`), so the adapter folder loads back as the parser. Every adapter folder also
holds the trained model's label names (:data:`~bertology.models.peft_adapter.TASK_CONFIG`), which the base lacks.
"""
from __future__ import annotations

import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bertology.config import FinetuneConfig
from bertology.errors import BertologyError
from bertology.models.parser import BiaffineParser, load_head, save_head
from bertology.models.peft_adapter import import_peft, save_task_config
from bertology.training.loop import head_parameter_names

logger = logging.getLogger(__name__)

#: The task heads LoRA trains, by the trained task's name -> peft's task type (what the adapter loader reads).
#: The parser's adapter is its encoder's (``FEATURE_EXTRACTION``); its head is saved beside it.
TASK_TYPES = {"classification": "SEQ_CLS", "regression": "SEQ_CLS", "tagging": "TOKEN_CLS", "bio_tagging": "TOKEN_CLS",
              "qa": "QUESTION_ANS", "parsing": "FEATURE_EXTRACTION"}
#: Where a LoRA run's merged model goes (``--lora-merge``), beside ``model/``.
MERGED_DIR = "model-merged"


def default_targets(model: torch.nn.Module) -> tuple[str, ...]:
    """The family's query and value projections as peft ``target_modules`` names: the last part of the paths the
    family's :class:`~bertology.models.adapters.base.WeightLayout` gives (ModernBERT's fused ``Wqkv`` once)."""
    from bertology.models import sites

    layout = sites.adapter(model).weights
    if layout is None:
        raise BertologyError(f"{type(model).__name__}: its family names no query/value modules; give --lora-targets.")
    names = [layout.block[k].split(":")[0].rsplit(".", 1)[-1] for k in ("query", "value")]
    return tuple(dict.fromkeys(names))


def check_targets(model: torch.nn.Module, targets: tuple[str, ...]) -> tuple[str, ...]:
    """``targets`` when each names at least one module of ``model`` as peft matches a name (the whole name, or its
    last dotted parts); else one error naming the targets that match nothing and the linear layers to choose from
    (what peft would refuse only once the model is loaded for training)."""
    names = [name for name, _ in model.named_modules() if name]
    missing = [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        leaves = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        raise BertologyError(f"--lora-targets {','.join(missing)}: no module of {type(model).__name__} is called "
                             f"{' or '.join(map(repr, missing))}; its linear layers are {', '.join(leaves)}.")
    return targets


def head_modules(model: torch.nn.Module) -> list[str]:
    """The top-level modules of the task head (those holding parameters outside the encoder), trained fully."""
    return sorted({name.split(".", 1)[0] for name in head_parameter_names(model)})


@dataclass
class LoraRun:
    """A model with LoRA adapters put in: peft's wrapper (for saving and merging) and what the manifest says."""

    peft_model: Any
    base: str
    record: dict
    parser: BiaffineParser | None = None  # the parser whose encoder holds the adapters (its head saved beside them)


def trainable_counts(model: torch.nn.Module) -> dict:
    """Trainable and total parameters of ``model`` as it trains (peft's own count, ``get_nb_trainable_parameters``:
    the head's frozen original copy is counted in the total) and the trainable share in percent."""
    trainable, total = model.get_nb_trainable_parameters()
    return {"trainable_parameters": int(trainable), "total_parameters": int(total),
            "trainable_percent": round(100.0 * trainable / total, 4)}


def base_name(model: str) -> str:
    """The base the adapter records: a local folder as an absolute path, a hub id or ``minilm`` as given."""
    return str(Path(model).resolve()) if os.path.exists(model) else model


def peft_library():
    """The ``peft`` module, or one clear error naming the extra that installs it."""
    return import_peft("--method lora")


def wrap_lora(model: torch.nn.Module, config: FinetuneConfig, task: str) -> LoraRun:
    """Put LoRA adapters (``config``'s rank, alpha, dropout, targets) into ``model`` in place; the head modules train
    fully, every other weight is frozen. ``task`` (the trained task's name) decides peft's task type. A
    :class:`~bertology.models.parser.BiaffineParser` gets the adapters in its encoder; its head trains fully outside
    peft and is saved beside the adapter (:func:`save_adapter`)."""
    peft = peft_library()

    if task not in TASK_TYPES:
        raise BertologyError(f"--method lora: the {task} task has no adapter form; use --method full.")
    targets = tuple(config.lora.targets) or default_targets(model)
    parser = model if isinstance(model, BiaffineParser) else None
    check_targets(parser.encoder if parser is not None else model, targets)
    heads = head_modules(model)
    lora = peft.LoraConfig(task_type=TASK_TYPES[task], r=config.lora.rank, lora_alpha=config.lora.alpha,
                           lora_dropout=config.lora.dropout, target_modules=list(targets),
                           # a copy: peft adds its defaults to the list it is given; the parser's head is saved apart
                           modules_to_save=None if parser is not None else list(heads))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            warnings.simplefilter("ignore", FutureWarning)  # peft asks transformers a deprecated question
            wrapped = peft.get_peft_model(parser.encoder if parser is not None else model, lora)
    except ValueError as err:
        raise BertologyError(f"--lora-targets {','.join(targets)}: {str(err).splitlines()[0][:200]}") from None
    base = base_name(config.model)
    wrapped.peft_config["default"].base_model_name_or_path = base
    counts = trainable_counts(wrapped)
    if parser is not None:  # the head trains outside peft: add it to peft's count of the encoder
        n_head = sum(p.numel() for p in parser.head.parameters() if p.requires_grad)
        trainable, total = counts["trainable_parameters"] + n_head, counts["total_parameters"] + n_head
        counts = {"trainable_parameters": trainable, "total_parameters": total,
                  "trainable_percent": round(100.0 * trainable / total, 4)}
    record = {"method": "lora", "rank": config.lora.rank, "alpha": config.lora.alpha, "dropout": config.lora.dropout,
              "targets": list(targets), "targets_source": "given" if config.lora.targets else "the family's query and value",
              "modules_to_save": heads, "task_type": TASK_TYPES[task], "base": base, "library": f"peft {peft.__version__}",
              **counts}
    if parser is not None:
        record["head_saved"] = "beside the adapter, as a parser folder's (parser_head.safetensors, parser_config.json)"
    logger.info("LoRA r=%d on %s: %d of %d parameters trainable (%.2f%%)", config.lora.rank, ", ".join(targets),
                record["trainable_parameters"], record["total_parameters"], record["trainable_percent"])
    return LoraRun(wrapped, base, record, parser)


def save_adapter(run: LoraRun, tokenizer, folder: Path) -> None:
    """Write the adapter folder: ``adapter_config.json``, ``adapter_model.safetensors`` (LoRA + head), the trained
    model's label names (``task_config.json``), the parser's head beside them (a parser's run) and the tokenizer,
    which bertology loads as a model by putting it on its recorded base."""
    # the embeddings are never trained or resized here: without this peft looks the base's config up (on the hub
    # for ``minilm`` or a hub id) to decide, and warns when it cannot
    run.peft_model.save_pretrained(str(folder), save_embedding_layers=False)
    save_task_config(run.peft_model.get_base_model().config, folder)
    if run.parser is not None:
        save_head(run.parser, folder)
    tokenizer.save_pretrained(str(folder))


def load_adapter_weights(run: LoraRun, folder: Path) -> None:
    """Load a checkpoint's adapter weights (LoRA + head) back into the wrapped model (resuming)."""
    from safetensors.torch import load_file

    peft = peft_library()
    path = folder / "adapter_model.safetensors"
    if not path.is_file():
        raise BertologyError(f"Checkpoint {folder} has no adapter weights; pass --overwrite to start again.")
    result = peft.set_peft_model_state_dict(run.peft_model, load_file(str(path)))
    if getattr(result, "unexpected_keys", None):
        raise BertologyError(f"Checkpoint {folder} does not fit the adapter (unexpected {result.unexpected_keys[:3]}).")
    if run.parser is not None:
        load_head(run.parser, folder)


def save_merged(run: LoraRun, tokenizer, folder: Path) -> None:
    """The adapter merged into a copy of its base, saved as a full model folder (``--lora-merge``); the trained
    model itself is left as it is."""
    import copy

    from bertology.models.loading import save_model

    merged = copy.deepcopy(run.peft_model).merge_and_unload()
    if run.parser is not None:  # the merged encoder under a copy of the trained head
        parser = BiaffineParser(merged, run.parser.parser_config)
        parser.head.load_state_dict(run.parser.head.state_dict())
        merged = parser
    save_model(merged, tokenizer, folder)


class AdapterSaving:
    """A trainer's :class:`~bertology.training.loop.TrainTask` that saves (checkpoints, the final folder) and loads
    (resuming) the adapter instead of the whole model; everything else is the trainer's own."""

    def __init__(self, inner: Any, run: LoraRun, tokenizer) -> None:
        self._inner, self._run, self._tokenizer = inner, run, tokenizer

    def __getattr__(self, name: str) -> Any:
        """Every other attribute (loss, evaluate, last_scored, predictions ...) is the trainer's task's."""
        return getattr(self._inner, name)

    def save(self, model: torch.nn.Module, folder: Path) -> None:
        """The adapter folder (``model`` is the wrapped model itself)."""
        save_adapter(self._run, self._tokenizer, folder)

    def load_weights(self, model: torch.nn.Module, folder: Path) -> None:
        """A checkpoint's adapter weights into the wrapped model."""
        load_adapter_weights(self._run, folder)
