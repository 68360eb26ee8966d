"""Public test helpers: tiny BERT models saved to disk and planted-signal pairs.

They let users (and our own tests) exercise the real loading code on models small enough to run in
milliseconds, and check that an analysis finds a change that was put there on purpose.
"""
from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import (
    AlbertConfig,
    AutoModel,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    BertConfig,
    BertForSequenceClassification,
    BertModel,
    BertTokenizer,
    DebertaV2Config,
    DistilBertConfig,
    ElectraConfig,
    ModernBertConfig,
    MPNetConfig,
    PretrainedConfig,
    PreTrainedTokenizerBase,
    RobertaConfig,
    XLMRobertaConfig,
)

#: Words of the tiny vocabulary; enough for the sentences the tests write.
TINY_WORDS = (
    "the a an this that is was are were be do did does not no never like good bad great awful movie film story plot "
    "actor actors fun funny boring dull love hate i you he she it we they and but or very really so "
    "too of in on at to with for by from cat dog sat mat ran fast slow man woman girl boy book read "
    "john mary saw likes liked gave went house big small red blue old new day night one two three"
).split()
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PUNCT = [".", ",", "!", "?", "'", "-", ";", ":"]
SUBWORDS = ["##s", "##ed", "##ing", "##ly", "##er"]


def random_heads(rng, n: int) -> tuple[int, ...]:
    """A random dependency tree of ``n`` words as CoNLL-U heads (1-based, 0 = root): word k's head is a
    random earlier word of a seeded random order (``rng``: a NumPy ``Generator``)."""
    perm = rng.permutation(n)
    parent = {int(perm[0]): -1}
    for k in range(1, n):
        parent[int(perm[k])] = int(perm[rng.integers(0, k)])
    return tuple(parent[i] + 1 for i in range(n))


def tiny_vocab() -> dict[str, int]:
    """The WordPiece vocabulary of the tiny models: token -> id."""
    return {tok: i for i, tok in enumerate(SPECIALS + PUNCT + list(TINY_WORDS) + SUBWORDS)}


def tiny_tokenizer() -> BertTokenizer:
    """A lower-casing WordPiece tokenizer over :func:`tiny_vocab`."""
    return BertTokenizer(vocab=tiny_vocab(), do_lower_case=True)


def tiny_config(**overrides) -> BertConfig:
    """A 2-layer, 4-head, hidden-32 BERT config with dropout off and eager attention (:func:`tiny_family_config`)."""
    return tiny_family_config("bert", tiny_tokenizer(), **overrides)


def save_tiny_bert(
    folder: str | Path,
    *,
    seed: int = 0,
    classifier: bool = False,
    num_labels: int = 2,
    **config_overrides,
) -> Path:
    """Create a tiny random BERT (encoder or classifier) plus tokenizer and ``save_pretrained`` it."""
    return save_tiny_family(folder, "bert", seed=seed, classifier=classifier, num_labels=num_labels,
                            config=tiny_config(**config_overrides))


#: The families of :func:`tiny_family_config`: model_type -> (config class, family-specific settings).
#: Sizes are those of DESIGN §4 (hidden 32, 4 heads); ALBERT and ModernBERT get 3 layers so that a middle
#: layer exists (ALBERT's shared module is called 3 times; ModernBERT alternates global and local layers).
FAMILY_CONFIGS: dict[str, tuple[type[PretrainedConfig], dict]] = {
    "bert": (BertConfig, {}),
    "roberta": (RobertaConfig, {}),
    "xlm-roberta": (XLMRobertaConfig, {}),
    "electra": (ElectraConfig, {"embedding_size": 16}),
    "distilbert": (DistilBertConfig, {"dim": 32, "n_layers": 2, "n_heads": 4, "hidden_dim": 64,
                                      "dropout": 0.0, "attention_dropout": 0.0}),
    "albert": (AlbertConfig, {"embedding_size": 16, "num_hidden_layers": 3}),
    "deberta-v2": (DebertaV2Config, {"relative_attention": True, "pos_att_type": ["p2c", "c2p"],
                                     "position_buckets": 8, "max_relative_positions": 16, "type_vocab_size": 0,
                                     "position_biased_input": False}),
    "mpnet": (MPNetConfig, {}),
    "modernbert": (ModernBertConfig, {"num_hidden_layers": 3, "global_attn_every_n_layers": 2, "local_attention": 4,
                                      "attention_dropout": 0.0, "mlp_dropout": 0.0, "embedding_dropout": 0.0}),
}


def tiny_family_config(model_type: str, tokenizer: PreTrainedTokenizerBase, **overrides) -> PretrainedConfig:
    """A tiny random-init config of any supported family (2 layers, hidden 32, 4 heads, dropout off, eager).

    The vocabulary size and the special token ids come from ``tokenizer`` so that its ids are valid
    inputs and RoBERTa-style position ids (counted from the pad id) are right.
    """
    if model_type not in FAMILY_CONFIGS:
        raise ValueError(f"no tiny config for {model_type!r}; known: {', '.join(FAMILY_CONFIGS)}")
    cls, family = FAMILY_CONFIGS[model_type]
    params = dict(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=128, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, type_vocab_size=2,
        pad_token_id=tokenizer.pad_token_id,
    )
    for name, token in (("bos_token_id", "cls_token"), ("eos_token_id", "sep_token"), ("cls_token_id", "cls_token"),
                        ("sep_token_id", "sep_token")):
        tid = getattr(tokenizer, f"{token}_id", None)
        if tid is not None:
            params[name] = tid
    if model_type == "roberta" or model_type == "xlm-roberta":
        params["max_position_embeddings"] = 130  # position ids start after the pad id
    params.update(family)
    params.update(overrides)
    cfg = cls(**params)
    cfg._attn_implementation = "eager"
    return cfg


def save_tiny_family(
    folder: str | Path,
    model_type: str,
    *,
    tokenizer: PreTrainedTokenizerBase | None = None,
    seed: int = 0,
    classifier: bool = False,
    num_labels: int = 2,
    config: PretrainedConfig | None = None,
    **config_overrides,
) -> Path:
    """Save a tiny random model of any family (encoder, or classifier with a fresh head) plus its tokenizer.

    ``config`` replaces :func:`tiny_family_config` (``config_overrides`` then apply to neither).
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = tokenizer if tokenizer is not None else tiny_tokenizer()
    cfg = config if config is not None else tiny_family_config(model_type, tok, **config_overrides)
    torch.manual_seed(seed)
    if classifier:
        cfg.num_labels = num_labels
        cfg.id2label = {i: str(i) for i in range(num_labels)}
        cfg.label2id = {str(i): i for i in range(num_labels)}
        model = AutoModelForSequenceClassification.from_config(cfg, attn_implementation="eager")
    else:
        model = AutoModel.from_config(cfg, attn_implementation="eager")
    model.eval()
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def save_tiny_tagger(
    folder: str | Path,
    tags: list[str],
    model_type: str = "bert",
    *,
    tokenizer: PreTrainedTokenizerBase | None = None,
    seed: int = 0,
    tag_field: str | None = None,
    **config_overrides,
) -> Path:
    """Save a tiny random token classifier (a tagger whose tag id ``i`` is ``tags[i]``) plus its tokenizer.

    ``tag_field`` (``upos``/``xpos``/``tags``) is recorded in the config as ``bertology finetune`` does.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = tokenizer if tokenizer is not None else tiny_tokenizer()
    cfg = tiny_family_config(model_type, tok, **config_overrides)
    cfg.num_labels = len(tags)
    cfg.id2label = dict(enumerate(tags))
    cfg.label2id = {t: i for i, t in enumerate(tags)}
    if tag_field is not None:
        cfg.bertology_tag_field = tag_field
    torch.manual_seed(seed)
    model = AutoModelForTokenClassification.from_config(cfg, attn_implementation="eager").eval()
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def perturb_head(model: torch.nn.Module, layer: int, head: int, scale: float = 0.5, seed: int = 1) -> None:
    """Plant a change in one attention head: randomise its query and key weights in place.

    ``layer`` is 1-based (bertology's convention for attention layers); ``head`` is 0-based. ``scale`` is
    the standard deviation of the new weights: large enough to make the head's attention peaked.
    """
    enc = getattr(model, "base_model", model)
    attn = enc.encoder.layer[layer - 1].attention.self
    size = attn.attention_head_size
    rows = slice(head * size, (head + 1) * size)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for lin in (attn.query, attn.key):
            noise = torch.randn(lin.weight[rows].shape, generator=gen) * scale
            lin.weight[rows] = noise


def tiny_bert_pair(folder: str | Path, *, planted: tuple[int, int] | None = None, classifier: bool = False) -> tuple[Path, Path]:
    """Save a base/tuned pair of tiny models under ``folder``.

    Without ``planted`` the two are identical. With ``planted=(layer, head)`` the tuned copy has that
    one head's query/key weights randomised, so only that head's attention changes at its layer.
    """
    folder = Path(folder)
    base = save_tiny_bert(folder / "base", seed=0)
    tuned_dir = folder / "tuned"
    if classifier:
        tuned = BertForSequenceClassification.from_pretrained(base, num_labels=2, attn_implementation="eager")
    else:
        tuned = BertModel.from_pretrained(base, attn_implementation="eager")
    if planted is not None:
        perturb_head(tuned, *planted)
    tuned.eval()
    tuned.save_pretrained(tuned_dir)
    tiny_tokenizer().save_pretrained(tuned_dir)
    return base, tuned_dir


SENTENCES = [
    "the movie was very good .",
    "i did not like the plot , it was boring .",
    "john saw mary read a book in the house .",
    "the cat sat on the mat .",
    "she really liked the actors but hated the story !",
    "a dull film .",
    "the old man ran fast to the big red house at night .",
    "we love this funny movie .",
    "they were never so bored .",
    "the dog and the cat are good .",
]


def _load_classifier(folder: str | Path) -> BertForSequenceClassification:
    return BertForSequenceClassification.from_pretrained(folder, attn_implementation="eager").eval()


def classifier_logits(folder: str | Path, texts: list[str]) -> torch.Tensor:
    """``[len(texts), num_labels]`` logits of a saved tiny BERT classifier, one text at a time (no padding)."""
    model, tok = _load_classifier(folder), tiny_tokenizer()
    with torch.inference_mode():
        return torch.cat([model(**tok(t, return_tensors="pt")).logits for t in texts])


def set_classifier_bias(folder: str | Path, bias: list[float]) -> Path:
    """Overwrite a saved BERT classifier's output bias in place (a large entry: a model that predicts one class)."""
    model = _load_classifier(folder)
    with torch.no_grad():
        model.classifier.bias.copy_(torch.tensor(bias, dtype=model.classifier.bias.dtype))
    model.save_pretrained(folder)
    return Path(folder)


def split_classifier(folder: str | Path, texts: list[str]) -> list[int]:
    """Shift a saved two-label BERT classifier's bias so it predicts each class on about half of ``texts``.

    The threshold sits halfway between the two middle distinct logit differences, as far from every
    text as it can be. Returns the predictions: labels the model then fits perfectly (a classifier that
    is well above chance, for tests that need one).
    """
    logits = classifier_logits(folder, texts)
    diff = (logits[:, 1] - logits[:, 0]).unique(sorted=True)
    m = len(diff) // 2
    threshold = float(diff[m - 1] + diff[m]) / 2 if len(diff) > 1 else float(diff[0]) - 1.0
    bias = _load_classifier(folder).classifier.bias.detach().tolist()
    set_classifier_bias(folder, [bias[0] + threshold / 2, bias[1] - threshold / 2])
    return classifier_logits(folder, texts).argmax(-1).tolist()


def move_every_weight(parameters, scale: float = 0.3, seed: int = 2) -> None:
    """Add ``scale`` x N(0, 1) x (mean magnitude + 0.05) to every parameter, in place: a "tuned" model in which
    every unit changed (for revert and transplant tests, which need each unit to matter)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in parameters:
            p.add_(scale * torch.randn(p.shape, generator=g) * (p.abs().mean() + 0.05))


def moved_classifier_pair(folder: str | Path) -> tuple[Path, Path, list[int]]:
    """A tiny base encoder and a tuned two-label classifier whose encoder weights all moved, and labels for
    ``SENTENCES * 2`` that the tuned classifier fits (:func:`split_classifier`)."""
    base, tuned = tiny_bert_pair(folder, classifier=True)
    model = BertForSequenceClassification.from_pretrained(tuned, attn_implementation="eager")
    move_every_weight(model.bert.parameters(), seed=3)
    model.save_pretrained(tuned)
    tiny_tokenizer().save_pretrained(tuned)
    return base, tuned, split_classifier(tuned, SENTENCES * 2)


# --------------------------------------------------------------------------------------------------
# Extractive question answering: a SQuAD-layout fixture and a tiny QA model with a fast tokenizer
# --------------------------------------------------------------------------------------------------

#: Paragraphs of the QA fixture (words of the tiny tokenizers' training text) and their questions with answers.
QA_PARAGRAPHS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("The cat sat on the mat. The dog ran fast to the big red house.",
     (("Where did the cat sit?", "the mat"), ("Where did the dog run?", "the big red house"))),
    ("John saw Mary read a book in the old house at night.",
     (("What did Mary read?", "a book"), ("Who saw Mary?", "John"))),
    ("She really liked the story, but he hated the ending. The children played happily in the garden while "
     "their parents talked. Nobody expected the ending to be so emotional and well-acted.",
     (("Who played in the garden?", "The children"), ("What was emotional?", "the ending to be so emotional"))),
)


def squad_fixture(version: str = "v2.0", copies: int = 1) -> dict:
    """A small SQuAD-layout document: one article per paragraph of :data:`QA_PARAGRAPHS` (``copies`` times),
    each answer with its true character offset; with ``version="v2.0"`` every paragraph also has one
    unanswerable question (``is_impossible``, with a plausible answer)."""
    data = []
    for c in range(copies):
        for a, (context, qas) in enumerate(QA_PARAGRAPHS):
            items = [{"id": f"c{c}a{a}q{q}", "question": question,
                      "answers": [{"text": ans, "answer_start": context.index(ans)}]}
                     for q, (question, ans) in enumerate(qas)]
            if version.startswith("v2"):
                first = context.split()[0]
                items.append({"id": f"c{c}a{a}x", "question": "Why was the movie boring?", "answers": [],
                              "is_impossible": True, "plausible_answers": [{"text": first, "answer_start": 0}]})
            data.append({"title": f"article {c}-{a}", "paragraphs": [{"context": context, "qas": items}]})
    return {"version": version, "data": data}


def save_tiny_qa(folder: str | Path, *, seed: int = 0, model_type: str = "bert", qa_head: bool = True) -> Path:
    """A tiny random model (question-answering head, or the bare encoder) with a fast WordPiece tokenizer."""
    from transformers import AutoModelForQuestionAnswering

    from bertology.testing.tokenizers import tiny_tokenizer as trained_tokenizer

    folder = Path(folder)
    tok = trained_tokenizer("wordpiece", folder / "_tokenizer")
    cfg = tiny_family_config(model_type, tok)
    torch.manual_seed(seed)
    model = (AutoModelForQuestionAnswering if qa_head else AutoModel).from_config(cfg, attn_implementation="eager")
    model.eval()
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def check_final_intervals(run_dir: str | Path, metrics: Sequence[str]) -> "pd.DataFrame":  # noqa: F821 (pandas imported inside)
    """Assert a fine-tuning run's ``finetune_intervals`` table agrees with its ``finetune`` table; return it.

    Each listed metric's value must equal the last eval row of ``finetune`` (the same records, the same
    arithmetic), have a finite interval, and be counted over the run's held-out examples.
    """
    import json

    import numpy as np
    import pandas as pd

    run_dir = Path(run_dir)
    ci = pd.read_parquet(run_dir / "tables" / "finetune_intervals.parquet").set_index("metric")
    table = pd.read_parquet(run_dir / "tables" / "finetune.parquet")
    last = table[(table["split"] == "eval") & (table["slice"] == "all")].sort_values("step").groupby("metric").tail(1)
    last = last.set_index("metric")["value"]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert "finetune_intervals" in manifest["tables"]
    for m in metrics:
        row = ci.loc[m]
        assert np.isclose(row["value"], last[m], rtol=1e-12, atol=1e-12), (m, row["value"], last[m])
        # a percentile interval need not contain the point value of a skewed statistic: only its order is asserted
        assert np.isfinite(row["ci_low"]) and row["ci_low"] <= row["ci_high"], (m, row.to_dict())
        assert row["n_eval"] > 1 and row["n_bootstrap"] == 1000
    return ci.reset_index()


#: Every family's head modules (DeBERTa's pooler, DistilBERT's pre_classifier, ModernBERT's head): saved whole by
#: :func:`save_lora_adapter`.
LORA_HEADS = ("classifier", "pooler", "pre_classifier", "head")


def _peft_classifier(base: str | Path, num_labels: int) -> torch.nn.Module:
    from transformers import AutoModelForSequenceClassification

    from bertology.models.loading import quiet_transformers

    with quiet_transformers():
        return AutoModelForSequenceClassification.from_pretrained(base, num_labels=num_labels, attn_implementation="eager")


def save_lora_adapter(base: str | Path, folder: str | Path, *, num_labels: int = 3, seed: int = 0,
                      heads: Sequence[str] = LORA_HEADS) -> Path:
    """A ``peft`` LoRA adapter on every linear layer of ``base``'s encoder, its ``num_labels``-label head saved whole,
    into ``folder`` (``init_lora_weights=False``: a non-zero update, so an adapter silently dropped fails a test)."""
    import peft

    from bertology.models.loading import quiet_transformers

    torch.manual_seed(seed)
    config = peft.LoraConfig(task_type=peft.TaskType.SEQ_CLS, r=4, lora_alpha=8, target_modules="all-linear",
                             exclude_modules=r".*(classifier|pooler|head).*", modules_to_save=list(heads),
                             init_lora_weights=False)
    with quiet_transformers():
        peft.get_peft_model(_peft_classifier(base, num_labels), config).save_pretrained(folder)
    return Path(folder)


def peft_merged_model(base: str | Path, adapter: str | Path, *, num_labels: int = 3) -> torch.nn.Module:
    """``peft``'s own merged model of ``adapter`` on ``base``, built independently of bertology's loader."""
    import peft

    from bertology.models.loading import quiet_transformers

    with quiet_transformers():
        return peft.PeftModel.from_pretrained(_peft_classifier(base, num_labels), adapter).merge_and_unload().eval()


# --------------------------------------------------------------------------------------------------
# Device paths on the CPU: the batches an analysis sees, moved elsewhere, with host copies refused
# --------------------------------------------------------------------------------------------------


def captured_batches(pair, encoded, requires: frozenset[str], batch_size: int, *, each=None) -> list:
    """The :class:`~bertology.activations.batch.PairBatch` es the extraction loop hands its analyses, kept.

    ``each(batch)`` runs on every batch as it arrives (e.g. filling the shared layer statistics, whose CPU kernel
    reads NumPy views, before a test refuses host copies).
    """
    from bertology.activations.extract import run_analyses

    kept: list = []

    class _Keep:
        def __init__(self) -> None:
            self.requires = frozenset(requires)

        def extraction_options(self) -> dict:
            return {}

        def update(self, batch) -> None:
            if each is not None:
                each(batch)
            kept.append(batch)

    run_analyses(pair, encoded, [_Keep()], batch_size=batch_size)
    return kept


#: What copies a tensor to the host (or waits for the device to read one value back).
HOST_COPIES = ("cpu", "numpy", "item", "tolist", "__array__", "__bool__", "__int__", "__float__", "__index__")


@contextmanager
def no_host_copies():
    """Inside the block every :data:`HOST_COPIES` method of a tensor raises ``AssertionError``: run an analysis's
    device path on the CPU in it to show a GPU run would copy nothing back per batch. Restored on exit.

    The scalar conversions (``bool``, ``int``, ``float``, ``__index__``: ``if t.any():``, ``int(t.max())``) are
    refused too, since on a GPU each waits for the device. What it cannot see: boolean-mask indexing, ``nonzero``
    and ``torch.bincount``, which on a GPU read a size back inside torch (the device paths avoid them by reading).
    """

    def refuse(*args, **kwargs):
        raise AssertionError("a per-batch host copy")

    saved = {name: getattr(torch.Tensor, name) for name in HOST_COPIES}
    try:
        for name in HOST_COPIES:
            setattr(torch.Tensor, name, refuse)
        yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)


def batch_on(batch, device: str | torch.device):
    """The same :class:`~bertology.activations.batch.PairBatch` with every tensor on ``device``."""
    from bertology.activations.batch import PairBatch
    from bertology.models.hooks import Captured

    def moved(c: Captured) -> Captured:
        return Captured([None if t is None else t.to(device) for t in c.hidden_states],
                        [None if t is None else t.to(device) for t in c.attentions])

    return PairBatch(batch.items, batch.input_ids.to(device), batch.mask.to(device), batch.content.to(device),
                     batch.lengths.to(device), moved(batch.base), moved(batch.tuned))


class SideBySide:
    """A consumer of the extraction loop that feeds ``here`` each batch and ``there`` a copy of it on ``device``
    (:func:`batch_on`): the same maps reach both sets of analyses, so their tables can be compared."""

    def __init__(self, here: list, there: list, device: str | torch.device):
        self.here, self.there, self.device = here, there, device
        self.requires = frozenset().union(*(a.requires for a in [*here, *there]))

    def extraction_options(self) -> dict:
        return {}

    def update(self, batch) -> None:
        for a in self.here:
            a.update(batch)
        moved = batch_on(batch, self.device)
        for a in self.there:
            a.update(moved)


#: Tags and relations of :func:`random_annotated_corpus` (a few of each, so every category and relation recurs).
UPOS_TAGS = ("NOUN", "VERB", "PRON", "DET", "ADJ", "PART", "PROPN")
XPOS_TAGS = ("NN", "VB", "PRP", "DT", "JJ", "RB", "NNP", "VBD")
DEPRELS = ("nsubj", "obj", "det", "amod", "advmod", "neg", "iobj", "obl")
#: Words beside :data:`TINY_WORDS`: two-piece words and punctuation.
EXTRA_WORDS = ("cats", "reading", "slowly", ".", ",", "!")


def random_annotated_corpus(n: int, seed: int = 0, *, min_words: int = 3, pair_every: int = 5,
                            labels: bool = False) -> "Corpus":  # noqa: F821 (imported inside: no start-up cost)
    """``n`` random sentences of the tiny vocabulary with random trees, UPOS, XPOS and relations (and labels ``a``/``b``
    alternating, with ``labels``); every ``pair_every``-th is a sentence pair annotated over both texts. For the
    analyses that need annotations (attention targets, relation heads, patterns over pairs) on the tiny models."""
    import numpy as np

    from bertology.data.corpus import Corpus, Example

    rng = np.random.default_rng(seed)
    vocab = list(TINY_WORDS) + list(EXTRA_WORDS)
    out = []
    for i in range(n):
        words = tuple(rng.choice(vocab, size=int(rng.integers(min_words, 10))))
        nw = len(words)
        ann = dict(words=words, upos=tuple(rng.choice(UPOS_TAGS, nw)), xpos=tuple(rng.choice(XPOS_TAGS, nw)),
                   heads=random_heads(rng, nw), deprels=tuple(rng.choice(DEPRELS, nw)))
        if labels:
            ann["label"] = "ab"[i % 2]
        if i % pair_every == pair_every - 1:
            cut = int(rng.integers(1, nw))
            out.append(Example(" ".join(words[:cut]), text_pair=" ".join(words[cut:]), n_first_words=cut, **ann))
        else:
            out.append(Example(" ".join(words), **ann))
    return Corpus(out)
