"""The activation-difference lens (Minder et al. 2025): the mean of tuned - base, layer by layer, read through a head.

Both models run once over the run's sentences, batch by batch (the extraction loop's length-bucketed batches,
hidden states only); each batch is folded into running float64 sums (:class:`DifferenceStats`), so no copy of the
corpus' activations is kept. At every layer ``l`` (0 = the embeddings' output, ``l`` = the output of block ``l``,
``hidden_states[l]``) and in each position bucket:

* ``content``: every content token (padding, ``[CLS]``, ``[SEP]`` and the tokenizer's other special tokens
  excluded; ``[UNK]`` is text): ``d_l = mean(tuned - base)``, the lens's vector;
* ``position_0``: the first position of every sentence (``[CLS]`` / ``<s>``: the vector a classifier head reads);
* ``first``: content tokens at positions ``1..k`` (``--activation-difference-first``, default 5), ``rest``: after.

Tables:

* ``activation_difference``: ``layer, position, norm`` (of the mean difference), ``cosine_to_base_mean`` (cosine of
  it to the base's mean activation in the same bucket), ``mean_token_distance`` (mean of ``||tuned - base||`` per
  token: ``norm`` over it is near 1 when every token moves alike), ``base_rms`` (root mean squared norm of the
  base's activations), ``relative_norm`` (norm / base_rms), ``n_tokens``;
* ``activation_difference_tokens``: per layer the ``--activation-difference-tokens`` content tokens where
  ``||tuned - base||`` is largest: ``layer, rank, example, position, token, distance, context``;
* ``activation_difference_readout``: the difference read through a model's own head, ``layer, readout, vector,
  label_or_token, score, rank``. The head is applied as the model applies it (:func:`bertology.models.readout.
  head_logits`), and ``score`` is the logit change ``head(a + d) - head(a)`` at the base's mean activation ``a`` (so
  a head's biases and inner LayerNorm cancel): ``classifier`` (the tuned model's sequence-classification head,
  last layer only, ``a`` the base's mean ``position_0`` state, the vector its pooler reads; ``vector`` is
  ``content`` for ``d_N`` or ``position_0`` for the mean difference at the first position, where ``a + d`` is the
  tuned model's mean first-position state): one row per label; ``masked_lm`` (the base checkpoint's masked-LM head,
  every layer, logit-lens style, ``a`` the base's mean content activation at the layer, ``vector = content``): the
  top ``--activation-difference-top-k`` vocabulary items. A readout that does not apply (no such head) has one row
  with no label, score or rank, and ``note`` saying why (the manifest section says it too).
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd
import torch

from bertology.config import CompareConfig
from bertology.data.encode import EncodedCorpus
from bertology.experiments.crosscoder_buffer import paired_hidden_states
from bertology.experiments.registry import ExperimentContext, ExperimentOutcome, ExperimentSpec, jsonable
from bertology.models.pair import ModelPair
from bertology.models.readout import head_logits, is_sequence_classifier, masked_lm_head
from bertology.results import Result
from bertology.settings import Setting

NAME, TOKENS, READOUT = "activation_difference", "activation_difference_tokens", "activation_difference_readout"
MINDER = "Minder et al. 2025 (activation difference lens)"
BUCKETS = ("content", "position_0", "first", "rest")
#: Tokens on each side of a listed token in its ``context``.
CONTEXT_TOKENS = 6


@dataclass(frozen=True)
class DifferenceSettings:
    """Every choice that changes the lens's numbers (the manifest section records it)."""

    first: int = 5
    tokens: int = 20
    top_k: int = 10

    def to_dict(self) -> dict:
        return asdict(self)


def settings_from(config: CompareConfig) -> DifferenceSettings:
    """The lens's settings inside ``compare``."""
    return DifferenceSettings(config.activation_difference_first, config.activation_difference_tokens,
                              config.activation_difference_top_k)


@dataclass
class Batch:
    """One forward batch: both models' hidden states ``[layers, B, T, d]`` (float64), masks and where tokens sit."""

    base: torch.Tensor
    tuned: torch.Tensor
    real: torch.Tensor     # [B, T] not padding
    content: torch.Tensor  # [B, T] real and not special
    example: np.ndarray    # [B] the example's index in the corpus
    input_ids: np.ndarray  # [B, T]


def pair_batches(pair: ModelPair, encoded: EncodedCorpus, *, batch_size: int = 32,
                 device: str = "cpu") -> Iterator[Batch]:
    """Both models' hidden states at every layer, one :class:`Batch` per length-bucketed forward batch."""
    for items, t, caps in paired_hidden_states(pair, encoded, batch_size=batch_size, device=device):
        base, tuned = (torch.stack(c.hidden_states).double().cpu() for c in caps)
        yield Batch(base, tuned, t["mask"].bool(), t["content"].bool(),
                    np.array([it.index for it in items], dtype=np.int64), t["input_ids"].numpy())


def bucket_masks(real: torch.Tensor, content: torch.Tensor, first: int) -> dict[str, torch.Tensor]:
    """The four position buckets of a batch as ``[B, T]`` masks (see the module's docstring)."""
    pos = torch.arange(real.shape[1])[None, :].expand_as(real)
    return {"content": content, "position_0": real & (pos == 0), "first": content & (pos >= 1) & (pos <= first),
            "rest": content & (pos > first)}


class DifferenceStats:
    """Running sums per layer and bucket (float64) and each layer's top tokens by ``||tuned - base||``.

    ``update`` folds in one batch, ``merge`` another accumulator's sums (shards combine exactly; the top tokens
    too, ties broken by example then position)."""

    def __init__(self, layers: int, hidden: int, first: int, top_n: int) -> None:
        self.first, self.top_n = first, top_n
        nb = len(BUCKETS)
        self.sum_diff = torch.zeros(layers, nb, hidden, dtype=torch.float64)
        self.sum_base = torch.zeros(layers, nb, hidden, dtype=torch.float64)
        self.sum_dist = torch.zeros(layers, nb, dtype=torch.float64)
        self.sum_base_sq = torch.zeros(layers, nb, dtype=torch.float64)
        self.n = torch.zeros(nb, dtype=torch.float64)
        self.top = [np.zeros((0, 4)) for _ in range(layers)]  # rows: distance, example, position, token id

    def update(self, batch: Batch) -> None:
        diff = batch.tuned - batch.base
        dist = diff.norm(dim=-1)  # [layers, B, T]
        for b, mask in enumerate(bucket_masks(batch.real, batch.content, self.first).values()):
            self.sum_diff[:, b] += diff[:, mask].sum(dim=1)
            self.sum_base[:, b] += batch.base[:, mask].sum(dim=1)
            self.sum_dist[:, b] += dist[:, mask].sum(dim=1)
            self.sum_base_sq[:, b] += batch.base[:, mask].pow(2).sum(dim=(1, 2))
            self.n[b] += float(mask.sum())
        rows, cols = np.nonzero(batch.content.numpy())
        where = np.stack([batch.example[rows], cols, batch.input_ids[rows, cols]], axis=1).astype(np.float64)
        for layer in range(len(self.top)):
            found = np.concatenate([dist[layer][batch.content].numpy()[:, None], where], axis=1)
            self.top[layer] = self._best(np.concatenate([self.top[layer], found]))

    def _best(self, rows: np.ndarray) -> np.ndarray:
        """The ``top_n`` rows by distance (largest first; ties by example, then position)."""
        order = np.lexsort((rows[:, 2], rows[:, 1], -rows[:, 0]))
        return rows[order[: self.top_n]]

    def merge(self, other: "DifferenceStats") -> "DifferenceStats":
        for name in ("sum_diff", "sum_base", "sum_dist", "sum_base_sq", "n"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.top = [self._best(np.concatenate([a, b])) for a, b in zip(self.top, other.top)]
        return self

    def means(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The mean difference and the base's mean activation, ``[layers, buckets, d]`` (NaN for an empty bucket)."""
        n = self.n[None, :, None]
        return self.sum_diff / n, self.sum_base / n


def accumulate(pair: ModelPair, encoded: EncodedCorpus, settings: DifferenceSettings, *, batch_size: int = 32,
               device: str = "cpu") -> DifferenceStats:
    """The lens's sums over every sentence, streamed."""
    stats = DifferenceStats(pair.num_layers + 1, int(pair.base.model.config.hidden_size), settings.first,
                            settings.tokens)
    for batch in pair_batches(pair, encoded, batch_size=batch_size, device=device):
        stats.update(batch)
    return stats


def difference_rows(stats: DifferenceStats) -> pd.DataFrame:
    """The ``activation_difference`` table: one row per layer and non-empty bucket."""
    d, base = stats.means()
    rows = []
    for layer in range(d.shape[0]):
        for b, bucket in enumerate(BUCKETS):
            n = float(stats.n[b])
            if n == 0:
                continue
            norm = float(d[layer, b].norm())
            bnorm = float(base[layer, b].norm())
            cosine = float(d[layer, b] @ base[layer, b]) / (norm * bnorm) if norm > 0 and bnorm > 0 else float("nan")
            rms = float(np.sqrt(float(stats.sum_base_sq[layer, b]) / n))
            rows.append({"layer": layer, "position": bucket, "norm": norm, "cosine_to_base_mean": cosine,
                         "mean_token_distance": float(stats.sum_dist[layer, b]) / n, "base_rms": rms,
                         "relative_norm": norm / rms if rms > 0 else float("nan"), "n_tokens": int(n)})
    return pd.DataFrame(rows)


def token_rows(stats: DifferenceStats, encoded: EncodedCorpus, tokenizer) -> pd.DataFrame:
    """The ``activation_difference_tokens`` table: each layer's tokens that moved most, with their context."""
    by_index = {it.index: it for it in encoded.items}
    rows = []
    for layer, top in enumerate(stats.top):
        for rank, (dist, ex, pos, _) in enumerate(top.tolist()):
            ex, pos = int(ex), int(pos)
            pieces = tokenizer.convert_ids_to_tokens(list(by_index[ex].input_ids))
            left, right = max(0, pos - CONTEXT_TOKENS), pos + CONTEXT_TOKENS + 1
            context = " ".join(pieces[left:pos] + [f"[[{pieces[pos]}]]"] + pieces[pos + 1:right])
            rows.append({"layer": layer, "rank": rank, "example": ex, "position": pos, "token": pieces[pos],
                         "distance": float(dist), "context": context})
    return pd.DataFrame(rows, columns=["layer", "rank", "example", "position", "token", "distance", "context"])


def _ranked(layer: int, readout: str, vector: str, names: list[str], scores: np.ndarray, keep: int | None):
    """Readout rows, highest score first (rank 0), the first ``keep`` of them (None: all)."""
    order = np.argsort(-scores, kind="stable")[:keep]
    return [{"layer": layer, "readout": readout, "vector": vector, "label_or_token": names[i],
             "score": float(scores[i]), "rank": r, "note": None} for r, i in enumerate(order)]


def classifier_readout(model, stats: DifferenceStats) -> list[dict]:
    """The tuned classifier's logit change per label from the last layer's mean differences (content, position 0),
    at the base's mean position-0 state (the vector its head reads)."""
    d, base = stats.means()
    last, p0, content = d.shape[0] - 1, BUCKETS.index("position_0"), BUCKETS.index("content")
    anchor = base[last, p0]
    logits = head_logits(model, torch.stack([anchor, anchor + d[last, content], anchor + d[last, p0]]))
    labels = model.config.id2label
    names = [str(labels.get(i, i)) for i in range(logits.shape[1])]
    rows = []
    for vector, i in (("content", 1), ("position_0", 2)):
        rows += _ranked(last, "classifier", vector, names, (logits[i] - logits[0]).numpy(), None)
    return rows


def masked_lm_readout(model, stats: DifferenceStats, tokenizer, top_k: int) -> list[dict]:
    """Every layer's mean content difference through the masked-LM head at the base's mean content activation:
    the ``top_k`` vocabulary items whose logits it raises most."""
    d, base = stats.means()
    c = BUCKETS.index("content")
    anchors = base[:, c]
    change = (head_logits(model, anchors + d[:, c]) - head_logits(model, anchors)).numpy()
    names = tokenizer.convert_ids_to_tokens(list(range(change.shape[1])))
    return [row for layer in range(change.shape[0])
            for row in _ranked(layer, "masked_lm", "content", names, change[layer], top_k)]


READOUT_COLUMNS = ["layer", "readout", "vector", "label_or_token", "score", "rank", "note"]


def not_read(layer: int, readout: str, reason: str) -> dict:
    """The one row of a readout that does not apply: no label or token, no score or rank, and why (``note``)."""
    return {"layer": layer, "readout": readout, "vector": None, "label_or_token": None, "score": float("nan"),
            "rank": pd.NA, "note": f"not read: {reason}"}


def readouts(pair: ModelPair, stats: DifferenceStats, settings: DifferenceSettings, *,
             device: str = "cpu") -> tuple[pd.DataFrame, dict[str, str]]:
    """The readout table and, per readout, ``"read"`` or why it does not apply."""
    rows: list[dict] = []
    notes: dict[str, str] = {}
    tuned, last = pair.tuned.model, pair.num_layers
    if is_sequence_classifier(tuned):
        rows += classifier_readout(tuned, stats)
        notes["classifier"] = f"read through the tuned model's head ({type(tuned).__name__}, last layer)"
    else:
        rows.append(not_read(last, "classifier",
                             f"the tuned model has no sequence-classification head ({type(tuned).__name__})"))
        notes["classifier"] = rows[-1]["note"]
    mlm, reason = masked_lm_head(pair.base.path, getattr(pair.base.model.config, "architectures", None),
                                 next(pair.base.model.parameters()).dtype)
    if mlm is None:
        rows.append(not_read(last, "masked_lm", reason))
        notes["masked_lm"] = rows[-1]["note"]
    else:
        mlm.to(torch.device(device))
        rows += masked_lm_readout(mlm, stats, pair.tokenizer, settings.top_k)
        notes["masked_lm"] = f"read through the base checkpoint's masked-LM head ({type(mlm).__name__}, every layer)"
    table = pd.DataFrame(rows, columns=READOUT_COLUMNS)
    table["rank"] = table["rank"].astype("Int64")
    return table, notes


def run_activation_difference(pair: ModelPair, encoded: EncodedCorpus, settings: DifferenceSettings, *,
                              batch_size: int = 32, device: str = "cpu") -> tuple[dict[str, pd.DataFrame], dict]:
    """The three tables and the manifest section for a pair on its encoded sentences (the library entry)."""
    stats = accumulate(pair, encoded, settings, batch_size=batch_size, device=device)
    readout, notes = readouts(pair, stats, settings, device=device)
    section = {"settings": settings.to_dict(), "readouts": notes,
               "tokens": "content tokens: padding and special tokens such as [CLS] and [SEP] excluded; position_0 "
                         "is each sentence's first token",
               "n_tokens": {b: int(stats.n[i]) for i, b in enumerate(BUCKETS)}}
    tables = {NAME: difference_rows(stats), TOKENS: token_rows(stats, encoded, pair.tokenizer), READOUT: readout}
    return tables, jsonable(section)


# ------------------------------------------------------------------------------------------------ inside compare


def skip_reason(ctx: ExperimentContext) -> str | None:
    """The lens runs both models once more over the corpus, so it runs only when named."""
    if NAME not in ctx.config.analyses:
        return f"it runs only when named (--analyses {NAME})"
    return None


def _run(ctx: ExperimentContext) -> ExperimentOutcome:
    """The lens on the run's sentences, as ``compare`` encodes them."""
    from bertology.data.encode import encode_corpus

    config = ctx.config
    settings = settings_from(config)
    encoded = encode_corpus(ctx.corpus, ctx.pair.tokenizer, config.data.max_length, config.data.overlong)
    tables, section = run_activation_difference(ctx.pair, encoded, settings, batch_size=config.batch_size,
                                                device=config.device)
    return ExperimentOutcome({n: Result(n, t, settings.to_dict()) for n, t in tables.items()}, section)


def summary(tables: Mapping[str, pd.DataFrame]) -> str | None:
    """The layer whose mean difference is largest (relative to the base's scale), and the classifier's top label."""
    t = tables.get(NAME)
    if t is None or t.empty:
        return None
    content = t[t["position"] == "content"]
    top = content.loc[content["relative_norm"].idxmax()]
    line = (f"activation difference: largest at layer {int(top['layer'])} (norm {top['norm']:.3g}, "
            f"{top['relative_norm']:.2%} of the base's RMS)")
    r = tables.get(READOUT)
    if r is not None and not r.empty:
        head = r[(r["readout"] == "classifier") & (r["vector"] == "content") & r["note"].isna() & (r["rank"] == 0)]
        if not head.empty:
            line += f"; it pushes the classifier toward {head.iloc[0]['label_or_token']}"
    return line


SETTINGS = (
    Setting("activation_difference_first", 5, "Positions 1..k form the lens's 'first' bucket (position 0 is "
            "[CLS]; later content tokens are 'rest').", minimum=1, paper=MINDER),
    Setting("activation_difference_tokens", 20, "Tokens listed per layer where ||tuned - base|| is largest.",
            minimum=0),
    Setting("activation_difference_top_k", 10, "Vocabulary items listed per layer by the masked-LM readout.",
            minimum=1),
)

SPEC = ExperimentSpec(NAME, "the activation-difference lens", lambda config: (NAME, TOKENS, READOUT), settings_from,
                      skip_reason, _run, summary=summary, settings=SETTINGS)
