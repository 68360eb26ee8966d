"""A small CNN that learns Kovaleva's attention pattern classes from maps a person labelled.

Kovaleva et al. (2019, §4.1) hand-labelled ~400 maps and trained an 8-layer CNN on them (F1 0.86);
neither was released. This module is that recipe, small enough for a CPU:

- **Input** (:func:`map_images`): each map cropped to the example's real tokens, resized to
  ``size x size`` (area averaging when the map is larger, nearest-neighbour repetition when smaller,
  so short sentences are not blurred), then divided by its maximum, so the CNN sees what the
  thumbnails show a person (0 = no attention, 1 = the map's strongest cell).
- **Model** (:class:`PatternCNN`), 8 layers: 3 x (3x3 conv + ReLU + 2x2 max-pool), then a hidden
  dense layer + ReLU and the output layer.
- **Training** (:func:`train_pattern_cnn`): Adam, cross-entropy weighted by inverse class frequency
  (macro-F1 is the score), seeded; stratified k-fold cross-validation gives per-fold macro-F1 and
  out-of-fold predictions, then one model is fitted on all labelled maps.
- **Files** (:meth:`PatternClassifier.save`): ``pattern_cnn.safetensors`` (weights) and
  ``pattern_cnn.json`` (classes, input size, seed, cross-validation scores, agreement, creation time).
  A loaded :class:`PatternClassifier` can replace the rule classifier in
  :class:`~bertology.analyses.attention_patterns.AttentionPatterns`.
- **Labelling** (used by ``bertology patterns export`` / ``train``): :func:`sample_maps` picks maps
  with one seed, :func:`write_export` writes thumbnails, ``maps.npz`` (resized and raw maps,
  features, rule classes), ``labels.csv`` and an offline ``index.html`` labelling page;
  :func:`read_labels` reads the filled-in CSV back (errors name the CSV line).
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from bertology.settings import check_fields, setting_field, seed_field
from bertology.errors import BertologyError
from bertology.analyses.pattern_classifier import (  # noqa: F401  (re-exported: the pattern CNN API)
    DEFAULT_SIZE,
    FORMAT,
    IMAGE_RECIPE,
    META_FILE,
    WEIGHTS_FILE,
    PatternClassifier,
    PatternCNN,
    _json_default,
    _predict,
    map_images,
    resize_map,
)
from bertology.metrics.patterns import PATTERNS

logger = logging.getLogger(__name__)



@dataclass
class TrainSettings:
    """Hyper-parameters of one training run (recorded in the metadata); ``bertology patterns train``'s flags are
    generated from the fields made with :func:`~bertology.settings.setting_field`."""

    epochs: int = setting_field(40, "Training epochs per fit.", minimum=1)
    batch_size: int = setting_field(32, "Maps per training step.", minimum=1)
    lr: float = setting_field(1e-3, "Adam learning rate.", above=0)
    seed: int = seed_field("Seed for the folds, initialisation and shuffling.")
    channels: tuple[int, ...] = (8, 16, 32)
    hidden: int = 64

    def __post_init__(self) -> None:
        check_fields(self)

    def to_dict(self) -> dict:
        return {"epochs": self.epochs, "batch_size": self.batch_size, "lr": self.lr, "seed": self.seed,
                "channels": list(self.channels), "hidden": self.hidden}


def _fit(images: torch.Tensor, y: np.ndarray, n_classes: int, settings: TrainSettings, seed: int) -> PatternCNN:
    """Train one CNN on images ``[N, S, S]`` and class indices ``y`` (0..n_classes-1)."""
    from sklearn.utils.class_weight import compute_class_weight

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = PatternCNN(n_classes, images.shape[-1], settings.channels, settings.hidden)
    present = np.unique(y)
    weights = np.ones(n_classes)
    weights[present] = compute_class_weight("balanced", classes=present, y=y)
    loss_fn = nn.CrossEntropyLoss(weight=torch.as_tensor(weights, dtype=torch.float32))
    opt = torch.optim.Adam(model.parameters(), lr=settings.lr)
    x = images[:, None].float()
    target = torch.as_tensor(y, dtype=torch.long)
    model.train()
    for _ in range(settings.epochs):
        order = torch.randperm(len(x), generator=gen)
        for s in range(0, len(x), settings.batch_size):
            idx = order[s : s + settings.batch_size]
            opt.zero_grad()
            loss_fn(model(x[idx]), target[idx]).backward()
            opt.step()
    model.eval()
    return model


# -- scores ----------------------------------------------------------------------------------------


def agreement(a: Sequence[str], b: Sequence[str]) -> dict:
    """Cohen's kappa, accuracy and confusion matrix (rows ``a``, columns ``b``) of two labellings."""
    from sklearn.metrics import cohen_kappa_score, confusion_matrix

    a, b = np.asarray(a, dtype=object), np.asarray(b, dtype=object)
    labels = [p for p in PATTERNS if p in set(a) | set(b)]
    kappa = float(cohen_kappa_score(a, b, labels=labels)) if len(set(a) | set(b)) > 1 else float("nan")
    return {
        "kappa": kappa,
        "accuracy": float(np.mean(a == b)) if len(a) else float("nan"),
        "labels": labels,
        "confusion": confusion_matrix(a, b, labels=labels).tolist(),
        "n": int(len(a)),
    }


def _n_folds(labels: np.ndarray, folds: int) -> int:
    """Folds usable for stratified CV: at most the smallest class count; at least 2 (else an error)."""
    classes, counts = np.unique(labels, return_counts=True)
    if len(classes) < 2:
        raise BertologyError(f"all {len(labels)} labelled maps are {classes[0]!r}; label at least two classes.")
    if folds < 2:
        raise BertologyError(f"--folds must be at least 2, not {folds}")
    small = {str(c): int(n) for c, n in zip(classes, counts) if n < 2}
    if small:
        raise BertologyError(
            "cross-validation needs at least 2 labelled maps of each class used; too few: "
            + ", ".join(f"{c} ({n})" for c, n in small.items())
            + ". Label more maps of these classes, or relabel them."
        )
    k = min(folds, int(counts.min()))
    if k < folds:
        least = str(classes[counts.argmin()])
        logger.warning("class %r has only %d labelled maps: using %d folds instead of %d", least, counts.min(), k, folds)
    return k


@dataclass
class TrainReport:
    """Cross-validation scores and agreement of a trained pattern CNN."""

    classes: tuple[str, ...]
    folds: int
    fold_macro_f1: list[float]
    per_class_f1: dict[str, float]
    out_of_fold: np.ndarray  # predicted class names, one per labelled map
    label_counts: dict[str, int]
    agreement: dict = field(default_factory=dict)

    @property
    def macro_f1(self) -> float:
        return float(np.mean(self.fold_macro_f1))

    @property
    def macro_f1_std(self) -> float:
        return float(np.std(self.fold_macro_f1, ddof=1)) if len(self.fold_macro_f1) > 1 else 0.0

    def to_dict(self) -> dict:
        return {
            "folds": self.folds,
            "fold_macro_f1": self.fold_macro_f1,
            "macro_f1_mean": self.macro_f1,
            "macro_f1_std": self.macro_f1_std,
            "per_class_f1_out_of_fold": self.per_class_f1,
            "label_counts": self.label_counts,
            "agreement": self.agreement,
        }


def train_pattern_cnn(
    images: torch.Tensor | np.ndarray,
    labels: Sequence[str],
    *,
    folds: int = 5,
    settings: TrainSettings = TrainSettings(),
    rules: Sequence[str] | None = None,
) -> tuple[PatternClassifier, TrainReport]:
    """Cross-validate, then fit on all maps; returns the classifier and the report.

    ``images`` ``[N, S, S]`` from :func:`map_images`; ``labels`` pattern names. ``rules`` (the rule
    classifier's names for the same maps) adds agreement scores: person vs rules, CNN (out-of-fold)
    vs person, and CNN (out-of-fold) vs rules.
    """
    from sklearn.metrics import f1_score
    from sklearn.model_selection import StratifiedKFold

    x = torch.as_tensor(np.asarray(images), dtype=torch.float32)
    y_names = np.asarray(labels, dtype=object)
    if x.ndim != 3 or x.shape[1] != x.shape[2] or len(x) != len(y_names):
        raise ValueError(f"images must be [N, S, S] with one label each; got {tuple(x.shape)} and {len(y_names)} labels")
    bad = sorted({str(v) for v in y_names if v not in PATTERNS})
    if bad:
        raise BertologyError(f"unknown pattern labels {bad}; use {', '.join(PATTERNS)}")
    classes = tuple(p for p in PATTERNS if p in set(y_names))
    y = np.array([classes.index(v) for v in y_names], dtype=np.int64)
    k = _n_folds(y_names, folds)
    oof = np.zeros(len(y), dtype=np.int64)
    fold_f1 = []
    splitter = StratifiedKFold(n_splits=k, shuffle=True, random_state=settings.seed)
    for i, (tr, te) in enumerate(splitter.split(np.zeros(len(y)), y)):
        model = _fit(x[tr], y[tr], len(classes), settings, settings.seed + 1 + i)
        pred = _predict(model, x[te])
        oof[te] = pred
        fold_f1.append(float(f1_score(y[te], pred, labels=range(len(classes)), average="macro", zero_division=0)))
    per_class = f1_score(y, oof, labels=range(len(classes)), average=None, zero_division=0)
    oof_names = np.array([classes[i] for i in oof], dtype=object)
    report = TrainReport(
        classes=classes,
        folds=k,
        fold_macro_f1=fold_f1,
        per_class_f1={c: float(f) for c, f in zip(classes, per_class)},
        out_of_fold=oof_names,
        label_counts={c: int((y_names == c).sum()) for c in classes},
    )
    report.agreement["cnn_vs_labels"] = agreement(y_names, oof_names)
    if rules is not None:
        rules = np.asarray(rules, dtype=object)
        report.agreement["rules_vs_labels"] = agreement(y_names, rules)
        report.agreement["cnn_vs_rules"] = agreement(oof_names, rules)
    final = _fit(x, y, len(classes), settings, settings.seed)
    from bertology.results import now_iso, package_versions

    meta = {
        "created": now_iso(),
        "seed": settings.seed,
        "train": settings.to_dict(),
        "n_train": int(len(y)),
        "cv": report.to_dict(),
        "versions": package_versions(),
    }
    return PatternClassifier(final, classes, int(x.shape[-1]), meta), report


# -- the labelling workflow: sample maps, export them for a person, read the labels back -----------

EXPORT_FILES = ("maps", "maps.npz", "labels.csv", "index.html", "export.json")
LABEL_COLUMNS = ("id", "example", "layer", "head", "image", "predicted", "label")


@dataclass
class MapSample:
    """Attention maps sampled for labelling, with the rule classifier's prediction for each."""

    ids: list[str]
    example: np.ndarray  # corpus index
    layer: np.ndarray  # 1-based
    head: np.ndarray  # 0-based
    raw: list[np.ndarray]  # cropped [n, n] maps, float32
    images: np.ndarray  # [N, size, size] float32, see map_images
    features: np.ndarray  # [N, 7], columns FEATURE_COLUMNS
    predicted: np.ndarray  # rule classes (codes into PATTERNS)
    texts: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.ids)


def parse_heads(spec: str, num_layers: int, num_heads: int) -> list[tuple[int, int]]:
    """``all`` or comma-separated ``L{layer}H{head}`` / ``L{layer}`` (every head of a layer), 1-based layers."""
    import re

    text = spec.strip()
    if text.lower() == "all":
        return [(layer, h) for layer in range(1, num_layers + 1) for h in range(num_heads)]
    out: list[tuple[int, int]] = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*[Ll](\d+)(?:[Hh](\d+))?\s*", part)
        if m is None:
            raise BertologyError(f"--heads: {part.strip()!r} is not 'all', 'L<layer>' or 'L<layer>H<head>' (e.g. L3H7,L4)")
        layer = int(m.group(1))
        if not 1 <= layer <= num_layers:
            raise BertologyError(f"--heads: layer {layer} is outside 1..{num_layers}")
        heads = range(num_heads) if m.group(2) is None else [int(m.group(2))]
        for h in heads:
            if not 0 <= h < num_heads:
                raise BertologyError(f"--heads: head {h} is outside 0..{num_heads - 1}")
            if (layer, h) not in out:
                out.append((layer, h))
    return out


@dataclass(frozen=True)
class MapChoice:
    """Which attention maps :func:`sample_maps` reads: ``examples`` examples (seeded) x the ``heads`` (``all`` or
    ``L2H1,L3``), at most ``limit`` maps (a seeded subset when there are more)."""

    examples: int
    heads: str
    limit: int
    seed: int


def sample_maps(
    loaded,
    encoded,
    choice: MapChoice,
    *,
    size: int = DEFAULT_SIZE,
    batch_size: int = 16,
    thresholds=None,
    corpus=None,
    device: str = "cpu",
) -> MapSample:
    """Pick maps deterministically (``examples`` examples x the chosen heads, at most ``limit``) and read them.

    ``loaded`` is a :class:`~bertology.models.loading.LoadedModel`, ``encoded`` an
    :class:`~bertology.data.encode.EncodedCorpus`. One ``seed`` drives both choices (which examples,
    then which maps when there are more than ``limit``). ``corpus`` adds each example's text.
    """
    from bertology.data.batching import collate, length_batches
    from bertology.analyses.attention_patterns import segment_ids, vertical_key_mask
    from bertology.analyses.attention_targets import PunctuationLookup
    from bertology.metrics.patterns import PatternThresholds, classify, pattern_features
    from bertology.models import sites
    from bertology.models.hooks import capture

    examples, heads, limit, seed = choice.examples, choice.heads, choice.limit, choice.seed
    if examples < 1 or limit < 1:
        raise BertologyError(f"--examples and --limit must be at least 1 (got {examples} and {limit})")
    thresholds = thresholds or PatternThresholds()
    encoder = loaded.encoder
    cfg = encoder.config
    pairs = parse_heads(heads, cfg.num_hidden_layers, cfg.num_attention_heads)
    rng = np.random.default_rng(seed)
    n_items = len(encoded.items)
    chosen = np.sort(rng.choice(n_items, size=min(examples, n_items), replace=False))
    candidates = [(int(e), layer, h) for e in chosen for layer, h in pairs]
    if len(candidates) > limit:
        keep = np.sort(rng.choice(len(candidates), size=limit, replace=False))
        candidates = [candidates[i] for i in keep]
    wanted: dict[int, list[tuple[int, int]]] = {}
    for e, layer, h in candidates:
        wanted.setdefault(e, []).append((layer, h))
    items = [encoded.items[e] for e in sorted(wanted)]
    pos_of = {id(it): e for e, it in zip(sorted(wanted), items)}
    found: dict[tuple[int, int, int], tuple] = {}
    tok = loaded.tokenizer
    dev = torch.device(device)
    encoder.to(dev).eval()
    punct = PunctuationLookup(tok)
    with torch.inference_mode():
        for group in length_batches(items, batch_size):
            t = collate(group, tok.pad_token_id or 0)
            inputs = sites.model_inputs(encoder, t, dev)
            with capture(encoder, hidden_states=False) as cap:
                encoder(**inputs)
            mask = t["mask"].to(dev)
            vk = vertical_key_mask(tok, t["input_ids"].numpy(), t["mask"].numpy(), t["content"].numpy(), punct, device=dev)
            seg = segment_ids(group, mask)
            layers = sorted({layer for it in group for layer, _ in wanted[pos_of[id(it)]]})
            for layer in layers:
                a = cap.attentions[layer]
                feats = pattern_features(a, mask, vk, seg, band=thresholds.band)
                codes = classify(feats, thresholds)
                imgs = map_images(a, t["lengths"], size)
                for b, it in enumerate(group):
                    e = pos_of[id(it)]
                    n = len(it)
                    for lay, h in wanted[e]:
                        if lay == layer:
                            found[(e, lay, h)] = (a[b, h, :n, :n].float().cpu().numpy(), imgs[b, h].cpu().numpy(),
                                                  feats[b, h].cpu().numpy(), int(codes[b, h]))
    order = candidates
    idx = [encoded.items[e].index for e, _, _ in order]
    return MapSample(
        ids=[f"ex{encoded.items[e].index}_L{layer}H{h}" for e, layer, h in order],
        example=np.array(idx, dtype=np.int64),
        layer=np.array([layer for _, layer, _ in order], dtype=np.int64),
        head=np.array([h for _, _, h in order], dtype=np.int64),
        raw=[found[k][0] for k in order],
        images=np.stack([found[k][1] for k in order]).astype(np.float32),
        features=np.stack([found[k][2] for k in order]),
        predicted=np.array([found[k][3] for k in order], dtype=np.int64),
        texts=[_example_text(corpus, i) for i in idx] if corpus is not None else [],
    )


def _example_text(corpus, index: int) -> str:
    ex = corpus[index]
    return ex.text if ex.text_pair is None else f"{ex.text} ||| {ex.text_pair}"


def write_export(
    sample: MapSample, out: str | os.PathLike, thumbnail_png: Callable[..., bytes], *, info: dict | None = None,
    overwrite: bool = False,
) -> Path:
    """Write ``maps/<id>.png``, ``maps.npz``, ``labels.csv``, ``index.html`` and ``export.json`` into ``out``.

    ``thumbnail_png(map, scale=k)`` draws each map (the command line passes
    :func:`bertology.viz.patterns.thumbnail_png`: experiments compute, ``viz`` draws).

    Refuses a non-empty ``out`` unless ``overwrite`` (which replaces only these five entries). Files
    are written into a temporary folder beside ``out`` first, so an interrupted export leaves nothing.
    """
    import shutil

    import pandas as pd

    from bertology.results import now_iso, package_versions

    out = Path(out).expanduser()
    if out.exists() and not out.is_dir():
        raise BertologyError(f"--out {out} is a file, not a folder.")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise BertologyError(f"--out {out} is not empty; choose an empty folder or pass --overwrite.")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        (tmp / "maps").mkdir()
        rows = []
        for i, mid in enumerate(sample.ids):
            n = len(sample.raw[i])
            (tmp / "maps" / f"{mid}.png").write_bytes(thumbnail_png(sample.raw[i], scale=max(1, 160 // max(n, 1))))
            rows.append({
                "id": mid, "example": int(sample.example[i]), "layer": int(sample.layer[i]),
                "head": int(sample.head[i]), "image": f"maps/{mid}.png",
                "predicted": PATTERNS[int(sample.predicted[i])], "label": "", "n_tokens": n,
            })
        table = pd.DataFrame(rows, columns=list(LABEL_COLUMNS) + ["n_tokens"])
        table.to_csv(tmp / "labels.csv", index=False)
        lengths = np.array([len(r) for r in sample.raw], dtype=np.int64)
        np.savez_compressed(
            tmp / "maps.npz",
            ids=np.array(sample.ids, dtype=str),
            images=sample.images.astype(np.float32),
            raw=np.concatenate([r.ravel() for r in sample.raw]).astype(np.float32) if len(sample) else np.zeros(0, np.float32),
            raw_lengths=lengths,
            features=sample.features,
            predicted=sample.predicted,
            example=sample.example,
            layer=sample.layer,
            head=sample.head,
        )
        meta = dict(info or {})
        meta.update(created=now_iso(), n_maps=len(sample), image_size=int(sample.images.shape[-1]),
                    image=IMAGE_RECIPE, patterns=list(PATTERNS), versions=package_versions())
        (tmp / "export.json").write_text(json.dumps(meta, indent=2, default=_json_default), encoding="utf-8")
        (tmp / "index.html").write_text(contact_sheet(rows, sample.texts), encoding="utf-8")
        if out.exists():
            for name in EXPORT_FILES:
                target = out / name
                if target.is_dir():
                    shutil.rmtree(target)
                elif target.exists():
                    target.unlink()
            for name in EXPORT_FILES:
                os.replace(tmp / name, out / name)
            tmp.rmdir()
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def contact_sheet(rows: list[dict], texts: Sequence[str] = ()) -> str:
    """An offline HTML page of all thumbnails with buttons (or keys 1-5) to label them and save a CSV."""
    import html

    cards = []
    for i, r in enumerate(rows):
        text = texts[i] if i < len(texts) else ""
        buttons = "".join(
            f'<button type="button" data-l="{html.escape(p)}">{k + 1} {html.escape(p)}</button>' for k, p in enumerate(PATTERNS)
        )
        cards.append(
            f'<figure class="card" tabindex="0" data-i="{i}" title="{html.escape(text)}">'
            f'<img src="{html.escape(r["image"])}" alt="{html.escape(r["id"])}" loading="lazy">'
            f'<figcaption><b>{html.escape(r["id"])}</b> · {r["n_tokens"]} tokens<br>rules: '
            f'{html.escape(r["predicted"])} · label: <span class="lab">–</span></figcaption>'
            f'<div class="btns">{buttons}</div></figure>'
        )
    data = json.dumps(rows).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    cols = json.dumps(list(LABEL_COLUMNS) + ["n_tokens"])
    keys = json.dumps(list(PATTERNS))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Attention maps to label</title>
<style>
body{{font-family:sans-serif;margin:1em;color:#222}} .grid{{display:flex;flex-wrap:wrap;gap:10px}}
.card{{margin:0;padding:6px;border:2px solid #ddd;border-radius:4px;width:170px;font-size:11px}}
.card:focus{{outline:none;border-color:#1f5aa6}} .card.done{{background:#eef6ee}}
.card img{{width:160px;height:160px;image-rendering:pixelated;display:block}}
.btns button{{font-size:10px;margin:1px;padding:1px 3px}} .btns button.on{{background:#1f5aa6;color:#fff}}
</style></head><body>
<h1>Attention maps to label</h1>
<p>Label each map as one of: 1 vertical (stripes on [CLS]/[SEP]/punctuation), 2 diagonal (self or
neighbouring token), 3 vertical+diagonal, 4 block (each sentence of a pair attends within itself),
5 heterogeneous (anything else). Rows attend (queries, top to bottom), columns are attended to (keys,
left to right); [CLS] is the first row/column and [SEP] the last; colour runs from 0 to the map's
maximum. Click a button, or focus a map (click or Tab) and press 1-5 (then it moves to the next).
Hover a map to see its sentence.</p>
<p><button type="button" id="download">Download labels.csv</button> <span id="progress"></span>
Save it over <code>labels.csv</code> in this folder (or edit the <code>label</code> column of that
file by hand), then run <code>bertology patterns train labels.csv</code>.</p>
<div class="grid">
{''.join(cards)}
</div>
<script type="application/json" id="rows">{data}</script>
<script>
(function() {{
  var rows = JSON.parse(document.getElementById("rows").textContent);
  var cols = {cols}, names = {keys};
  var cards = Array.prototype.slice.call(document.querySelectorAll(".card"));
  function progress() {{
    var n = rows.filter(function(r) {{ return r.label; }}).length;
    document.getElementById("progress").textContent = n + " of " + rows.length + " labelled";
  }}
  function setLabel(i, label) {{
    rows[i].label = label;
    var card = cards[i];
    card.classList.add("done");
    card.querySelector(".lab").textContent = label;
    card.querySelectorAll("button").forEach(function(b) {{ b.classList.toggle("on", b.dataset.l === label); }});
    progress();
  }}
  cards.forEach(function(card, i) {{
    card.querySelectorAll("button").forEach(function(b) {{
      b.addEventListener("click", function() {{ setLabel(i, b.dataset.l); }});
    }});
    card.addEventListener("keydown", function(ev) {{
      var k = parseInt(ev.key, 10);
      if (k >= 1 && k <= names.length) {{
        setLabel(i, names[k - 1]);
        if (cards[i + 1]) cards[i + 1].focus();
        ev.preventDefault();
      }}
    }});
  }});
  function cell(v) {{
    var s = String(v === undefined || v === null ? "" : v);
    return /[",\\n]/.test(s) ? '"' + s.replace(/"/g, '""') + '"' : s;
  }}
  document.getElementById("download").addEventListener("click", function() {{
    var lines = [cols.join(",")].concat(rows.map(function(r) {{
      return cols.map(function(c) {{ return cell(r[c]); }}).join(",");
    }}));
    var blob = new Blob([lines.join("\\n") + "\\n"], {{type: "text/csv"}});
    var a = document.createElement("a");
    a.href = URL.createObjectURL(blob);
    a.download = "labels.csv";
    document.body.appendChild(a);
    a.click();
    a.remove();
  }});
  progress();
}})();
</script>
</body></html>
"""


@dataclass
class LabelledMaps:
    """The labelled rows of a labels CSV with their images and the rule classifier's names."""

    ids: list[str]
    images: np.ndarray
    labels: list[str]
    rules: list[str]
    n_skipped: int
    n_rows: int


def read_labels(csv_path: str | os.PathLike) -> LabelledMaps:
    """Read a labels CSV written by :func:`write_export` (``label`` filled in) and its ``maps.npz``.

    Labels are the five pattern names (case and spaces ignored); empty labels are skipped and counted.
    Any other value is an error that names the CSV line.
    """
    import pandas as pd

    path = Path(csv_path).expanduser()
    if not path.is_file():
        raise BertologyError(f"{path} does not exist; pass the labels.csv written by `bertology patterns export`.")
    try:
        table = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (pd.errors.ParserError, UnicodeDecodeError, pd.errors.EmptyDataError) as err:
        raise BertologyError(f"{path} is not a readable CSV ({err}).") from err
    missing = [c for c in ("id", "label") if c not in table.columns]
    if missing:
        raise BertologyError(f"{path} has no column(s) {missing}; columns are {list(table.columns)}.")
    npz_path = path.parent / "maps.npz"
    if not npz_path.exists():
        raise BertologyError(f"{npz_path} does not exist; keep the CSV in the folder written by `bertology patterns export`.")
    with np.load(npz_path, allow_pickle=False) as npz:
        ids = [str(i) for i in npz["ids"]]
        images = npz["images"]
        predicted = npz["predicted"]
    where = {mid: i for i, mid in enumerate(ids)}
    keep, labels, rules, out_ids = [], [], [], []
    skipped = 0
    valid = {p.replace(" ", ""): p for p in PATTERNS}
    for r, row in enumerate(table.itertuples(index=False)):
        line = r + 2  # the header is line 1
        raw = str(row.label)
        norm = "".join(raw.split()).lower()
        if not norm:
            skipped += 1
            continue
        if norm not in valid:
            raise BertologyError(
                f"{path.name} line {line} (id {row.id}): label {raw!r} is not one of {', '.join(PATTERNS)}."
            )
        if row.id not in where:
            raise BertologyError(f"{path.name} line {line}: id {row.id!r} is not in {npz_path.name}.")
        i = where[row.id]
        keep.append(i)
        out_ids.append(str(row.id))
        labels.append(valid[norm])
        pred = getattr(row, "predicted", "") if "predicted" in table.columns else ""
        rules.append(pred if pred in PATTERNS else PATTERNS[int(predicted[i])])
    if not keep:
        raise BertologyError(
            f"{path} has no labelled rows ({skipped} with an empty label); fill the label column "
            f"with {', '.join(PATTERNS)} (index.html in that folder helps)."
        )
    return LabelledMaps(out_ids, images[keep], labels, rules, skipped, len(table))
