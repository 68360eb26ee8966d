"""Render a run directory into one self-contained, offline HTML report.

``render_report(run_dir)`` reads ``manifest.json`` and the known tables under ``tables/``, draws the
figures (also written to ``figures/<name>.svg``) and writes ``report.html`` atomically. The page
inlines its CSS, JavaScript and SVG figures and references nothing on the network (a
Content-Security-Policy forbids it); every string that comes from data is HTML-escaped by Jinja2's
autoescaping, and data embedded as JSON escapes ``<``, ``>``, ``&`` and ``'``.

Sections whose table is absent are left out; a malformed table becomes a warning in the report
rather than a broken page.
"""
from __future__ import annotations

import datetime as _dt
import html as _html
import json
import logging
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd
from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

from bertology.errors import BertologyError
from bertology.results import atomic_write_text

logger = logging.getLogger(__name__)

__all__ = ["KNOWN_TABLES", "Report", "render_report"]

#: Tables the report knows how to show, with the columns each section needs.
KNOWN_TABLES: dict[str, tuple[str, ...]] = {
    "attention_change": ("layer", "head", "cosine", "js_divergence", "n_examples"),
    "representation_similarity": ("layer_base", "layer_tuned", "metric", "value", "n_tokens"),
    "representation_similarity_ood": ("layer_base", "layer_tuned", "metric", "value", "n_tokens", "domain"),
    "finetune": ("step", "split", "metric", "value"),
    "attention_targets": ("model", "layer", "head", "target", "value"),
    "relation_heads": ("model", "relation", "direction", "layer", "head", "accuracy", "baseline_offset",
                       "baseline_accuracy", "n"),
    "attention_patterns": ("model", "layer", "head", "pattern", "fraction"),
    "head_map": ("model", "layer", "head", "x", "y", "moved", "n_examples"),
    "head_distance": ("model_a", "layer_a", "head_a", "model_b", "layer_b", "head_b", "js_divergence"),
    "ablation": ("target", "layer", "head", "label", "mode", "layer_mode", "metric", "value", "delta", "ci_low",
                 "ci_high", "n_examples", "helps", "hurts"),
    "head_importance": ("layer", "head", "importance"),
    "geometry": ("model", "layer", "metric", "value", "n"),
    "probe": ("model", "layer", "probe", "split", "uuas", "dspr", "root_acc", "nspr"),
    "anisotropy": ("model", "layer", "metric", "value"),
    "geometry_words": ("model", "layer", "word", "self_similarity"),
    "pca_views": ("model", "layer", "fit", "x", "y", "category", "label", "explained_variance"),
    "pruning_curve": ("order", "fraction_removed", "metric", "value"),
}

SIMILARITY_METRICS = ("cka_linear", "cka_debiased", "rsa_pearson", "rsa_spearman")

_SECTION_TITLES = {
    "overview": "Overview",
    "attention-change": "Attention change",
    "representation-similarity": "Representation similarity",
    "finetune": "Fine-tuning",
    "attention-targets": "Attention targets",
    "relation-heads": "Relation heads",
    "head-map": "Head map",
    "attention-patterns": "Attention patterns",
    "attention-viewer": "Attention viewer",
    "ablation": "Ablation and head importance",
    "geometry": "Embedding geometry",
    "pca-views": "PCA views of tokens",
    "probe": "Structural probes",
}

#: Targets drawn per layer, and their labels.
TARGET_LABELS = {
    "cls": "[CLS]", "sep": "[SEP]", "punct": "punctuation", "self": "self", "prev": "previous token",
    "next": "next token", "noun": "nouns", "verb": "verbs", "pron": "pronouns", "subject": "subjects",
    "object": "objects", "negation": "negation", "entropy": "entropy (nats)",
}

_MODEL_FIELDS = (
    ("name", "Name"),
    ("source", "Source"),
    ("path", "Path"),
    ("family", "Encoder family"),
    ("model_type", "Model type"),
    ("class", "Class"),
    ("num_hidden_layers", "Layers"),
    ("num_attention_heads", "Heads per layer"),
    ("hidden_size", "Hidden size"),
    ("is_classifier", "Classification head"),
    ("attn_implementation", "Attention implementation"),
    ("weights_sha256", "Weights SHA-256"),
)

_DATA_FIELDS = (
    ("name", "Name"),
    ("source", "Source"),
    ("n_examples", "Examples read"),
    ("pairs", "Sentence pairs"),
    ("labels", "Labels"),
    ("sha256", "Data SHA-256"),
)

_ENCODING_FIELDS = (
    ("max_length", "Max length (tokens)"),
    ("overlong", "Over-long inputs"),
    ("n_input", "Examples encoded"),
    ("n_kept", "Examples kept"),
    ("n_skipped_overlong", "Skipped (over-long)"),
    ("n_truncated", "Truncated"),
    ("n_tokens", "Tokens"),
)


# ------------------------------------------------------------------------------------------ helpers
def _is_missing(value: Any) -> bool:
    if value is None:
        return True
    try:
        return isinstance(value, float) and math.isnan(value)
    except TypeError:  # pragma: no cover
        return False


def fmt_value(value: Any, digits: int = 4) -> str:
    """Human format for a table cell: thousands separators, 4 significant digits, — for missing."""
    if _is_missing(value):
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        try:
            value = value.item()  # numpy scalar -> python
        except (ValueError, AttributeError):
            pass
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isinf(value):
            return "∞" if value > 0 else "−∞"
        if value == 0:
            return "0"
        if value.is_integer() and abs(value) < 1e15:
            return f"{int(value):,}"
        if 1e3 <= abs(value) < 1e15:
            return f"{value:,.0f}"
        if 1e-3 <= abs(value) < 1e3:
            text = f"{value:.{digits}g}"
            # "1.000" (not "1") when 0.99996 rounds to 1: the reader must not take it for exact.
            return text if ("." in text or "e" in text) else f"{value:#.{digits}g}"
        return f"{value:.{digits}g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(fmt_value(v, digits) for v in value) if value else "—"
    if isinstance(value, Mapping):
        return json.dumps(_jsonable(value), sort_keys=True)
    return str(value)


def _sort_key(value: Any) -> str:
    """Raw value for client-side sorting (``data-value``)."""
    if _is_missing(value):
        return ""
    if isinstance(value, bool):
        return str(int(value))
    if hasattr(value, "item"):
        try:
            value = value.item()
        except (ValueError, AttributeError):
            pass
    if isinstance(value, (int, float)):
        return repr(float(value))
    return str(value)


def _jsonable(obj: Any) -> Any:
    """A JSON-safe copy: NaN/inf -> None, unknown objects -> str."""
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, (int, str)):
        return obj
    if isinstance(obj, float):
        return None if (math.isnan(obj) or math.isinf(obj)) else obj
    if hasattr(obj, "item"):
        try:
            return _jsonable(obj.item())
        except (ValueError, AttributeError):
            pass
    return str(obj)


def _flatten(d: Mapping, prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.extend(_flatten(value, f"{name}."))
        else:
            out.append((name, value))
    return out


def _humanize(key: str) -> str:
    if key.startswith("n_"):
        key = key[2:] + " (count)"
    text = key.replace("_", " ").replace(".", " › ")
    return text[:1].upper() + text[1:]


def _mapping(value: Any) -> dict:
    return dict(value) if isinstance(value, Mapping) else {}


def _unique_text(series: pd.Series) -> str:
    values = sorted(pd.unique(series.dropna()).tolist(), key=lambda v: (str(type(v)), v))
    if not values:
        return "—"
    if len(values) == 1:
        return fmt_value(values[0])
    if len(values) > 4 and all(isinstance(v, (int, float)) for v in values):
        return f"{fmt_value(min(values))}–{fmt_value(max(values))}"
    return ", ".join(fmt_value(v) for v in values)


# -------------------------------------------------------------------------------------------- input
def _read_manifest(run_dir: Path, warnings: list[str]) -> dict:
    path = run_dir / "manifest.json"
    if not path.exists():
        warnings.append("manifest.json is missing: models, data and settings are unknown for this run.")
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BertologyError(f"{path} is not valid JSON ({err}); cannot render the report.") from err
    if not isinstance(data, dict):
        raise BertologyError(f"{path} should hold a JSON object, not {type(data).__name__}.")
    return data


def _read_tables(run_dir: Path, warnings: list[str]) -> tuple[dict[str, pd.DataFrame], list[dict]]:
    """Known tables (validated) and a listing of every table file in the run."""
    folder = run_dir / "tables"
    tables: dict[str, pd.DataFrame] = {}
    names = sorted({p.stem for p in folder.glob("*.parquet")} | {p.stem for p in folder.glob("*.csv")})
    listing: list[dict] = []
    for name in names:
        pq, csv = folder / f"{name}.parquet", folder / f"{name}.csv"
        df = None
        for path, reader in ((pq, pd.read_parquet), (csv, pd.read_csv)):
            if not path.exists():
                continue
            try:
                df = reader(path)
                break
            except Exception as err:  # noqa: BLE001 - any reader failure becomes a warning
                warnings.append(f"Could not read tables/{path.name}: {type(err).__name__}: {err}")
        files = [p.name for p in (pq, csv) if p.exists()]
        entry = {"name": name, "files": files, "rows": None if df is None else len(df), "shown": False}
        listing.append(entry)
        if df is None or name not in KNOWN_TABLES:
            continue
        missing = [c for c in KNOWN_TABLES[name] if c not in df.columns]
        if missing:
            warnings.append(
                f"Table {name!r} lacks column(s) {', '.join(missing)}; its section is left out."
            )
            continue
        if df.empty:
            warnings.append(f"Table {name!r} is empty; its section is left out.")
            continue
        tables[name] = df
        entry["shown"] = True
    return tables, listing


# ------------------------------------------------------------------------------------------ figures
class _Figures:
    """Builds figures, writes ``figures/<name>.svg`` and keeps the inline SVG for the page."""

    def __init__(self, run_dir: Path, warnings: list[str]):
        self.dir = run_dir / "figures"
        self.warnings = warnings
        self.written: list[str] = []

    def make(self, name: str, build: Callable[[], Any], caption: str, alt: str) -> dict | None:
        from bertology.viz.figures import figure_to_svg

        try:
            fig = build()
            svg = figure_to_svg(fig, id_prefix=name)
        except Exception as err:  # noqa: BLE001 - a bad figure must not sink the report
            logger.warning("figure %s failed: %s", name, err, exc_info=True)
            self.warnings.append(f"Figure {name!r} could not be drawn: {type(err).__name__}: {err}")
            return None
        atomic_write_text(self.dir / f"{name}.svg", svg)
        self.written.append(name)
        inline = svg[svg.find("<svg"):]
        # role/aria-label for screen readers; the label is our own text, escaped anyway.
        inline = inline.replace(
            "<svg ", f'<svg role="img" aria-label="{_html.escape(alt, quote=True)}" ', 1
        )
        return {"name": name, "svg": Markup(inline), "caption": caption, "file": f"figures/{name}.svg"}


# ----------------------------------------------------------------------------------------- sections
def _overview(manifest: dict, listing: list[dict], warnings: list[str], derived: list[dict]) -> dict:
    models = _mapping(manifest.get("models"))
    model_names = [k for k in ("base", "tuned") if k in models] + [
        k for k in models if k not in ("base", "tuned")
    ]
    model_dicts = {k: _mapping(models[k]) for k in model_names}
    rows = []
    seen = set()
    for key, label in _MODEL_FIELDS:
        if any(key in m for m in model_dicts.values()):
            rows.append((key, label))
            seen.add(key)
    for m in model_dicts.values():
        for key in m:
            if key not in seen:
                rows.append((key, _humanize(key)))
                seen.add(key)
    model_rows = []
    for key, label in rows:
        cells = []
        for name in model_names:
            value = model_dicts[name].get(key)
            text = fmt_value(value)
            hashlike = isinstance(value, str) and key.endswith("sha256") and len(value) > 16
            cells.append({"text": value[:12] + "…" if hashlike else text, "title": text if hashlike else None,
                          "code": key in ("path", "weights_sha256", "class") or hashlike})
        differs = len({fmt_value(model_dicts[n].get(key)) for n in model_names}) > 1
        model_rows.append({"label": label, "cells": cells, "differs": differs})

    data = _mapping(manifest.get("data"))
    encoding = _mapping(data.get("encoding"))
    data_rows = []
    for key, label in _DATA_FIELDS:
        if key in data:
            value = data[key]
            hashlike = isinstance(value, str) and key == "sha256" and len(value) > 16
            data_rows.append({"label": label, "text": value[:12] + "…" if hashlike else fmt_value(value),
                              "title": fmt_value(value) if hashlike else None, "code": hashlike,
                              "alert": False})
    for key, value in data.items():
        if key not in dict(_DATA_FIELDS) and key != "encoding":
            data_rows.append({"label": _humanize(key), "text": fmt_value(value), "title": None,
                              "code": False, "alert": False})
    for key, label in _ENCODING_FIELDS:
        if key in encoding:
            value = encoding[key]
            alert = key in ("n_skipped_overlong", "n_truncated") and bool(value)
            data_rows.append({"label": label, "text": fmt_value(value), "title": None, "code": False,
                              "alert": alert})
    for key, value in encoding.items():
        if key not in dict(_ENCODING_FIELDS):
            data_rows.append({"label": _humanize(key), "text": fmt_value(value), "title": None,
                              "code": False, "alert": False})

    settings = []
    run_rows = []
    for key, label in (("kind", "Run kind"), ("seed", "Seed"), ("device", "Device"), ("dtype", "Dtype"),
                       ("attn_implementation", "Attention implementation"), ("fingerprint", "Fingerprint"),
                       ("wall_time_s", "Wall time (s)")):
        if key in manifest and not isinstance(manifest[key], Mapping):
            run_rows.append({"label": label, "text": fmt_value(manifest[key]), "code": False})
    if run_rows:
        settings.append({"group": "Run", "rows": run_rows})
    for group, key in (("Configuration", "config"), ("Analysis parameters", "analyses")):
        rows = [{"label": k, "text": fmt_value(v), "code": True}
                for k, v in _flatten(_mapping(manifest.get(key)))]
        if rows:
            settings.append({"group": group, "rows": rows})

    summary = []
    for key, value in _flatten(_mapping(manifest.get("summary"))):
        summary.append({"label": _humanize(key), "text": fmt_value(value), "note": None})

    packages = [{"name": k, "version": fmt_value(v)} for k, v in _mapping(manifest.get("packages")).items()]
    raw_warnings = manifest.get("warnings") or []
    if isinstance(raw_warnings, (str, Mapping)):
        raw_warnings = [raw_warnings]
    return {
        "models": model_names,
        "model_rows": model_rows,
        "data_rows": data_rows,
        "settings": settings,
        "summary": summary + derived,
        "packages": packages,
        "warnings": [fmt_value(w) if not isinstance(w, str) else w for w in raw_warnings] + warnings,
        "tables": listing,
        "command": manifest.get("command"),
    }


def _attention_section(df: pd.DataFrame, figs: _Figures, derived: list[dict]) -> dict:
    from bertology.viz.figures import head_heatmap, layer_curve

    df = df.copy()
    for col in ("layer", "head"):
        df[col] = pd.to_numeric(df[col], errors="coerce")
    df = df.dropna(subset=["layer", "head"])
    df["layer"] = df["layer"].astype(int)
    df["head"] = df["head"].astype(int)
    heads = df.groupby(["layer", "head"], as_index=False).mean(numeric_only=True)
    n_layers, n_heads = heads["layer"].nunique(), heads["head"].nunique()

    figures = [
        figs.make(
            "attention_cosine",
            lambda: head_heatmap(heads, "cosine", title="Cosine similarity",
                                 vmax=1.0 if heads["cosine"].max() <= 1.0 + 1e-6 else None, min_span=0.1),
            "Cosine similarity between base and tuned attention maps, per head (mean over examples; "
            "1 = unchanged). Darker = changed more.",
            "Heatmap of attention cosine similarity per layer and head",
        ),
        figs.make(
            "attention_js",
            lambda: head_heatmap(heads, "js_divergence", title="JS divergence",
                                 vmin=0.0, min_span=0.05),
            "Jensen–Shannon divergence (base 2, in bits; 0 = unchanged) between base and tuned attention "
            "distributions of each query, averaged over queries and examples. Darker = changed more.",
            "Heatmap of attention Jensen-Shannon divergence per layer and head",
        ),
    ]
    per_layer = (
        heads.groupby("layer")
        .agg(cosine=("cosine", "mean"), cosine_sd=("cosine", "std"),
             js_divergence=("js_divergence", "mean"), js_sd=("js_divergence", "std"))
        .reset_index()
    )
    long = pd.concat(
        [
            pd.DataFrame({"layer": per_layer["layer"], "metric": "cosine", "value": per_layer["cosine"],
                          "spread": per_layer["cosine_sd"].fillna(0.0)}),
            pd.DataFrame({"layer": per_layer["layer"], "metric": "js_divergence",
                          "value": per_layer["js_divergence"], "spread": per_layer["js_sd"].fillna(0.0)}),
        ],
        ignore_index=True,
    )
    curve = figs.make(
        "attention_by_layer",
        lambda: layer_curve(long, x="layer", y="value", hue=None, facet="metric", err="spread",
                            facet_order=["cosine", "js_divergence"], xlabel="layer",
                            reference={"cosine": 1.0, "js_divergence": 0.0}, err_clip=(0.0, 1.0),
                            min_span=0.1),
        "Mean over the heads of each layer; the band is ±1 standard deviation across heads.",
        "Per-layer mean cosine similarity and Jensen-Shannon divergence",
    )

    ranked = heads.sort_values(["js_divergence", "cosine"], ascending=[False, True]).head(10)
    top = []
    for rank, (_, row) in enumerate(ranked.iterrows(), start=1):
        top.append({
            "rank": rank,
            "label": f"L{int(row['layer'])}H{int(row['head'])}",
            "layer": int(row["layer"]),
            "head": int(row["head"]),
            "cosine": row["cosine"],
            "cosine_std": row.get("cosine_std"),
            "js": row["js_divergence"],
            "n": row.get("n_examples"),
        })
    columns = [
        ("rank", "Rank", "num"), ("label", "Head", "text"), ("layer", "Layer", "num"),
        ("head", "Head index", "num"), ("cosine", "Cosine", "num"), ("cosine_std", "Cosine SD", "num"),
        ("js", "JS divergence", "num"), ("n", "Examples", "num"),
    ]
    if "cosine_std" not in heads:
        columns = [c for c in columns if c[0] != "cosine_std"]
    table = {
        "columns": [{"key": k, "label": lab, "type": t} for k, lab, t in columns],
        "rows": [[{"text": fmt_value(r[k]) if k != "label" else r[k], "value": _sort_key(r[k])}
                  for k, _, _ in columns] for r in top],
    }
    if top:
        first = top[0]
        derived.append({"label": "Most changed head", "text": first["label"],
                        "note": f"JS {fmt_value(first['js'], 3)}, cosine {fmt_value(first['cosine'], 3)}"})
    derived.append({"label": "Mean attention cosine", "text": fmt_value(heads["cosine"].mean()),
                    "note": f"over {n_layers * n_heads:,} heads"})
    modes = _unique_text(df["mode"]) if "mode" in df else None
    return {
        "id": "attention-change",
        "title": _SECTION_TITLES["attention-change"],
        "heatmaps": [f for f in figures if f],
        "curve": curve,
        "top": table,
        "facts": [
            ("Layers × heads", f"{n_layers} × {n_heads}"),
            ("Examples", _unique_text(df["n_examples"])),
            *([("Mode", modes)] if modes else []),
        ],
    }


def _domains_figure(df: pd.DataFrame, ood: pd.DataFrame, figs: _Figures) -> dict | None:
    """Same-layer similarity on the task's data and on the out-of-domain corpus, side by side (Merchant et al.)."""
    from bertology.viz.figures import METRIC_LABELS, layer_curve

    both = []
    for frame, domain in ((df, "in domain"), (ood, "out of domain")):
        d = frame[(frame["layer_base"] == frame["layer_tuned"]) & frame["metric"].isin(["cka_linear", "rsa_pearson"])]
        both.append(d.rename(columns={"layer_base": "layer"}).assign(domain=domain)[["layer", "metric", "value", "domain"]])
    data = pd.concat(both, ignore_index=True)
    data["metric"] = data["metric"].map(lambda m: METRIC_LABELS.get(m, m))
    return figs.make(
        "similarity_domains",
        lambda: layer_curve(data, x="layer", y="value", hue="domain", facet="metric", reference=1.0,
                            xlabel="layer (0 = embeddings)", ylabel="same-layer similarity", min_span=0.1,
                            title="Base vs tuned on the task's data and out of domain"),
        "Same-layer similarity of base and tuned on the task's data and on the second corpus, as in Merchant "
        "et al. (2020): fine-tuning changes out-of-domain representations less when the curve stays higher.",
        "Same-layer similarity in and out of domain",
    )


def _similarity_section(df: pd.DataFrame, figs: _Figures, derived: list[dict], ood: pd.DataFrame | None = None) -> dict:
    from bertology.viz.figures import METRIC_LABELS, layer_curve, layer_matrix

    df = df.copy()
    for col in ("layer_base", "layer_tuned", "value"):
        df[col] = pd.to_numeric(df[col], errors="coerce")
    df = df.dropna(subset=["layer_base", "layer_tuned"])
    df["layer_base"] = df["layer_base"].astype(int)
    df["layer_tuned"] = df["layer_tuned"].astype(int)
    metrics_present = [m for m in SIMILARITY_METRICS if m in set(df["metric"])] + sorted(
        m for m in set(df["metric"]) if m not in SIMILARITY_METRICS
    )
    diag = df[df["layer_base"] == df["layer_tuned"]].rename(columns={"layer_base": "layer"})
    curve = None
    if not diag.empty:
        curve = figs.make(
            "similarity_same_layer",
            lambda: layer_curve(diag, x="layer", y="value", hue="metric", hue_order=metrics_present,
                                reference=1.0, xlabel="layer (0 = embeddings)", ylabel="similarity",
                                min_span=0.1,
                                title="Same-layer similarity, base vs tuned"),
            "Similarity of each base layer with the same tuned layer; 1 = identical geometry. "
            "Layer 0 is the embedding output.",
            "Per-layer same-layer similarity for each metric",
        )
    matrices = []
    for metric in ("cka_linear", "rsa_pearson"):
        if metric not in set(df["metric"]):
            continue
        vmax = 1.0 if df.loc[df["metric"] == metric, "value"].max() <= 1.0 + 1e-6 else None
        matrices.append(figs.make(
            f"similarity_matrix_{metric}",
            lambda metric=metric, vmax=vmax: layer_matrix(
                df, metric, title=f"{METRIC_LABELS.get(metric, metric)}: every layer pair", vmax=vmax,
                min_span=0.1),
            f"{METRIC_LABELS.get(metric, metric)} between every base layer (rows) and tuned layer "
            "(columns); the diagonal is the same-layer curve.",
            f"Layer by layer matrix of {metric}",
        ))
    domains = _domains_figure(df, ood, figs) if ood is not None else None
    # same-layer table: layer x metric (and, with an out-of-domain corpus, its linear CKA and RSA)
    table = None
    if not diag.empty:
        pivot = diag.pivot_table(index="layer", columns="metric", values="value", aggfunc="mean")
        cols = [m for m in metrics_present if m in pivot.columns]
        labels = {m: METRIC_LABELS.get(m, m) for m in cols}
        if ood is not None:
            od = ood[ood["layer_base"] == ood["layer_tuned"]].pivot_table(index="layer_base", columns="metric", values="value")
            for m in ("cka_linear", "rsa_pearson"):
                if m in od.columns:
                    pivot[f"{m}_ood"] = od[m].reindex(pivot.index)
                    cols.append(f"{m}_ood")
                    labels[f"{m}_ood"] = f"{METRIC_LABELS.get(m, m)}, out of domain"
        table = {
            "columns": [{"key": "layer", "label": "Layer", "type": "num"}]
            + [{"key": m, "label": labels[m], "type": "num"} for m in cols],
            "rows": [
                [{"text": str(int(layer)), "value": _sort_key(int(layer))}]
                + [{"text": fmt_value(pivot.at[layer, m]), "value": _sort_key(pivot.at[layer, m])}
                   for m in cols]
                for layer in pivot.index
            ],
        }
        if "cka_linear" in pivot.columns:
            last = int(pivot.index.max())
            derived.append({"label": f"Linear CKA, layer {last}", "text": fmt_value(pivot.at[last, "cka_linear"]),
                            "note": "same layer, base vs tuned"})
    facts = [("Tokens compared", _unique_text(df["n_tokens"]))]
    if ood is not None:
        facts.append(("Out-of-domain corpus", _unique_text(ood["corpus"]) if "corpus" in ood else "yes"))
    facts.append(("Seed", _unique_text(df["seed"]) if "seed" in df else "not recorded"))
    facts.append(("Metrics", ", ".join(METRIC_LABELS.get(m, m) for m in metrics_present)))
    return {
        "id": "representation-similarity",
        "title": _SECTION_TITLES["representation-similarity"],
        "curve": curve,
        "domains": domains,
        "matrices": [m for m in matrices if m],
        "table": table,
        "facts": facts,
    }


def _slices_table(sl: pd.DataFrame) -> dict | None:
    """Final evaluation per slice (e.g. with / without the words a bias experiment removed)."""
    from bertology.viz.figures import METRIC_LABELS

    last = sl[sl["split"] == "eval"].sort_values("step").groupby(["slice", "metric"], as_index=False).tail(1)
    if last.empty:
        return None
    wide = last.pivot_table(index="slice", columns="metric", values="value", aggfunc="first")
    metrics = [m for m in ("accuracy", "macro_f1", "loss", "n_eval") if m in wide.columns]
    return _table([("slice", "Slice", "text")] + [(m, METRIC_LABELS.get(m, m.replace("_", " ")), "num") for m in metrics],
                  [[str(i)] + [r[m] for m in metrics] for i, r in wide.iterrows()])


def _finetune_section(df: pd.DataFrame, figs: _Figures, derived: list[dict],
                      anisotropy: pd.DataFrame | None = None) -> dict:
    from bertology.viz.figures import METRIC_LABELS, training_curve

    df = df.copy()
    df["step"] = pd.to_numeric(df["step"], errors="coerce")
    df = df.dropna(subset=["step"])
    slices = None
    if "slice" in df.columns:  # per-slice eval rows (bias experiments) are shown apart from the curves
        is_all = df["slice"].fillna("all").astype(str) == "all"
        slices = _slices_table(df[~is_all]) if (~is_all).any() else None
        df = df[is_all]
    aniso_fig = None
    if anisotropy is not None and len(anisotropy):
        from bertology.viz.geometry import geometry_figure

        aniso_fig = figs.make(
            "finetune_anisotropy", lambda: geometry_figure(anisotropy, metrics=["anisotropy"], ncols=1),
            "Anisotropy per layer (mean cosine of random token pairs from different sentences, Ethayarajh 2019) "
            "before and after contrastive training.",
            "Anisotropy per layer before and after fine-tuning",
        )
    curve = figs.make(
        "finetune_curves",
        lambda: training_curve(df),
        "Training (faint) and evaluation (markers) metrics against the optimisation step.",
        "Fine-tuning curves per metric and split",
    )
    last = df.sort_values("step").groupby(["split", "metric"], as_index=False).tail(1)
    splits = [s for s in ("train", "eval") if s in set(last["split"])] + sorted(
        str(s) for s in set(last["split"]) if s not in ("train", "eval")
    )
    metrics = list(pd.unique(last.sort_values("metric", key=lambda s: s != "loss")["metric"]))
    rows = []
    for metric in metrics:
        cells = [{"text": METRIC_LABELS.get(metric, str(metric)), "value": str(metric)}]
        for split in splits:
            hit = last[(last["metric"] == metric) & (last["split"] == split)]
            v = hit["value"].iloc[0] if len(hit) else None
            cells.append({"text": fmt_value(v), "value": _sort_key(v)})
        rows.append(cells)
    table = {
        "columns": [{"key": "metric", "label": "Metric", "type": "text"}]
        + [{"key": s, "label": f"final {s}", "type": "num"} for s in splits],
        "rows": rows,
    }
    evals = last[last["split"] == "eval"]
    for metric in ("accuracy", "macro_f1"):
        hit = evals[evals["metric"] == metric]
        if len(hit):
            derived.append({"label": f"Final eval {METRIC_LABELS.get(metric, metric)}",
                            "text": fmt_value(hit["value"].iloc[0]),
                            "note": f"step {fmt_value(hit['step'].iloc[0])}"})
    facts = [("Steps logged", f"{int(df['step'].max()):,}" if len(df) else "—")]
    if "epoch" in df:
        facts.append(("Epochs", fmt_value(pd.to_numeric(df["epoch"], errors="coerce").max())))
    return {"id": "finetune", "title": _SECTION_TITLES["finetune"], "curve": curve, "table": table,
            "facts": facts, "slices": slices, "anisotropy": aniso_fig}


def _table(columns: list[tuple[str, str, str]], rows: list[list[Any]]) -> dict:
    """A sortable table for the template: columns as (key, label, type), cells formatted by fmt_value."""
    return {
        "columns": [{"key": k, "label": label, "type": t} for k, label, t in columns],
        "rows": [[{"text": v if isinstance(v, str) else fmt_value(v), "value": v if isinstance(v, str) else _sort_key(v)}
                  for v in row] for row in rows],
    }


def _targets_section(df: pd.DataFrame, figs: _Figures, derived: list[dict]) -> dict:
    from bertology.viz.figures import layer_curve

    df = df.copy()
    df["layer"] = pd.to_numeric(df["layer"], errors="coerce").astype(int)
    per_layer = df.groupby(["model", "layer", "target"], as_index=False)["value"].mean()
    token = [t for t in ("cls", "sep", "punct", "self", "prev", "next") if t in set(per_layer["target"])]
    words = [t for t in ("noun", "verb", "pron", "subject", "object", "negation") if t in set(per_layer["target"])]
    curves = []
    for name, targets, what in (("targets_tokens", token, "special tokens, punctuation and neighbours"),
                                ("targets_words", words, "word categories")):
        if not targets:
            continue
        sub = per_layer[per_layer["target"].isin(targets)].assign(target=lambda d: d["target"].map(TARGET_LABELS))
        curves.append(figs.make(
            name,
            lambda sub=sub, targets=targets: layer_curve(
                sub, x="layer", y="value", hue="target", facet="model", facet_order=["base", "tuned"],
                hue_order=[TARGET_LABELS[t] for t in targets], sharey=True, ylabel="share of attention",
                title=f"Attention to {what}, mean over heads"),
            f"Share of each query's attention that goes to {what}, averaged over heads, per layer; "
            "left the base model, right the tuned one.",
            f"Per-layer attention to {what}, base and tuned",
        ))
    wide = per_layer.pivot_table(index=["target"], columns="model", values="value", aggfunc="mean")
    last = int(df["layer"].max())
    rows = []
    for target in [t for t in TARGET_LABELS if t in wide.index]:
        base = wide.at[target, "base"] if "base" in wide.columns else None
        tuned = wide.at[target, "tuned"] if "tuned" in wide.columns else None
        delta = tuned - base if base is not None and tuned is not None else None
        rows.append([TARGET_LABELS[target], base, tuned, delta])
    table = _table([("target", "Target", "text"), ("base", "base (mean over heads and layers)", "num"),
                    ("tuned", "tuned", "num"), ("delta", "tuned − base", "num")], rows)
    cls = df[(df["layer"] == last) & df["target"].str.startswith("from_cls_")]
    cls_table = None
    if len(cls):
        c = cls.groupby(["target", "model"])["value"].mean().unstack("model")
        cls_rows = [[t.removeprefix("from_cls_"), c.at[t, "base"] if "base" in c else None,
                     c.at[t, "tuned"] if "tuned" in c else None] for t in c.index]
        cls_table = _table([("target", "Category", "text"), ("base", "base", "num"), ("tuned", "tuned", "num")], cls_rows)
    sep = per_layer[(per_layer["target"] == "sep") & (per_layer["layer"] == last)].set_index("model")["value"]
    if "tuned" in sep and "base" in sep:
        derived.append({"label": f"Attention to [SEP], layer {last}", "text": f"{sep['base']:.2f} → {sep['tuned']:.2f}",
                        "note": "base → tuned, mean over heads"})
    return {"id": "attention-targets", "title": _SECTION_TITLES["attention-targets"],
            "curves": [c for c in curves if c], "table": table, "cls_table": cls_table, "last_layer": last,
            "facts": [("Layers", str(last)), ("Targets", str(df["target"].nunique()))]}


def _relations_section(df: pd.DataFrame, figs: _Figures, derived: list[dict]) -> dict:
    from bertology.analyses.relation_heads import best_heads
    from bertology.viz.figures import head_heatmap

    df = df.copy()
    if "kind" not in df.columns:
        df["kind"] = "dependency"
    kind_of = df.groupby("relation")["kind"].first().to_dict()
    best = best_heads(df, by_direction=False)
    rels = sorted(set(best["relation"]), key=lambda r: (kind_of.get(r) == "span", r != "all",
                                                        -int(best.loc[best.relation == r, "n"].max()), r))
    rows = []
    for rel in rels:
        b = best[(best.relation == rel) & (best.model == "base")]
        t = best[(best.relation == rel) & (best.model == "tuned")]
        first = b if len(b) else t
        rows.append([
            rel, "yours" if kind_of.get(rel) == "span" else "syntax", int(first["n"].iloc[0]),
            f"{b.head_label.iloc[0]} ({b.direction.iloc[0]})" if len(b) else "—", b.accuracy.iloc[0] if len(b) else None,
            f"{t.head_label.iloc[0]} ({t.direction.iloc[0]})" if len(t) else "—", t.accuracy.iloc[0] if len(t) else None,
            first.baseline_accuracy.iloc[0], f"{int(first.baseline_offset.iloc[0]):+d}",
        ])
    table = _table([("relation", "Relation", "text"), ("kind", "Kind", "text"), ("n", "Pairs", "num"), ("bhead", "base best head", "text"),
                    ("bacc", "base accuracy", "num"), ("thead", "tuned best head", "text"),
                    ("tacc", "tuned accuracy", "num"), ("bl", "best offset accuracy", "num"),
                    ("off", "offset", "text")], rows)
    heatmaps = []
    for model in ("base", "tuned"):
        sub = df[(df.relation == "all") & (df.direction == "dep->head") & (df.model == model)]
        if len(sub):
            heatmaps.append(figs.make(
                f"relation_all_{model}",
                lambda sub=sub, model=model: head_heatmap(sub, value="accuracy", title=f"All relations, dependent → head ({model})",
                                                         cmap="viridis", vmin=0.0, colorbar_label="accuracy"),
                f"Share of dependents whose most-attended word is their syntactic head, per head ({model}).",
                f"Relation-head accuracy per head, {model}",
            ))
    span_rels = [r for r in rels if kind_of.get(r) == "span"][:4]
    for rel in span_rels:
        for model in ("base", "tuned"):
            sub = df[(df.relation == rel) & (df.direction == "from->to") & (df.model == model)]
            if len(sub):
                heatmaps.append(figs.make(
                    f"relation_user_{_slug(rel)}_{model}",
                    lambda sub=sub, model=model, rel=rel: head_heatmap(
                        sub, value="accuracy", title=f"{rel}: from span → to span ({model})", cmap="viridis", vmin=0.0,
                        colorbar_label="accuracy"),
                    f"Your relation “{rel}”: share of instances whose span attends most to a target span, per head ({model}).",
                    f"Accuracy per head for the relation {rel}, {model}",
                ))
    overall = best[(best.relation == "all") & (best.model == "tuned")]
    if len(overall):
        derived.append({"label": "Best syntactic head (tuned)", "text": str(overall.head_label.iloc[0]),
                        "note": f"all relations {overall.accuracy.iloc[0]:.3f} vs offset {overall.baseline_accuracy.iloc[0]:.3f}"})
    return {"id": "relation-heads", "title": _SECTION_TITLES["relation-heads"], "table": table,
            "heatmaps": [h for h in heatmaps if h],
            "facts": [("Relations", str(len(rels))), ("Directions", "dependent → head, head → dependent")]
            + ([("Your relations", f"{len([r for r in rels if kind_of.get(r) == 'span'])} (directions from → to, to → from)")]
               if "span" in kind_of.values() else [])}


def _slug(text: str) -> str:
    """A file-name-safe form of a user-given name."""
    import re

    return re.sub(r"[^A-Za-z0-9_-]+", "_", text)[:40] or "relation"


def _patterns_section(df: pd.DataFrame, figs: _Figures, derived: list[dict]) -> dict:
    from bertology.analyses.attention_patterns import dominant_patterns, layer_mix
    from bertology.metrics.patterns import PATTERNS
    from bertology.viz.patterns import pattern_heads_figure, pattern_mix_figure

    df = df.copy()
    mix = layer_mix(df)
    figures = [
        figs.make("patterns_mix", lambda: pattern_mix_figure(mix),
                  "Share of attention maps of each pattern class (Kovaleva et al. 2019, §4.1) per layer, averaged over "
                  "heads and examples; left the base model, right the tuned one.",
                  "Attention pattern classes per layer, base and tuned"),
        figs.make("patterns_heads", lambda: pattern_heads_figure(df),
                  "Each head's most frequent pattern class; outlined heads changed their main class in fine-tuning.",
                  "Main pattern class per head"),
    ]
    overall = df.groupby(["model", "pattern"])["fraction"].mean().unstack("model")
    rows = []
    for pattern in [p for p in PATTERNS if p in overall.index]:
        b = overall.at[pattern, "base"] if "base" in overall.columns else None
        t = overall.at[pattern, "tuned"] if "tuned" in overall.columns else None
        rows.append([pattern, b, t, (t - b) if b is not None and t is not None else None])
    table = _table([("pattern", "Pattern", "text"), ("base", "base share", "num"), ("tuned", "tuned share", "num"),
                    ("change", "change", "num")], rows)
    dom = dominant_patterns(df)
    changed = 0
    if {"model", "layer", "head", "pattern"} <= set(dom.columns):
        wide = dom.pivot_table(index=["layer", "head"], columns="model", values="pattern", aggfunc="first")
        if {"base", "tuned"} <= set(wide.columns):
            changed = int((wide["base"] != wide["tuned"]).sum())
    if "heterogeneous" in overall.index and {"base", "tuned"} <= set(overall.columns):
        derived.append({"label": "Heterogeneous attention maps", "text":
                        f"{overall.at['heterogeneous', 'base']:.0%} → {overall.at['heterogeneous', 'tuned']:.0%}",
                        "note": f"{changed} heads changed their main pattern"})
    first = df.iloc[0]
    facts = [("Classifier", str(first.get("classifier", "rules"))), ("Maps per head", fmt_value(first.get("n_examples"))),
             ("Heads whose main pattern changed", str(changed))]
    return {"id": "attention-patterns", "title": _SECTION_TITLES["attention-patterns"],
            "figures": [f for f in figures if f], "table": table, "facts": facts}


def _head_map_section(df: pd.DataFrame, figs: _Figures, derived: list[dict]) -> dict:
    from bertology.analyses.head_map import most_moved
    from bertology.viz.figures import head_heatmap
    from bertology.viz.head_map import head_map_figure

    df = df.copy()
    figures = [figs.make(
        "head_map",
        lambda: head_map_figure(df),
        "Every head of both models placed by multidimensional scaling of the Jensen-Shannon distances between "
        "their attention distributions (Clark et al. 2019, §6): circles are base heads, triangles tuned heads, "
        "colour is the layer; lines join a head's two versions and arrows mark the heads that moved most.",
        "Head map: MDS of head distances, base and tuned",
    )]
    base = df[df["model"] == "base"]
    if len(base):
        figures.append(figs.make(
            "head_moved",
            lambda: head_heatmap(base, value="moved", title="How far each head moved (JS distance)", cmap="magma_r",
                                 vmin=0.0, colorbar_label="JS distance, base → tuned"),
            "Jensen-Shannon distance between each head's base and tuned attention, averaged over the sampled tokens.",
            "Per-head distance between base and tuned attention",
        ))
    top = most_moved(df, top=10)
    table = _table([("label", "Head", "text"), ("layer", "Layer", "num"), ("moved", "JS distance moved", "num")],
                   [[r.label, int(r.layer), r.moved] for r in top.itertuples()])
    if len(top):
        derived.append({"label": "Head that moved most", "text": str(top.label.iloc[0]),
                        "note": f"JS distance {top.moved.iloc[0]:.3f} between its base and tuned attention"})
    first = df.iloc[0]
    facts = [("Examples sampled", fmt_value(first.get("n_examples"))), ("Query tokens", fmt_value(first.get("n_tokens"))),
             ("Distance", str(first.get("distance", "js_distance")).replace("_", " ")),
             ("MDS stress-1", fmt_value(first.get("stress")))]
    return {"id": "head-map", "title": _SECTION_TITLES["head-map"], "figures": [f for f in figures if f],
            "table": table, "facts": facts}


def _ablation_section(tables: dict[str, pd.DataFrame], figs: _Figures, derived: list[dict]) -> dict:
    """Single head and layer ablations of the tuned classifier, head importance and pruning curves."""
    from bertology.experiments.ablation import helpful, ranked
    from bertology.experiments.head_importance import importance_vs_deltas
    from bertology.viz.ablation import ablation_heatmap, importance_scatter, layer_ablation_bars, pruning_curve_figure
    from bertology.viz.figures import head_heatmap

    t = tables["ablation"].copy()
    imp = tables.get("head_importance")
    curve = tables.get("pruning_curve")
    first = t.iloc[0]
    mode = str(first.get("mode", "uniform"))
    how = {"uniform": "its attention set to 1/L over the tokens" + (" other than [CLS]/[SEP]" if bool(first.get("exclude_special")) else ""),
           "zero": "its output zeroed", "mean": "its output replaced by its mean over the examples"}.get(mode, mode)
    has_heads = bool((t["target"] == "head").any())
    has_layers = bool((t["target"] == "layer").any())
    figures = []
    if has_heads:
        for metric, what in (("accuracy", "accuracy"), ("loss", "cross-entropy loss")):
            figures.append(figs.make(
                f"ablation_heads_{metric}", lambda m=metric: ablation_heatmap(t, m),
                f"Change in {what} when one head is disabled ({how}); blue: the task gains, red: it loses. "
                "Outlined cells: the 95% bootstrap interval excludes zero (solid: removal helps, dotted: it hurts).",
                f"Per-head ablation change in {what}",
            ))
    if has_layers:
        figures.append(figs.make(
            "ablation_layers_accuracy", lambda: layer_ablation_bars(t, "accuracy"),
            "Change in accuracy when a whole layer is disabled: skipped (the block returns its input) or with all "
            "its heads disabled; bars show the 95% bootstrap interval.",
            "Per-layer ablation change in accuracy",
        ))
    if imp is not None and len(imp):
        figures.append(figs.make(
            "head_importance", lambda: head_heatmap(imp, value="importance", title="Head importance (normalised per layer)",
                                                    cmap="viridis", vmin=0.0, colorbar_label="importance"),
            "Head importance (Michel et al. 2019): the mean absolute gradient of the loss with respect to a gate on "
            "each head's output, per example, normalised per layer (L2).",
            "Head importance per layer and head",
        ))
        if has_heads:
            figures.append(figs.make(
                "importance_vs_ablation", lambda: importance_scatter(imp, t, "loss"),
                "Each head's importance against the loss change its removal causes: agreement means important heads "
                "are the ones whose loss the task feels.",
                "Head importance against the single-head ablation change in loss",
            ))
    if curve is not None and len(curve):
        figures.append(figs.make(
            "pruning_curve_accuracy", lambda: pruning_curve_figure(curve, "accuracy"),
            "Accuracy as heads are removed step by step, least important first (re-estimated after every step), "
            "against a random order as the control.",
            "Pruning curve: accuracy against the share of heads removed",
        ))
    intact = t[t["target"] == "intact"].set_index("metric")["value"]
    rows = []
    if has_heads:
        for kind, part in (("hurts most", ranked(t, "accuracy", target="head", harmful=True, top=8)),
                           ("helps most", ranked(t, "accuracy", target="head", harmful=False, top=5))):
            for r in part.itertuples():
                rows.append([r.label, kind, r.delta, r.ci_low, r.ci_high, "yes" if r.helps else ("hurts" if r.hurts else "no")])
    for r in t[(t["target"] == "layer") & (t["metric"] == "accuracy")].itertuples():
        rows.append([r.label, "layer", r.delta, r.ci_low, r.ci_high,
                     "yes" if r.helps else ("hurts" if r.hurts else "no")])
    table = _table([("unit", "Removed", "text"), ("kind", "Kind", "text"), ("delta", "Δ accuracy", "num"),
                    ("lo", "95% CI low", "num"), ("hi", "95% CI high", "num"), ("sig", "Beyond the CI", "text")], rows)
    good_acc, good_loss = helpful(t, "accuracy"), helpful(t, "loss")
    facts = [("Mode", mode + (" ([CLS]/[SEP] excluded)" if bool(first.get("exclude_special")) else "")),
             ("Examples", fmt_value(first.get("n_examples"))),
             ("Intact accuracy", fmt_value(intact.get("accuracy"))), ("Intact loss", fmt_value(intact.get("loss"))),
             ("Removals that help accuracy (beyond CI)", str(len(good_acc))),
             ("Removals that lower the loss (beyond CI)", str(len(good_loss)))]
    if imp is not None and len(imp) and has_heads:
        rho = importance_vs_deltas(imp, t)["loss"]["spearman"]
        facts.append(("Spearman, importance vs Δloss", fmt_value(rho, 3)))
    if has_heads:
        worst = ranked(t, "accuracy", target="head", harmful=True, top=1)
        if len(worst):
            w = worst.iloc[0]
            derived.append({"label": "Head the task needs most", "text": str(w["label"]),
                            "note": f"Δaccuracy {w['delta']:+.3f} when disabled ({mode})"})
    derived.append({"label": "Removals that help", "text": f"{len(good_acc)} (accuracy), {len(good_loss)} (loss)",
                    "note": "heads or layers whose removal improves the task beyond the 95% interval"})
    return {"id": "ablation", "title": _SECTION_TITLES["ablation"], "figures": [f for f in figures if f],
            "table": table, "facts": facts}


GEOMETRY_LABELS = {
    "anisotropy": "anisotropy (random token pairs)", "self_similarity": "self-similarity",
    "intra_similarity": "intra-sentence similarity", "mev": "max. explainable variance",
    "mev_baseline": "MEV of random tokens", "self_similarity_adjusted": "self-similarity, adjusted",
    "intra_similarity_adjusted": "intra-sentence similarity, adjusted", "mev_adjusted": "MEV, adjusted",
}


def _geometry_section(df: pd.DataFrame, words: pd.DataFrame | None, figs: _Figures, derived: list[dict]) -> dict:
    """Ethayarajh (2019) per layer, base vs tuned, and the words whose self-similarity moved most."""
    from bertology.viz.geometry import geometry_figure

    df = df.copy()
    figures = [figs.make(
        "geometry", lambda: geometry_figure(df),
        "Per layer, base (blue) and tuned: top row the raw measures, bottom row adjusted for anisotropy (the "
        "measure minus its random-token baseline at the same layer). Lower adjusted self-similarity means "
        "more context-specific word representations (Ethayarajh 2019).",
        "Embedding geometry per layer, base and tuned",
    )]
    last = int(df["layer"].max())
    rows = []
    for metric in [m for m in GEOMETRY_LABELS if (df["metric"] == m).any()]:
        sub = df[(df["metric"] == metric) & (df["layer"] == last)].set_index("model")["value"]
        b, t = sub.get("base"), sub.get("tuned")
        n = df[(df["metric"] == metric) & (df["layer"] == last)]["n"].max()
        rows.append([GEOMETRY_LABELS[metric], b, t, (t - b) if b is not None and t is not None else None, n])
    table = _table([("metric", f"Measure (layer {last})", "text"), ("base", "base", "num"), ("tuned", "tuned", "num"),
                    ("change", "change", "num"), ("n", "n", "num")], rows)
    aniso = df[(df["metric"] == "anisotropy") & (df["layer"] == last)].set_index("model")["value"]
    if {"base", "tuned"} <= set(aniso.index):
        derived.append({"label": f"Anisotropy, layer {last}", "text": f"{aniso['base']:.3f} → {aniso['tuned']:.3f}",
                        "note": "mean cosine of random token pairs from different sentences"})
    word_table = None
    if words is not None and len(words):
        w = words[words["layer"] == last].pivot_table(index="word", columns="model", values="self_similarity_adjusted"
                                                      if "self_similarity_adjusted" in words else "self_similarity")
        if {"base", "tuned"} <= set(w.columns):
            w = w.assign(change=w["tuned"] - w["base"]).sort_values("change")
            counts = words[(words["layer"] == last) & (words["model"] == "base")].set_index("word")["n_contexts"]
            pick = pd.concat([w.head(8), w.tail(4)])
            word_table = _table([("word", "Word", "text"), ("base", "base", "num"), ("tuned", "tuned", "num"),
                                 ("change", "change", "num"), ("n", "contexts", "num")],
                                [[i, r.base, r.tuned, r.change, counts.get(i)] for i, r in pick.iterrows()])
    aniso_n = df[df["metric"] == "anisotropy"]["n"].max()
    ss_n = df[df["metric"] == "self_similarity"]["n"].max() if (df["metric"] == "self_similarity").any() else None
    facts = [("Random token pairs", fmt_value(aniso_n)), ("Words in several contexts", fmt_value(ss_n)),
             ("Seed", fmt_value(df["seed"].iloc[0]) if "seed" in df else "—")]
    return {"id": "geometry", "title": _SECTION_TITLES["geometry"], "figures": [f for f in figures if f],
            "table": table, "words": word_table, "facts": facts}


def _pca_section(df: pd.DataFrame, figs: _Figures, derived: list[dict]) -> dict:
    """Token representations projected to 2-D per layer (van Aken et al. 2019), base and tuned side by side."""
    from bertology.viz.geometry import pca_grid

    df = df.copy()
    figures = [figs.make(
        "pca_views_category", lambda: pca_grid(df, fit="shared", color_by="category"),
        "Each row is a layer; one PCA per layer is fitted on the base and the tuned tokens together, so the two "
        "panels share axes. Colour: token category. Percentages: variance explained by the two components.",
        "PCA of token representations per layer, coloured by token category",
    )]
    labels = df["label"].dropna().astype(str)
    labels = labels[labels != ""]
    if labels.nunique() > 1:
        figures.append(figs.make(
            "pca_views_label", lambda: pca_grid(df, fit="shared", color_by="label"),
            "The same projections coloured by the example's label: a task-specific layer separates the labels.",
            "PCA of token representations per layer, coloured by label",
        ))
    n_ex = df["example"].nunique()
    n_tok = len(df[(df["model"] == "base") & (df["fit"] == "shared") & (df["layer"] == df["layer"].min())])
    facts = [("Examples", str(n_ex)), ("Tokens", str(n_tok)), ("Fits", ", ".join(sorted(df["fit"].unique())))]
    return {"id": "pca-views", "title": _SECTION_TITLES["pca-views"], "figures": [f for f in figures if f], "facts": facts}


def _probe_section(df: pd.DataFrame, figs: _Figures, derived: list[dict]) -> dict:
    """Hewitt & Manning's distance and depth probes per layer: base, tuned and the random-init control."""
    from bertology.viz.probe import probe_layer_figure

    df = df.copy()
    split = "test" if (df["split"] == "test").any() else str(df["split"].iloc[0])
    figures = [
        figs.make("probe_distance", lambda: probe_layer_figure(df, ("uuas", "dspr"), split=split),
                  f"Distance probe on the {split} trees: UUAS (the minimum spanning tree of the predicted distances "
                  "against the gold edges, punctuation excluded) and DSpr (Spearman of predicted and gold distances, "
                  "averaged per sentence length over lengths 5-50), per layer and model.",
                  "Distance probe scores per layer"),
        figs.make("probe_depth", lambda: probe_layer_figure(df, ("root_acc", "nspr"), split=split),
                  f"Depth probe on the {split} trees: root accuracy (the least deep word is the root) and NSpr "
                  "(Spearman of predicted and gold depths).",
                  "Depth probe scores per layer"),
    ]
    sub = df[df["split"] == split]
    rows = []
    for model, part in sub.groupby("model", sort=False):
        dist, depth = part[part["probe"] == "distance"], part[part["probe"] == "depth"]
        cells = [model]
        for frame, metric in ((dist, "uuas"), (dist, "dspr"), (depth, "root_acc"), (depth, "nspr")):
            frame = frame.dropna(subset=[metric])
            if len(frame):
                best = frame.loc[frame[metric].idxmax()]
                cells += [best[metric], int(best["layer"])]
            else:
                cells += [None, None]
        rows.append(cells)
    table = _table([("model", "Model", "text"), ("uuas", "best UUAS", "num"), ("uuas_l", "layer", "num"),
                    ("dspr", "best DSpr", "num"), ("dspr_l", "layer", "num"), ("root", "best root acc.", "num"),
                    ("root_l", "layer", "num"), ("nspr", "best NSpr", "num"), ("nspr_l", "layer", "num")], rows)
    best = {r[0]: r[1] for r in rows if r[1] is not None}
    if {"base", "tuned"} <= set(best):
        derived.append({"label": "Best UUAS, base → tuned", "text": f"{best['base']:.3f} → {best['tuned']:.3f}",
                        "note": "structural distance probe" + (f"; random init {best['random']:.3f}" if "random" in best else "")})
    first = sub.iloc[0]
    facts = [("Split scored", split), ("Sentences scored", fmt_value(first.get("n_sentences")) if "n_sentences" in df else "—"),
             ("Probe rank", fmt_value(first.get("rank")) if "rank" in df else "—"),
             ("Models", ", ".join(pd.unique(df["model"])))]
    return {"id": "probe", "title": _SECTION_TITLES["probe"], "figures": [f for f in figures if f], "table": table,
            "facts": facts}


def _viewer_section(run_dir: Path, manifest: dict, warnings: list[str]) -> dict | None:
    """Interactive attention views saved by ``compare`` under ``views/`` (base, tuned and their difference)."""
    from bertology.viz.viewer import render_fragment

    names = [n for n in manifest.get("views") or [] if isinstance(n, str)]
    fragments = []
    for i, name in enumerate(names):
        path = run_dir / name
        try:
            view = json.loads(path.read_text(encoding="utf-8"))
            fragments.append({"text": view.get("text", ""), "text_pair": view.get("text_pair"),
                              "html": Markup(render_fragment(view, f"bertology-view-{i}"))})
        except (OSError, ValueError, KeyError, TypeError) as err:
            warnings.append(f"Attention view {name} could not be shown: {err}")
    if not fragments:
        return None
    return {"id": "attention-viewer", "title": _SECTION_TITLES["attention-viewer"], "views": fragments}


# ------------------------------------------------------------------------------------------- render
def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("bertology.report", "templates"),
        autoescape=True,  # every {{ }} is HTML-escaped unless explicitly Markup
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["num"] = fmt_value
    return env


def build_context(run_dir: str | Path) -> dict:
    """Everything the template needs (also writes the figures). Exposed for testing and reuse."""
    run_dir = Path(run_dir).expanduser()
    if not run_dir.is_dir():
        raise BertologyError(f"Run directory {run_dir} does not exist or is not a folder.")
    warnings: list[str] = []
    manifest = _read_manifest(run_dir, warnings)
    tables, listing = _read_tables(run_dir, warnings)
    if not manifest and not listing:
        raise BertologyError(
            f"{run_dir} holds neither manifest.json nor tables/; is it a bertology run directory?"
        )
    figs = _Figures(run_dir, warnings)
    derived: list[dict] = []
    sections: list[dict] = []
    if "attention_change" in tables:
        sections.append(_attention_section(tables["attention_change"], figs, derived))
    if "attention_patterns" in tables:
        sections.append(_patterns_section(tables["attention_patterns"], figs, derived))
    if "representation_similarity" in tables:
        sections.append(_similarity_section(tables["representation_similarity"], figs, derived,
                                            tables.get("representation_similarity_ood")))
    if "attention_targets" in tables:
        sections.append(_targets_section(tables["attention_targets"], figs, derived))
    if "relation_heads" in tables:
        sections.append(_relations_section(tables["relation_heads"], figs, derived))
    if "head_map" in tables:
        sections.append(_head_map_section(tables["head_map"], figs, derived))
    if "geometry" in tables:
        sections.append(_geometry_section(tables["geometry"], tables.get("geometry_words"), figs, derived))
    if "pca_views" in tables:
        sections.append(_pca_section(tables["pca_views"], figs, derived))
    if "probe" in tables:
        sections.append(_probe_section(tables["probe"], figs, derived))
    if "ablation" in tables:
        sections.append(_ablation_section(tables, figs, derived))
    viewer = _viewer_section(run_dir, manifest, warnings)
    if viewer:
        sections.append(viewer)
    if "finetune" in tables:
        sections.append(_finetune_section(tables["finetune"], figs, derived, tables.get("anisotropy")))
    overview = _overview(manifest, listing, warnings, derived)

    models = _mapping(manifest.get("models"))
    base_name = _mapping(models.get("base")).get("name")
    tuned_name = _mapping(models.get("tuned")).get("name")
    if base_name and tuned_name:
        subtitle = f"{base_name} → {tuned_name}"
    else:
        subtitle = str(base_name or tuned_name or run_dir.name)
    toc = [{"id": "overview", "title": _SECTION_TITLES["overview"]}] + [
        {"id": s["id"], "title": s["title"]} for s in sections
    ]
    from bertology import __version__

    return {
        "title": "bertology report",
        "subtitle": subtitle,
        "run_dir": str(run_dir),
        "created": manifest.get("created"),
        "rendered": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "run_version": manifest.get("bertology_version"),
        "version": __version__,
        "overview": overview,
        "sections": {s["id"]: s for s in sections},
        "toc": toc,
        "manifest_pretty": json.dumps(_jsonable(manifest), indent=2, sort_keys=False),
        "manifest_json": _jsonable(manifest),
        "figures_written": figs.written,
    }


def render_report(run_dir: str | Path) -> Path:
    """Render ``run_dir/report.html`` (and ``run_dir/figures/*.svg``) from a run directory.

    Returns the path of the report. The HTML is written atomically (temp file in the same folder,
    then ``os.replace``), so a reader never sees a half-written page. Raises
    :class:`~bertology.errors.BertologyError` when ``run_dir`` is not a run directory.
    """
    run_dir = Path(run_dir).expanduser()
    context = build_context(run_dir)
    page = _environment().get_template("report.html.j2").render(**context)
    out = run_dir / "report.html"
    atomic_write_text(out, page)
    logger.info("wrote %s (%d figures)", out, len(context["figures_written"]))
    return out


class Report:
    """A rendered run report, displayable in Jupyter.

    ``Report(run_dir).path`` is ``run_dir/report.html``; ``.html()`` returns the page (rendering it
    first if it does not exist yet); ``.render()`` re-renders. In a notebook the report is shown in a
    sandboxed ``<iframe srcdoc=...>`` so its styles and script cannot touch the notebook page.
    """

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir).expanduser()

    @property
    def path(self) -> Path:
        return self.run_dir / "report.html"

    def render(self) -> Path:
        return render_report(self.run_dir)

    def html(self) -> str:
        if not self.path.exists():
            self.render()
        return self.path.read_text(encoding="utf-8")

    def _repr_html_(self) -> str:
        doc = _html.escape(self.html(), quote=True)
        return (
            f'<iframe srcdoc="{doc}" sandbox="allow-scripts" title="bertology report" '
            'style="width:100%;height:760px;border:1px solid #ddd;border-radius:4px"></iframe>'
        )

    def __repr__(self) -> str:
        return f"Report({str(self.run_dir)!r})"
