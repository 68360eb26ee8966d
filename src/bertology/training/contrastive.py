"""Contrastive fine-tuning (SimCSE, Gao et al. 2021): a sentence encoder without a classification head.

* **Unsupervised**: every sentence is encoded twice in one forward pass; the two dropout masks make
  two different views, the other sentences of the batch are the negatives.
* **Supervised** (NLI): for a premise, a hypothesis labelled ``positive_label`` (entailment) is the
  positive and one labelled ``negative_label`` (contradiction) the hard negative; every other
  positive and hard negative in the batch is a negative too.

The loss is the cross-entropy over cosine similarities divided by a temperature (0.05), with the
sentence embedding taken from the [CLS] token (``pooling="cls"``; no MLP head, unlike the paper's
training-time pooler) or the mean of the non-padding tokens (``pooling="mean"``). With
``grad_accum > 1`` the in-batch negatives are those of each micro-batch (``batch_size``), not of the
whole effective batch.

Measured before and after training: anisotropy per layer (Ethayarajh 2019's baseline: the mean
cosine of random token pairs from different sentences, the same pairs for both models; table
``anisotropy``: ``model, layer, metric, value, n``) and, with STS-B-format data (``sentence1,
sentence2, score``), the Spearman correlation between the embeddings' cosine and the gold score
(``finetune`` table rows with ``split="sts"``).
"""
from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from bertology.data.batching import collate, length_batches
from bertology.config import FinetuneConfig, parse_word_list
from bertology.data.corpus import Corpus
from bertology.data.encode import EncodedCorpus, EncodedExample, encode_corpus
from bertology.errors import BertologyError
from bertology.models.loading import save_model
from bertology.models.sites import uses_token_types
from bertology.training.common import FinetuneResult, padding_id, resolve_config
from bertology.training.data import exclude_examples
from bertology.training.loop import LoopOutcome
from bertology.training.skeleton import Finish, ModelToTrain, RunData, TaskTrainer

logger = logging.getLogger(__name__)

ANISOTROPY_COLUMNS = ["model", "layer", "metric", "value", "n"]


# --------------------------------------------------------------------------------------------------
# Losses (pure functions)
# --------------------------------------------------------------------------------------------------


def cosine_matrix(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``[i, j] = cos(a_i, b_j)``."""
    return F.normalize(a, dim=-1, eps=1e-12) @ F.normalize(b, dim=-1, eps=1e-12).T


def simcse_loss(z1: torch.Tensor, z2: torch.Tensor, temperature: float = 0.05) -> torch.Tensor:
    """Unsupervised SimCSE: row ``i`` of ``z1`` must pick row ``i`` of ``z2`` among all rows of ``z2``.

    ``-mean_i log( exp(cos(z1_i, z2_i)/t) / sum_j exp(cos(z1_i, z2_j)/t) )``.
    """
    logits = cosine_matrix(z1, z2) / temperature
    return F.cross_entropy(logits, torch.arange(len(z1), device=z1.device))


def supervised_simcse_loss(
    anchor: torch.Tensor, positive: torch.Tensor, negative: torch.Tensor, temperature: float = 0.05
) -> torch.Tensor:
    """Supervised SimCSE: anchor ``i`` must pick positive ``i`` among every positive and every hard negative.

    ``-mean_i log( e^{cos(h_i, h_i+)/t} / sum_j (e^{cos(h_i, h_j+)/t} + e^{cos(h_i, h_j-)/t}) )``.
    """
    logits = torch.cat([cosine_matrix(anchor, positive), cosine_matrix(anchor, negative)], dim=1) / temperature
    return F.cross_entropy(logits, torch.arange(len(anchor), device=anchor.device))


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """Sentence embeddings from the last hidden states: the [CLS] vector or the mean over non-padding tokens."""
    if pooling == "cls":
        return hidden[:, 0]
    if pooling == "mean":
        m = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * m).sum(1) / m.sum(1).clamp_min(1.0)
    raise BertologyError(f"Unknown pooling {pooling!r}; use cls or mean.")


# --------------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------------


def sentences_of(corpus: Corpus) -> list[str]:
    """Every text of the corpus (both texts of a pair), in order, without empty ones."""
    out = []
    for ex in corpus:
        out.append(ex.text)
        if ex.text_pair is not None:
            out.append(ex.text_pair)
    return [s for s in out if s and s.strip()]


def _some(labels: set, show: int = 10) -> str:
    """Up to ``show`` labels, sorted, and how many more (a regression file has hundreds of distinct scores)."""
    ordered = sorted(labels, key=str)
    more = f", and {len(ordered) - show} more" if len(ordered) > show else ""
    return ", ".join(repr(lab) for lab in ordered[:show]) + more


def nli_triplets(corpus: Corpus, positive_label: str, negative_label: str, seed: int) -> tuple[list[tuple[str, str, str]], dict]:
    """``(premise, positive hypothesis, hard-negative hypothesis)`` triplets from labelled sentence pairs.

    Every (premise, positive) pair gets one of its premise's negatives (seeded choice); premises without
    a negative are counted and left out.
    """
    if not corpus.has_pairs:
        raise BertologyError("Supervised contrastive training needs sentence pairs (premise, hypothesis) with labels.")
    labels = {ex.label for ex in corpus}
    missing = [lab for lab in (positive_label, negative_label) if lab not in labels]
    if missing:
        raise BertologyError(
            f"Supervised contrastive training needs pairs labelled {positive_label!r} (positive) and {negative_label!r} "
            f"(hard negative); the data has no {', '.join(repr(m) for m in missing)} (labels: {_some(labels)}). "
            "Name them with positive_label / negative_label."
        )
    pos: dict[str, list[str]] = {}
    neg: dict[str, list[str]] = {}
    for ex in corpus:
        if ex.label == positive_label:
            pos.setdefault(ex.text, []).append(ex.text_pair)
        elif ex.label == negative_label:
            neg.setdefault(ex.text, []).append(ex.text_pair)
    rng = np.random.default_rng(seed)
    triplets, no_negative = [], 0
    for premise, hyps in pos.items():
        if premise not in neg:
            no_negative += len(hyps)
            continue
        for h in hyps:
            triplets.append((premise, h, neg[premise][int(rng.integers(len(neg[premise])))]))
    if not triplets:
        raise BertologyError("No premise has both a positive and a hard-negative hypothesis; no triplets to train on.")
    return triplets, {"n_triplets": len(triplets), "n_positive_pairs_without_negative": no_negative,
                      "n_premises": len(pos)}


def load_sts(path: str) -> tuple[Corpus, np.ndarray]:
    """An STS-B-format file: sentence pairs with a numeric similarity score (``score`` column or the label)."""
    from bertology.data.loaders import load_corpus

    try:
        corpus = load_corpus(path, label_column="score")
    except BertologyError:
        corpus = load_corpus(path)
    if not corpus.has_pairs or not corpus.has_labels:
        raise BertologyError(f"{path} must hold sentence pairs with a score (columns sentence1, sentence2, score).")
    try:
        scores = np.array([float(ex.label) for ex in corpus])
    except ValueError as err:
        raise BertologyError(f"{path}: the score column must be numeric ({err}).") from err
    return corpus, scores


# --------------------------------------------------------------------------------------------------
# Embeddings, STS and anisotropy
# --------------------------------------------------------------------------------------------------


def _encode_sentences(texts: list[str], tokenizer, max_length: int) -> EncodedCorpus:
    return encode_corpus(Corpus.from_list(texts), tokenizer, max_length=max_length, overlong="truncate")


class _Encoder:
    """Batches of encoded sentences through the model: pooled embeddings (with grad when training)."""

    def __init__(self, pad_id: int, use_token_types: bool, device: torch.device, pooling: str) -> None:
        self.pad_id, self.use_token_types, self.device, self.pooling = pad_id, use_token_types, device, pooling

    def inputs(self, items: list[EncodedExample]) -> dict[str, torch.Tensor]:
        t = collate(items, self.pad_id)
        kwargs = {"input_ids": t["input_ids"].to(self.device), "attention_mask": t["attention_mask"].to(self.device)}
        if self.use_token_types:
            kwargs["token_type_ids"] = t["token_type_ids"].to(self.device)
        return kwargs

    def embed(self, model, items: list[EncodedExample]) -> torch.Tensor:
        kwargs = self.inputs(items)
        hidden = model(**kwargs).last_hidden_state
        return pool(hidden, kwargs["attention_mask"], self.pooling)

    @torch.inference_mode()
    def embed_all(self, model, enc: EncodedCorpus, batch_size: int) -> torch.Tensor:
        was = model.training
        model.eval()
        out = torch.zeros(enc.n_input, model.config.hidden_size)
        try:
            for items in length_batches(enc.items, batch_size):
                z = self.embed(model, items).float().cpu()
                out[[it.index for it in items]] = z
        finally:
            model.train(was)
        return out


def sts_spearman(model, encoder: _Encoder, enc1: EncodedCorpus, enc2: EncodedCorpus, scores: np.ndarray, batch_size: int) -> float:
    """Spearman correlation between cos(embedding 1, embedding 2) and the gold scores."""
    from scipy.stats import spearmanr

    a = encoder.embed_all(model, enc1, batch_size)
    b = encoder.embed_all(model, enc2, batch_size)
    cos = F.cosine_similarity(a.double(), b.double(), dim=-1).numpy()
    return float(spearmanr(cos, scores).statistic)


def sample_token_pairs(enc: EncodedCorpus, n_pairs: int, seed: int) -> np.ndarray:
    """``[n, 4]`` rows ``(item a, token a, item b, token b)``: random non-special tokens from two different
    sentences (tokens drawn uniformly over all tokens; the partner's sentence is redrawn when it is the same)."""
    content = [np.flatnonzero(~it.special) for it in enc.items]
    owners = np.concatenate([np.full(len(c), i) for i, c in enumerate(content)]) if content else np.array([])
    positions = np.concatenate(content) if content else np.array([])
    if len({int(o) for o in owners}) < 2:
        raise BertologyError("Anisotropy needs tokens from at least two sentences.")
    rng = np.random.default_rng(seed)
    a = rng.integers(len(owners), size=n_pairs)
    b = rng.integers(len(owners), size=n_pairs)
    same = owners[a] == owners[b]
    while same.any():
        b[same] = rng.integers(len(owners), size=int(same.sum()))
        same = owners[a] == owners[b]
    return np.stack([owners[a], positions[a], owners[b], positions[b]], axis=1).astype(np.int64)


@torch.inference_mode()
def anisotropy_per_layer(model, encoder: _Encoder, enc: EncodedCorpus, pairs: np.ndarray, batch_size: int) -> list[dict]:
    """Mean cosine of the token pairs' hidden states at every layer (0 = embeddings), via
    :func:`bertology.metrics.geometry.mean_pair_cosine`."""
    from bertology.metrics.geometry import mean_pair_cosine

    was = model.training
    model.eval()
    needed: dict[int, list[int]] = {}
    for col in ((0, 1), (2, 3)):
        for item, tok in pairs[:, col]:
            needed.setdefault(int(item), []).append(int(tok))
    vectors: dict[tuple[int, int], np.ndarray] = {}  # (item, token) -> [n_layers + 1, hidden]
    try:
        wanted = [enc.items[i] for i in sorted(needed)]
        position = {id(it): i for i, it in zip(sorted(needed), wanted)}
        for items in length_batches(wanted, batch_size):
            out = model(**encoder.inputs(items), output_hidden_states=True)
            hs = torch.stack(out.hidden_states, dim=1).float().cpu().numpy()  # [batch, L+1, T, H]
            for row, it in enumerate(items):
                i = position[id(it)]
                for tok in set(needed[i]):
                    vectors[(i, tok)] = hs[row, :, tok]
    finally:
        model.train(was)
    x = np.stack([vectors[(int(p[0]), int(p[1]))] for p in pairs])  # [n, L+1, H]
    y = np.stack([vectors[(int(p[2]), int(p[3]))] for p in pairs])
    return [
        {"layer": layer, "metric": "anisotropy", "value": mean_pair_cosine(x[:, layer], y[:, layer]), "n": len(pairs)}
        for layer in range(x.shape[1])
    ]


# --------------------------------------------------------------------------------------------------
# Task and entry point
# --------------------------------------------------------------------------------------------------


class ContrastiveTask:
    """The SimCSE objective over encoded sentences (unsupervised) or triplets (supervised)."""

    objective = "contrastive"

    @property
    def loss_name(self) -> str:
        """The loss of :func:`simcse_loss` / :func:`supervised_simcse_loss` by name, with its negatives and temperature."""
        negatives = "in-batch negatives" if self.mode == "unsupervised" else "in-batch and hard negatives"
        return f"SimCSE InfoNCE, {self.mode}: {negatives}, temperature {self.temperature:g}"

    def __init__(self, tokenizer, encoder: _Encoder, *, mode: str, temperature: float, items: list, sts=None,
                 batch_size: int = 32, tokenisation: dict | None = None) -> None:
        self.tokenizer, self.encoder, self.mode, self.temperature = tokenizer, encoder, mode, temperature
        self.items = items  # unsupervised: EncodedExample per sentence; supervised: (anchor, pos, neg) triples
        self.n_items = len(items)
        self.sts = sts  # (enc1, enc2, scores) or None
        self.batch_size, self.pooling = batch_size, encoder.pooling
        self.use_token_types = encoder.use_token_types
        self._tokenisation = tokenisation or {}

    def tokenisation(self) -> dict:
        """The manifest's ``tokenisation`` of the training sentences."""
        return self._tokenisation

    def loss(self, model, indices: list[int]) -> torch.Tensor:
        if self.mode == "unsupervised":
            items = [self.items[i] for i in indices]
            z = self.encoder.embed(model, items + items).float()  # one pass, two dropout masks per sentence
            return simcse_loss(z[: len(items)], z[len(items):], self.temperature)
        trip = [self.items[i] for i in indices]
        flat = [t[0] for t in trip] + [t[1] for t in trip] + [t[2] for t in trip]
        z = self.encoder.embed(model, flat).float()
        b = len(trip)
        return supervised_simcse_loss(z[:b], z[b : 2 * b], z[2 * b :], self.temperature)

    def evaluate(self, model) -> tuple[dict, list[dict]]:
        if self.sts is None:
            return {}, []
        rho = sts_spearman(model, self.encoder, *self.sts, self.batch_size)
        return {"spearman": rho}, [{"split": "sts", "metric": "spearman", "value": rho, "slice": "all"}]

    def save(self, model, folder: Path) -> None:
        save_model(model, self.tokenizer, folder)
        (Path(folder) / "sentence_pooling.json").write_text(json.dumps({"pooling": self.pooling}), encoding="utf-8")


class ContrastiveTrainer(TaskTrainer):
    """A SimCSE sentence encoder (no head): sentences or NLI triplets; STS Spearman and anisotropy before and after."""

    recipe_name = "contrastive"

    unit = "sentences"

    def prepare_data(self, train: Corpus, eval: Corpus | None) -> RunData:  # noqa: A002
        config = self.config
        exclusion = None
        if config.words.exclude:
            train, exclusion = exclude_examples(train, parse_word_list(list(config.words.exclude)))
        if len(train) == 0:
            raise BertologyError(f"The training data {train.name!r} ({train.source}) has no examples.")
        max_n = config.data.max_examples
        if max_n is not None and len(train) > max_n:
            rng = np.random.default_rng(config.seed)
            train = train.subset(sorted(int(i) for i in rng.choice(len(train), size=max_n, replace=False)))
        if config.early_stopping and not config.simcse.sts_data:
            raise BertologyError("Early stopping of contrastive training watches STS Spearman; pass --sts-data.")
        if config.simcse.mode == "supervised":
            self.unit = "triplets"
        return RunData(train, eval, exclusion=exclusion)

    def default_metric(self) -> str:
        return "spearman"

    def load(self, data: RunData) -> ModelToTrain:
        from bertology.models.loading import load_model

        loaded = load_model(self.config.model, kind="encoder", trust_remote_code=self.config.trust_remote_code)
        return ModelToTrain(loaded.model, loaded.tokenizer, loaded.describe, loaded.name)

    def _items(self, train: Corpus, tokenizer) -> list:
        """The training items (encoded sentences, or encoded triplets) and the manifest's words on them."""
        config = self.config
        self.data_info = {"mode": config.simcse.mode}
        if config.simcse.mode == "unsupervised":
            texts = sentences_of(train)
            enc = _encode_sentences(texts, tokenizer, config.data.max_length)
            self.data_info.update(n_sentences=len(texts), tokenisation=enc.describe())
            return list(enc.items)
        triplets, info = nli_triplets(train, config.simcse.positive_label, config.simcse.negative_label, config.seed)
        enc = _encode_sentences([s for t in triplets for s in t], tokenizer, config.data.max_length)
        by_index = {it.index: it for it in enc.items}
        self.data_info.update(info, positive_label=config.simcse.positive_label, negative_label=config.simcse.negative_label,
                              tokenisation=enc.describe())
        return [(by_index[3 * k], by_index[3 * k + 1], by_index[3 * k + 2]) for k in range(len(triplets))]

    def _sts(self, tokenizer):
        """The STS pairs (encoded) and gold scores of ``sts_data``, or None."""
        if not self.config.simcse.sts_data:
            return None
        sts_corpus, scores = load_sts(self.config.simcse.sts_data)
        max_len = self.config.data.max_length
        enc1 = _encode_sentences([ex.text for ex in sts_corpus], tokenizer, max_len)
        enc2 = _encode_sentences([ex.text_pair for ex in sts_corpus], tokenizer, max_len)
        self.data_info["sts"] = {"path": self.config.simcse.sts_data, "n_pairs": len(scores)}
        return enc1, enc2, scores

    def _anisotropy_before(self, model, encoder: _Encoder, data: RunData, tokenizer) -> None:
        """Anisotropy of the untrained model; the same sentences and token pairs are measured again at the end."""
        config = self.config
        self.anis, self.anis_rows = None, []
        if not config.simcse.anisotropy_sentences:
            return
        pool_texts = list(dict.fromkeys(sentences_of(data.eval) if data.eval is not None else sentences_of(data.train)))
        rng = np.random.default_rng(config.seed)
        size = min(config.simcse.anisotropy_sentences, len(pool_texts))
        chosen = [pool_texts[i] for i in sorted(rng.choice(len(pool_texts), size=size, replace=False))]
        enc = _encode_sentences(chosen, tokenizer, config.data.max_length)
        pairs = sample_token_pairs(enc, config.simcse.anisotropy_pairs, config.seed)
        self.anis = (enc, pairs)
        self.anis_rows = [{"model": "base", **r} for r in anisotropy_per_layer(model, encoder, enc, pairs, config.batch_size)]

    def make_head(self, loaded: ModelToTrain, data: RunData, device: torch.device) -> ContrastiveTask:
        config, model, tokenizer = self.config, loaded.model, loaded.tokenizer
        encoder = _Encoder(padding_id(tokenizer), uses_token_types(model), device, config.simcse.pooling)
        items = self._items(data.train, tokenizer)
        sts = self._sts(tokenizer)
        self._anisotropy_before(model, encoder, data, tokenizer)
        return ContrastiveTask(tokenizer, encoder, mode=config.simcse.mode, temperature=config.simcse.temperature, items=items,
                               sts=sts, batch_size=config.batch_size, tokenisation={"train": self.data_info["tokenisation"]})

    def final_metrics(self, head: ContrastiveTask, model, outcome: LoopOutcome) -> dict:
        return dict(outcome.metrics or {})

    def task_record(self, loaded: ModelToTrain, data: RunData) -> dict:
        return {"contrastive": self.data_info, "temperature": self.config.simcse.temperature, "pooling": self.config.simcse.pooling}

    def counts(self, head: ContrastiveTask, data: RunData) -> tuple[int, int]:
        return head.n_items, len(head.sts[2]) if head.sts is not None else 0

    def finish(self, loaded: ModelToTrain, head: ContrastiveTask, data: RunData, outcome: LoopOutcome) -> Finish:
        config = self.config
        metrics = self.final_metrics(head, loaded.model, outcome)
        rows = list(self.anis_rows)
        if self.anis is not None:
            rows += [{"model": "tuned", **r}
                     for r in anisotropy_per_layer(loaded.model, head.encoder, *self.anis, config.batch_size)]
        anisotropy = pd.DataFrame(rows, columns=ANISOTROPY_COLUMNS)
        if not anisotropy.empty:
            last = anisotropy["layer"].max()
            for who in ("base", "tuned"):
                metrics[f"anisotropy_last_layer_{who}"] = float(anisotropy.query(f"model == '{who}' and layer == {last}")["value"].item())
        train_losses = [r["value"] for r in outcome.rows if r["split"] == "train" and r["metric"] == "loss"]
        if train_losses:
            metrics["train_loss"] = float(train_losses[-1])
        return Finish(metrics=metrics, extra_tables={"anisotropy": anisotropy} if not anisotropy.empty else {}, record={
            "in_batch_negatives": config.batch_size - 1 if config.simcse.mode == "unsupervised" else 2 * config.batch_size - 1,
            "anisotropy": {"sentences": config.simcse.anisotropy_sentences, "pairs": config.simcse.anisotropy_pairs,
                           "tokens": "non-special tokens, drawn uniformly; partner from a different sentence"}})


def contrastive_finetune(config: FinetuneConfig, train: Corpus, eval: Corpus | None = None,  # noqa: A002
                         *, progress: bool = False, resume: bool = True, on_step=None) -> FinetuneResult:
    """Train ``config.model`` as a SimCSE sentence encoder (:class:`ContrastiveTrainer`); save it (no head) to ``out/model``.

    The result's ``extra_tables["anisotropy"]`` holds anisotropy per layer before (``model="base"``) and after
    (``model="tuned"``) training, and its ``finetune`` table the training loss and, with ``sts_data``,
    ``split="sts"`` Spearman rows. ``eval`` (optional) supplies the sentences for anisotropy; otherwise a sample
    of the training ones.
    """
    config = resolve_config(dataclasses.replace(config, objective="contrastive"), train)
    return ContrastiveTrainer(config).run(train, eval, progress=progress, resume=resume, on_step=on_step)
