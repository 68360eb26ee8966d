"""The labelling round trip of the pattern CNN: sample attention maps, export them for a person, read the labels back.

Kovaleva et al. (2019, §4.1) labelled ~400 maps by hand; ``bertology patterns export`` / ``train`` do the same:
:func:`sample_maps` picks maps with one seed and reads them with the rule classifier's prediction, :func:`write_export`
writes thumbnails, ``maps.npz`` (resized and raw maps, features, rule classes), ``labels.csv`` and an offline
``index.html`` labelling page (:func:`contact_sheet`); :func:`read_labels` reads the filled-in CSV back (errors name
the CSV line). The CNN those labels train is :mod:`bertology.experiments.pattern_cnn`.
"""
from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from bertology.analyses.pattern_classifier import DEFAULT_SIZE, IMAGE_RECIPE, _json_default, map_images
from bertology.errors import BertologyError
from bertology.metrics.patterns import PATTERNS

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
    from bertology.metrics.patterns import PatternThresholds

    if choice.examples < 1 or choice.limit < 1:
        raise BertologyError(f"--examples and --limit must be at least 1 (got {choice.examples} and {choice.limit})")
    cfg = loaded.encoder.config
    pairs = parse_heads(choice.heads, cfg.num_hidden_layers, cfg.num_attention_heads)
    order = chosen_maps(len(encoded.items), pairs, choice)
    wanted: dict[int, list[tuple[int, int]]] = {}
    for e, layer, h in order:
        wanted.setdefault(e, []).append((layer, h))
    found = _read_maps(loaded, encoded, wanted, size=size, batch_size=batch_size,
                       thresholds=thresholds or PatternThresholds(), device=device)
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


def chosen_maps(n_items: int, pairs: Sequence[tuple[int, int]], choice: MapChoice) -> list[tuple[int, int, int]]:
    """The maps to read, ``(item position, layer, head)`` in order: ``choice.examples`` items drawn with
    ``choice.seed`` x the heads ``pairs``, then a seeded subset of ``choice.limit`` when there are more (one
    generator drives both draws, in that order)."""
    rng = np.random.default_rng(choice.seed)
    chosen = np.sort(rng.choice(n_items, size=min(choice.examples, n_items), replace=False))
    candidates = [(int(e), layer, h) for e in chosen for layer, h in pairs]
    if len(candidates) > choice.limit:
        keep = np.sort(rng.choice(len(candidates), size=choice.limit, replace=False))
        candidates = [candidates[i] for i in keep]
    return candidates


def _read_maps(loaded, encoded, wanted: dict[int, list[tuple[int, int]]], *, size: int, batch_size: int,
               thresholds, device: str) -> dict[tuple[int, int, int], tuple]:
    """One forward per length batch of the wanted items: per ``(item position, layer, head)`` the cropped map, its
    image, its pattern features and the rule class (``thresholds``)."""
    from bertology.data.batching import collate, length_batches
    from bertology.analyses.attention_patterns import segment_ids, vertical_key_mask
    from bertology.analyses.attention_targets import PunctuationLookup
    from bertology.metrics.patterns import classify, pattern_features
    from bertology.models import sites
    from bertology.models.hooks import capture

    encoder, tok = loaded.encoder, loaded.tokenizer
    items = [encoded.items[e] for e in sorted(wanted)]
    pos_of = {id(it): e for e, it in zip(sorted(wanted), items)}
    found: dict[tuple[int, int, int], tuple] = {}
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
    return found


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


#: The labelling page (:func:`contact_sheet`): ``{cards}`` the thumbnails, ``{data}`` the rows as JSON, ``{cols}`` the
#: CSV columns, ``{keys}`` the pattern names (doubled braces are the page's own CSS and JavaScript).
_SHEET = """<!doctype html>
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
{cards}
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
    return _SHEET.format(cards="".join(cards), data=data, cols=cols, keys=keys)
