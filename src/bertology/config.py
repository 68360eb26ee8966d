"""One typed schema for every run, shared by the CLI and the Python API.

Each field's default is the documented default of the matching CLI flag; ``to_dict`` is what goes into
``manifest.json`` so a run records every choice that changes its numbers.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, get_args

#: How a head is disabled (bertology.models.ablate): the one definition, here on the ground floor so
#: that settings, the command line and the interventions share it without importing torch.
Mode = Literal["uniform", "zero", "mean"]
MODES: tuple[str, ...] = get_args(Mode)


@dataclass
class DataConfig:
    """Where the data comes from and how it is read and tokenised."""

    path: str = ""
    text_column: str | None = None
    pair_column: str | None = None
    label_column: str | None = None
    max_examples: int | None = 1000
    max_length: int = 128
    overlong: Literal["skip", "truncate"] = "skip"


@dataclass
class CompareConfig:
    """``bertology compare``: a base and a tuned model side by side over one corpus."""

    base: str = "minilm"
    tuned: str = ""
    data: DataConfig = field(default_factory=DataConfig)
    out: str = "runs/compare"
    # analyses and experiments by name (bertology.pipeline.selectable()); "all" runs whatever the model and data allow
    analyses: tuple[str, ...] = ("all",)
    batch_size: int = 32
    seed: int = 0
    device: str = "cpu"
    dtype: str = "float32"  # what the models run in (bertology.models.precision.DTYPES); statistics stay float64
    # paper conventions (bertology.conventions): a preset, and the conventions it sets unless given here (None)
    conventions: str = "bertology"
    punctuation: Literal["unicode", "clark2019"] | None = None  # attention_targets
    attention_mode: Literal["cropped", "padded"] | None = None  # attention_change
    word_categories: Literal["bertology", "kovaleva2019"] | None = None  # attention_targets
    probe_punctuation: Literal["upos", "hewitt2019"] | None = None  # probe
    pad_length: int = 200
    # representation_similarity; with ood_data also on a second, out-of-domain corpus (Merchant et al. 2020)
    rsa_tokens: int = 2000
    ood_data: str | None = None
    ood_text_column: str | None = None
    # attention_targets / relation_heads: spaCy pipeline for plain text (None: en_core_web_sm, else the re-upload)
    spacy_model: str | None = None
    relation_min_count: int = 20
    relation_word_attention: Literal["mean", "clark2019"] | None = None  # relation_heads (a convention)
    entropy_smoothing: Literal["none", "clark2019"] | None = None  # attention_targets' entropy (a convention)
    # attention_patterns: a CNN folder from ``bertology patterns train`` replaces the feature rules
    patterns_cnn: str | None = None
    # head_map: examples sampled for the all-pairs JS distances, and the distance MDS embeds (a convention)
    head_map_examples: int = 100
    head_map_distance: Literal["js_distance", "js_divergence", "clark2019"] | None = None
    # interactive attention views embedded in the report (examples of 6-24 tokens, in corpus order)
    view_examples: int = 3
    # user-given token relations: a JSONL file of texts with from/to spans (scored into relation_heads)
    relations: str | None = None
    # geometry (Ethayarajh 2019): random token pairs for the anisotropy baseline; contexts a word needs
    geometry_pairs: int = 1000
    geometry_min_contexts: int = 5
    # pca_views (van Aken et al. 2019): these example indices, else a hashed sample of this many
    pca_examples: tuple[int, ...] | None = None
    pca_n_examples: int = 20
    # structural probes (Hewitt & Manning 2019) on their own treebank splits (CoNLL-U, or text parsed by spaCy)
    probe_train: str | None = None
    probe_dev: str | None = None
    probe_test: str | None = None
    probe_rank: int = 128
    probe_epochs: int = 30
    probe_random_control: bool = True
    probe_max_sentences: int | None = None
    # ablation (Kovaleva et al. 2019 §4.6; Michel et al. 2019): the tuned classifier on labelled data
    ablation_mode: Mode = "uniform"  # checked by bertology.models.ablate.check_mode
    ablation_examples: int = 500
    ablation_exclude_special: bool = False
    ablation_bootstrap: int = 1000
    ablation_importance: bool = True
    trust_remote_code: bool = False
    store: str | None = None  # optional on-disk activation store folder

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def fingerprint(self) -> str:
        """Hash of every setting that changes the numbers (not where they are written)."""
        d = self.to_dict()
        d.pop("out", None)
        d.pop("store", None)
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


def as_path(p: str | Path) -> Path:
    return Path(p).expanduser()
