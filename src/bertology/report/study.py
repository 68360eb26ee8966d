"""Render a study directory (one base, several tasks x seeds) into one offline HTML page.

``render_study_report(study_dir)`` reads ``STUDY/manifest.json`` and the ``study_*`` tables that
:mod:`bertology.studies.noise` computed (``bertology.studies.summarise.summarise_study`` computes them and
calls this), draws the figures (also written to ``STUDY/figures/study_*.svg``) and writes
``STUDY/report.html`` atomically. It computes no statistic. Sections whose tables are absent are left
out. The seed-noise tables of the other corpora (``own_study_*`` on each task's own dev data,
``study_*_ood`` on the out-of-domain corpus) add their CKA/RSA figures, verdicts and counts. Like the pair report the page inlines everything, forbids network loads with a
Content-Security-Policy, and escapes every string from data (Jinja2 autoescaping); links to the pair
reports are relative paths only.
"""
from __future__ import annotations

import datetime as _dt
import json
import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
from jinja2 import Environment, PackageLoader, StrictUndefined

from bertology.errors import BertologyError
from bertology.experiments.transplant_score import TABLE as TRANSPLANT_TABLE
from bertology.report.format import fmt_value, mapping, sortable
from bertology.report.sections.base import Figures
from bertology.report.study_crosscoder import crosscoder_seed_section
from bertology.results import atomic_write_text

#: The seed-noise tables the page reads (written by ``bertology.studies.noise.study_tables``).
STUDY_TABLES = ("study_summary", "study_seed_noise", "study_effects", "study_counts", "study_rule",
                "study_task_differences")

logger = logging.getLogger(__name__)

__all__ = ["build_study_context", "render_study_report"]

_SIMILARITY_ORDER = ("cka_linear", "rsa_pearson", "cka_debiased", "rsa_spearman")
_SIMILARITY_LABELS = {"cka_linear": "linear CKA", "rsa_pearson": "RSA (Pearson)", "cka_debiased": "debiased CKA",
                      "rsa_spearman": "RSA (Spearman)"}
#: The corpora a study measures on: (key, table-name prefix, suffix, words). The seed-noise tables of each
#: are named as ``bertology.studies.noise.CORPORA`` says (``study_effects``, ``own_study_effects``,
#: ``study_effects_ood``); this page may not import study, so the names are repeated here.
CORPORA = (("shared", "", "", "shared corpus"), ("own", "own_", "", "own dev data"),
           ("ood", "", "_ood", "out-of-domain corpus"))
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


# -------------------------------------------------------------------------------------------- input
def _manifest(study_dir: Path, warnings: list[str]) -> dict:
    path = study_dir / "manifest.json"
    if not path.exists():
        warnings.append("manifest.json is missing: tasks, seeds, pair reports and jobs are unknown.")
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BertologyError(f"{path} is not valid JSON ({err}); cannot render the study report.") from err
    if not isinstance(data, dict):
        raise BertologyError(f"{path} should hold a JSON object, not {type(data).__name__}.")
    if data.get("kind") not in (None, "study"):
        warnings.append(f"manifest.json says kind={data.get('kind')!r}, not 'study'.")
    return data


#: The comparison folders of a study (``bertology.studies.runner`` writes them; this page may not import studies).
_COMPARE_MANIFESTS = ("compare/manifest.json", "compare_own/*/manifest.json", "seeds/*/*/manifest.json",
                      "seeds_own/*/*/manifest.json")


def _skipped_experiments(study_dir: Path) -> list[str]:
    """One warning per experiment a comparison left out for one model, with its reason (e.g. a regressor's
    ablation on the shared corpus's classification labels), read from each comparison's manifest."""
    out = []
    for pattern in _COMPARE_MANIFESTS:
        for path in sorted(study_dir.glob(pattern)):
            try:
                skipped = json.loads(path.read_text(encoding="utf-8")).get("skipped_experiments") or []
            except (OSError, ValueError, AttributeError):
                continue  # the job's own status says what went wrong with it
            where = path.parent.relative_to(study_dir).as_posix()
            out += [f"{str(s.get('experiment')).capitalize()} skipped for {s.get('tuned')} ({where}): {s.get('reason')}."
                    for s in skipped if isinstance(s, Mapping)]
    return out


def _named(name: str, corpus: str) -> str:
    """``study_effects`` on ``corpus``: ``own_study_effects``, ``study_effects_ood`` (see :data:`CORPORA`)."""
    _, prefix, suffix, _ = next(c for c in CORPORA if c[0] == corpus)
    return f"{prefix}{name}{suffix}"


def _study_tables(study_dir: Path, warnings: list[str], manifest: Mapping) -> dict[str, pd.DataFrame]:
    """The ``study_*`` tables present under ``STUDY/tables/``, on every corpus.

    study_effects is required of a folder that only holds tables; a study's own run (its manifest lists
    jobs) renders without it, saying why: its comparison failed, and the page still shows the jobs.
    """
    folder = study_dir / "tables"
    tables = {name: pd.read_parquet(folder / f"{name}.parquet") for name in STUDY_TABLES
              if (folder / f"{name}.parquet").exists()}
    if "study_effects" not in tables and manifest.get("jobs"):
        warnings.append(f"No seed-noise verdicts on the shared corpus: {why_no_verdicts(manifest)} (the Jobs table "
                        "below has every error); run the study again once they are fixed (finished jobs are reused).")
    elif "study_effects" not in tables:
        raise BertologyError(
            f"{folder} has no study_effects table: compute the seed-noise tables first "
            f"(bertology.studies.summarise.summarise_study, or python -m bertology.studies.summarise {study_dir})."
        )
    others = [_named(n, c) for c, *_ in CORPORA[1:] for n in STUDY_TABLES]
    tables.update({name: pd.read_parquet(folder / f"{name}.parquet") for name in others
                   if (folder / f"{name}.parquet").exists()})
    absent = [n for n in STUDY_TABLES if n not in tables]
    if absent:
        warnings.append(f"Table(s) {', '.join(absent)} are missing: their parts of the page are left out.")
    return tables


def why_no_verdicts(manifest: Mapping) -> str:
    """Why a study's own run has no ``study_effects``: how its base-vs-tuned comparison ended, and which jobs failed
    (read from the manifest's jobs)."""
    jobs = [j for j in manifest.get("jobs", []) if isinstance(j, Mapping)]
    compare = next((j for j in jobs if j.get("id") == "compare"), None)
    if compare is None:
        said = "the base-vs-tuned comparison did not run"
    elif compare.get("status") in ("done", "cached"):
        said = "the base-vs-tuned comparison wrote no table the seed-noise rule reads"
    else:
        ended = "was skipped" if compare.get("status") == "skipped" else str(compare.get("status"))
        said = f"the base-vs-tuned comparison {ended} ({compare.get('error') or 'no error recorded'})"
    failed = [str(j.get("id")) for j in jobs if j.get("status") == "failed"]
    if failed:
        said += f"; {len(failed)} of {len(jobs)} job(s) failed: {', '.join(failed)}"
    return said


def stale_lines(stale: Mapping[str, str]) -> list[str]:
    """The stale tables a run kept, one line per reason: "Stale tables a, b: from the run finished ..."."""
    by_reason: dict[str, list[str]] = {}
    for name, why in stale.items():
        by_reason.setdefault(str(why), []).append(str(name))
    return [f"Stale table{'s' if len(names) > 1 else ''} {', '.join(names)}: {why}" for why, names in by_reason.items()]


def _rows(df: pd.DataFrame | None, **where: Any) -> pd.DataFrame:
    """Rows of ``df`` whose columns equal the given values (empty frame for a missing table)."""
    if df is None or df.empty:
        return pd.DataFrame()
    mask = pd.Series(True, index=df.index)
    for col, value in where.items():
        if col not in df:
            return pd.DataFrame()
        mask &= df[col] == value
    return df[mask]


def _verdict(v: Any) -> str:
    if v is None or pd.isna(v):
        return "no estimate"
    return "beyond noise" if bool(v) else "within noise"


def _safe_href(path: Any) -> str | None:
    """A relative link from the manifest, or None for anything with a scheme or leaving the folder."""
    if not isinstance(path, str) or not path or _SCHEME.match(path) or path.startswith(("/", "\\")):
        return None
    if ".." in Path(path).parts:
        return None
    return path


# ------------------------------------------------------------------------------------------ sections
def _overview(manifest: Mapping, study_dir: Path, tables: Mapping[str, pd.DataFrame]) -> dict:
    tasks = [mapping(t) for t in manifest.get("tasks", []) if isinstance(t, Mapping)]
    pairs = [mapping(p) for p in manifest.get("pairs", []) if isinstance(p, Mapping)]
    own_pairs = [mapping(p) for p in manifest.get("own_pairs", []) or [] if isinstance(p, Mapping)]
    rows = []
    names = [str(t.get("name")) for t in tasks] or sorted({str(p.get("task")) for p in pairs})
    for name in names:
        task = next((t for t in tasks if str(t.get("name")) == name), {})
        seeds = task.get("seeds", [])
        rows.append({"name": name, "kind": _kind(task),
                     "seeds": ", ".join(str(s) for s in seeds) if isinstance(seeds, list) else str(seeds),
                     "n_seeds": len(seeds) if isinstance(seeds, list) else None,
                     "links": _links(pairs, name, study_dir), "own_links": _links(own_pairs, name, study_dir)})
    effects = tables.get("study_effects")
    facts = [("Base", str(manifest.get("base", "—"))), ("Tasks", str(len(names))),
             ("Tuned models", str(len(pairs))), ("Seed pairs", str(len(manifest.get("seed_pairs", []) or []))),
             ("Status", str(manifest.get("status", "—"))), ("Executor", str(manifest.get("executor", "—")))]
    if effects is not None and not effects.empty:
        facts.append(("Alpha", fmt_value(float(effects["alpha"].iloc[0]))))
    return {"facts": facts, "tasks": rows, "own": any(r["own_links"] for r in rows)}


def _kind(task: Mapping) -> str:
    """What the task's fine-tunes did; "(auto)" when the spec left the choice to them."""
    kind = task.get("task")
    if not kind or kind == "auto":
        return "—"
    return f"{kind} (auto)" if task.get("type") == "auto" else str(kind)


def _links(pairs: list[dict], task: str, study_dir: Path) -> list[dict]:
    """The pair reports of ``task`` (label = the tuned model); no href when the report is not there."""
    links = []
    for p in pairs:
        if str(p.get("task")) != task:
            continue
        href = _safe_href(p.get("report"))
        exists = href is not None and (study_dir / href).is_file()
        links.append({"label": str(p.get("tuned", p.get("seed"))), "href": href if exists else None})
    return links


def _noise_rule(tables: Mapping[str, pd.DataFrame], manifest: Mapping) -> dict:
    """The rule's error rate for the seed counts present, and the counts of units beyond noise; None when no corpus
    has verdicts (a study whose comparisons all failed: the page says why at the top)."""
    found = [tables[_named("study_effects", c)] for c, *_ in CORPORA if _named("study_effects", c) in tables]
    if not found:
        return None
    effects = found[0]
    alpha = float(effects["alpha"].iloc[0]) if not effects.empty else float("nan")
    rule = tables.get("study_rule")
    levels = [] if rule is None else [
        [int(r["n_seeds"]), int(r["n_seed_pairs"]), str(r["tasks"]), r["smallest_p"], r["false_positive_rate"],
         r["task_difference_smallest_p"], r["task_difference_rate"]] for _, r in rule.iterrows()]
    level_table = sortable([("k", "Seeds per task", "num"), ("n", "Seed pairs", "num"), ("tasks", "Tasks", "text"),
                            ("minp", "Smallest p", "num"), ("rate", "False-positive rate", "num"),
                            ("minp2", "Smallest p, task difference (k vs k)", "num"),
                            ("rate2", "False-positive rate, task difference", "num")], levels)
    parts = [tables[_named("study_counts", c)].assign(corpus=words) for c, _, _, words in CORPORA
             if _named("study_counts", c) in tables and not tables[_named("study_counts", c)].empty]
    counts = pd.concat(parts, ignore_index=True) if parts else None
    count_rows, tasks = [], []
    if counts is not None:
        tasks = sorted(counts["task"].astype(str).unique())
        order = {words: i for i, (*_, words) in enumerate(CORPORA)}
        for key, g in sorted(counts.groupby(["corpus", "table", "metric", "level"], sort=False),
                             key=lambda kg: (order[kg[0][0]], *kg[0][1:])):
            cells = []
            for task in tasks:
                r = g[g["task"].astype(str) == task]
                if r.empty or int(r["n_tested"].iloc[0]) == 0:
                    cells.append("—")
                    continue
                r = r.iloc[0]
                cells.append(f"{int(r['n_beyond'])}/{int(r['n_tested'])} "
                             f"({fmt_value(float(r['expected_false']), 2)}; BH {int(r['n_beyond_fdr'])})")
            count_rows.append([*(str(k) for k in key), *cells])
    count_table = sortable([("corpus", "Corpus", "text"), ("table", "Table", "text"), ("metric", "Metric", "text"),
                            ("level", "Level", "text"),
                            *((f"t{i}", t, "text") for i, t in enumerate(tasks))], count_rows)
    single = [str(t.get("name")) for t in manifest.get("tasks", []) if isinstance(t, Mapping)
              and isinstance(t.get("seeds"), list) and len(t["seeds"]) < 2]
    corpora = [words for *_, words in CORPORA if counts is not None and words in set(counts["corpus"])]
    return {"alpha": alpha, "levels": level_table, "counts": count_table, "single": single, "corpora": corpora}


def _attention(tables: Mapping[str, pd.DataFrame], figs: Figures) -> dict | None:
    from bertology.viz.study import heatmap_top, task_layer_heatmap

    eff = _rows(tables.get("study_effects"), table="attention_change", level="layer")
    if eff.empty:
        return None
    figures = []
    for metric, label in (("cosine_distance", "1 − cosine"), ("js_divergence", "JS divergence (bits)")):
        part = eff[eff["metric"] == metric]
        if part.empty:
            continue
        figures.append(figs.make(
            f"study_attention_{metric}",
            lambda part=part, label=label: task_layer_heatmap(part, title=f"Attention change: {label}",
                                                              colorbar_label=label),
            f"Mean over the heads of each layer and over seeds of {label} between base and tuned attention "
            "maps (Kovaleva et al. 2019, Fig. 5). Outlined cells are beyond seed noise, hatched cells within "
            f"it, n/a: one seed, no noise estimate. Colours run from 0 to {fmt_value(heatmap_top(part), 2)}, the "
            "largest cell, one scale for every task of the figure.",
            f"Heatmap of attention change ({label}) per task and layer",
        ))
    return {"figures": [f for f in figures if f], "one_column": eff["layer"].nunique() > 6}


#: What each corpus's similarity figure was measured on (caption words).
_CORPUS_WORDS = {
    "shared": "on the shared comparison corpus",
    "own": "each task is measured on its own dev data (its eval_data; Merchant et al. 2020 compare on the task's "
           "own data as well as on a shared corpus), so each task's line comes from other sentences",
    "ood": "measured on the out-of-domain corpus ([compare] ood_data)",
}


def _similarity(tables: Mapping[str, pd.DataFrame], figs: Figures) -> dict | None:
    """Same-layer CKA/RSA per task on each corpus, with the seed-vs-seed level dashed, and the layers' verdicts."""
    from bertology.viz.study import study_layer_curves

    summ = _rows(tables.get("study_summary"), table="representation_similarity", quantity="change")
    if summ.empty:
        return None
    present = [m for m in _SIMILARITY_ORDER if m in set(summ["metric"])][:2]
    figures, rows = [], []
    for corpus, _, _, where in CORPORA:
        part = _rows(tables.get(_named("study_summary", corpus)), table="representation_similarity", quantity="change")
        if part.empty:
            continue
        # the shared corpus: the first two metrics; the others, the first (their figures sit beside it)
        metrics = [m for m in present if m in set(part["metric"])][:2 if corpus == "shared" else 1]
        noise = _rows(tables.get(_named("study_seed_noise", corpus)), table="representation_similarity")
        for metric in metrics:
            label = _SIMILARITY_LABELS[metric]
            n_part = noise[noise["metric"] == metric] if not noise.empty else None
            key = f"study_similarity_{metric}" if corpus == "shared" else f"study_similarity_{corpus}_{metric}"
            title = f"{label} of the same layer" + ("" if corpus == "shared" else f", {where}")
            dashed = ("Dashed: the same measure between two seeds of the task (seed vs seed) on the same data; a task's "
                      "line far below its dashed line changed more than seeds differ."
                      if n_part is not None and not n_part.empty else
                      "No seed-vs-seed comparison on this corpus (one seed, or [compare] own_seed_noise = false).")
            figures.append(figs.make(
                key,
                lambda m=metric, part=part, n_part=n_part, label=label, title=title: study_layer_curves(
                    part[part["metric"] == m], noise=n_part, similarity=True, ylabel=f"{label}, base vs tuned",
                    title=title),
                f"{label} between each layer of the base and the same layer of the tuned model, {_CORPUS_WORDS[corpus]}; "
                "one line per task (mean over seeds), the band spans the seeds' minimum to maximum"
                f"{' (Merchant et al. 2020, Fig. 1)' if corpus == 'shared' else ''}. {dashed}",
                f"{label} per layer on the {where}, one line per task",
            ))
        eff = _rows(tables.get(_named("study_effects", corpus)), table="representation_similarity")
        eff = eff[eff["metric"].isin(metrics)] if not eff.empty else eff
        rows += [[where, str(r["task"]), _SIMILARITY_LABELS.get(str(r["metric"]), str(r["metric"])), int(r["layer"]),
                  1.0 - float(r["change_mean"]), int(r["n_seeds"]),
                  None if pd.isna(r["noise_max"]) else 1.0 - float(r["noise_max"]), r["p_value"],
                  _verdict(r["beyond_noise"])] for _, r in eff.iterrows()]
    table = sortable([("corpus", "Corpus", "text"), ("task", "Task", "text"), ("metric", "Metric", "text"),
                      ("layer", "Layer", "num"), ("mean", "Base–tuned", "num"), ("n", "Seeds", "num"),
                      ("noise", "Seed–seed, lowest", "num"), ("p", "p", "num"), ("verdict", "Verdict", "text")], rows)
    return {"figures": [f for f in figures if f], "table": table}


def _patterns(tables: Mapping[str, pd.DataFrame], figs: Figures) -> dict | None:
    from bertology.viz.study import study_pattern_shares

    summ = _rows(tables.get("study_summary"), table="attention_patterns", level="model")
    if summ.empty:
        return None
    base = summ[summ["quantity"] == "base"].groupby("metric", as_index=False)["mean"].mean()
    tuned = summ[summ["quantity"] == "tuned"]
    shares = pd.concat(
        [pd.DataFrame({"bar": "base", "pattern": base["metric"], "fraction": base["mean"]}),
         pd.DataFrame({"bar": tuned["task"] + " (tuned)", "pattern": tuned["metric"], "fraction": tuned["mean"]})],
        ignore_index=True,
    )
    fig = figs.make(
        "study_pattern_shares", lambda: study_pattern_shares(shares, title="Attention pattern shares"),
        "Share of attention maps of each pattern class, over all heads (Kovaleva et al. 2019, Fig. 2): the base "
        "model, then each task's tuned models (mean over seeds).",
        "Stacked bars of attention pattern shares per task",
    )
    eff = _rows(tables.get("study_effects"), table="attention_patterns", level="model")
    rows = [[str(r["task"]), str(r["metric"]), float(r["change_mean"]), r["change_sd"], int(r["n_seeds"]),
             r["noise_max"], r["p_value"], _verdict(r["beyond_noise"])] for _, r in eff.iterrows()]
    table = sortable([("task", "Task", "text"), ("pattern", "Pattern", "text"), ("change", "Share change", "num"),
                      ("sd", "SD over seeds", "num"), ("n", "Seeds", "num"), ("noise", "Largest seed-vs-seed", "num"),
                      ("p", "p", "num"), ("verdict", "Verdict", "text")], rows)
    return {"figures": [f for f in (fig,) if f], "table": table}


def _ablation(tables: Mapping[str, pd.DataFrame], figs: Figures) -> dict | None:
    from bertology.viz.study import study_ablation_figure

    eff = _rows(tables.get("study_effects"), table="ablation", level="head")
    if eff.empty:
        return None
    summ = _rows(tables.get("study_summary"), table="ablation", level="head", quantity="change")
    chosen = []
    for task, g in eff.groupby("task", sort=True):
        metrics = list(pd.unique(g["metric"]))  # several modes: "uniform/accuracy", "revert/accuracy"
        metric = next((m for m in metrics if not str(m).endswith("loss") and not str(m).startswith("revert/")),
                      next((m for m in metrics if not str(m).endswith("loss")), metrics[0]))
        chosen.append(g[g["metric"] == metric])
    heads = pd.concat(chosen, ignore_index=True)
    key = ["task", "metric", "unit"]
    heads = heads.merge(summ[[*key, "min", "max"]], on=key, how="left").rename(columns={"change_mean": "mean"})
    ci = _rows(tables.get("study_summary"), table="ablation", level="head")
    for q in ("ci_low", "ci_high"):
        part = ci[ci["quantity"] == q][[*key, "mean"]].rename(columns={"mean": q}) if not ci.empty else None
        heads = heads.merge(part, on=key, how="left") if part is not None and not part.empty else heads.assign(**{q: float("nan")})
    fig = figs.make(
        "study_ablation", lambda: study_ablation_figure(heads, title="Disabling one head at a time"),
        "Change of each task's metric when one head is disabled (Kovaleva et al. 2019, Figs. 8-9), mean over "
        "seeds; the grey line spans the seeds' minimum to maximum, red: beyond seed noise (the three largest "
        "labelled), with the bootstrap interval over examples as a pale blue bar (mean of the seeds' bounds).",
        "Ablation deltas of every head per task",
    )
    flagged = heads[heads["beyond_noise"].fillna(False).astype(bool)].sort_values("mean")
    rows = [[str(r["task"]), str(r["unit"]), str(r["metric"]), float(r["mean"]), r["ci_low"], r["ci_high"],
             r["min"], r["max"], r["noise_max"], r["p_value"]] for _, r in flagged.iterrows()]
    table = sortable([("task", "Task", "text"), ("head", "Head", "text"), ("metric", "Metric", "text"),
                      ("mean", "Mean delta", "num"), ("lo", "CI low (examples)", "num"),
                      ("hi", "CI high (examples)", "num"), ("min", "Seed min", "num"), ("max", "Seed max", "num"),
                      ("noise", "Largest seed-vs-seed", "num"), ("p", "p", "num")], rows)
    return {"figures": [f for f in (fig,) if f], "table": table}


def _probe(tables: Mapping[str, pd.DataFrame], figs: Figures) -> dict | None:
    from bertology.viz.study import study_layer_curves

    summ = _rows(tables.get("study_summary"), table="probe", level="layer")
    if summ.empty:
        return None
    figures = []
    for metric, label in (("uuas", "UUAS"), ("root_acc", "root accuracy")):
        tuned = summ[(summ["metric"] == metric) & (summ["quantity"] == "tuned")]
        if tuned.empty:
            continue
        base = summ[(summ["metric"] == metric) & (summ["quantity"] == "base")].groupby("layer")["mean"].mean()
        figures.append(figs.make(
            f"study_probe_{metric}",
            lambda tuned=tuned, base=base, label=label: study_layer_curves(
                tuned, base=base, similarity=False, ylabel=label, title=f"Structural probe: {label}"),
            f"Probe {label} per layer (Hewitt & Manning 2019) for the base model (black) and each task's tuned "
            "models (mean over seeds, band: seed minimum to maximum).",
            f"Probe {label} per layer per task",
        ))
    return {"figures": [f for f in figures if f]} if figures else None


def _which_change(tables: Mapping[str, pd.DataFrame]) -> dict | None:
    """Per task, across seeds: the changed-vs-needed rank correlations and the transplant layer curves' gain recovered,
    each with the seed-noise verdict (the study's ``study_effects`` rows of those tables)."""
    eff = tables.get("study_effects")
    if eff is None or eff.empty:
        return None
    rows = []
    for name, what in (("changed_vs_needed", "Spearman, change vs revert drop"), (TRANSPLANT_TABLE, "gain recovered")):
        part = _rows(eff, table=name)
        if name == TRANSPLANT_TABLE and not part.empty:
            part = part[part["level"] == "layers"]  # the layer curves; single units are in the study's tables
        rows += [[str(r["task"]), what, str(r["unit"]), str(r["metric"]), float(r["change_mean"]), r["change_sd"],
                  int(r["n_seeds"]), r["noise_max"], r["p_value"], _verdict(r["beyond_noise"])]
                 for _, r in part.sort_values(["task", "metric", "unit"]).iterrows()]
    if not rows:
        return None
    table = sortable([("task", "Task", "text"), ("what", "Quantity", "text"), ("unit", "Unit", "text"),
                      ("metric", "Metric", "text"), ("mean", "Mean over seeds", "num"), ("sd", "SD over seeds", "num"),
                      ("n", "Seeds", "num"), ("noise", "Largest seed-vs-seed", "num"), ("p", "p", "num"),
                      ("verdict", "Verdict", "text")], rows)
    return {"figures": [], "table": table, "one_column": True}


def _differences(tables: Mapping[str, pd.DataFrame]) -> dict | None:
    diff = tables.get("study_task_differences")
    if diff is None or diff.empty:
        return None
    coarse = diff[diff["level"].isin(["layer", "model"])]
    tested = coarse[coarse["beyond_noise"].notna()]
    flagged = tested[tested["beyond_noise"].astype(bool)].sort_values("p_value")
    rows = [[str(r["table"]), str(r["metric"]), str(r["unit"]), str(r["task_a"]), str(r["task_b"]),
             float(r["mean_a"]), float(r["mean_b"]), float(r["difference"]), float(r["p_value"])]
            for _, r in flagged.head(40).iterrows()]
    reasons = sorted({str(r) for r in coarse.loc[coarse["beyond_noise"].isna(), "reason"] if r})
    return {
        "n_units": len(coarse), "n_tested": len(tested), "n_beyond": len(flagged), "reasons": reasons,
        "table": sortable([("table", "Table", "text"), ("metric", "Metric", "text"), ("unit", "Unit", "text"),
                           ("a", "Task A", "text"), ("b", "Task B", "text"), ("ma", "Mean A", "num"),
                           ("mb", "Mean B", "num"), ("d", "A − B", "num"), ("p", "p", "num")], rows),
    }


def _jobs(manifest: Mapping) -> dict | None:
    jobs = [mapping(j) for j in manifest.get("jobs", []) if isinstance(j, Mapping)]
    if not jobs:
        return None
    jobs.sort(key=lambda j: (j.get("status") != "failed", str(j.get("id"))))
    rows = [[str(j.get("id", "")), str(j.get("kind", "")), str(j.get("status", "")),
             j.get("wall_time_s") if j.get("status") in ("done", "cached", "failed") else None,
             str(j.get("finished") or ""), str(j.get("error") or ""), str(j.get("reason") or "")] for j in jobs]
    table = sortable([("id", "Job", "text"), ("kind", "Kind", "text"), ("status", "Status", "text"),
                      ("wall", "Wall time (s)", "num"), ("finished", "Finished", "text"), ("error", "Error", "text"),
                      ("reason", "Why it ran again", "text")], rows)
    for job, row in zip(jobs, table["rows"]):
        if job.get("status") == "cached" and row[3]["value"] != "":
            row[3]["text"] += " (cached)"  # not run now: the time it took in the run that finished it
    failed = sum(1 for j in jobs if j.get("status") == "failed")
    cached = sum(1 for j in jobs if j.get("status") == "cached")
    rerun = sum(1 for j in jobs if j.get("reason"))
    return {"n": len(jobs), "failed": failed, "cached": cached, "rerun": rerun, "table": table}


def _listing(study_dir: Path) -> list[dict]:
    folder = study_dir / "tables"
    names = sorted({p.stem for p in folder.glob("*.parquet")} | {p.stem for p in folder.glob("*.csv")})
    return [{"name": n, "files": [f"tables/{n}.{ext}" for ext in ("parquet", "csv") if (folder / f"{n}.{ext}").exists()],
             "study": "study_" in n,
             "own": n.startswith("own_"), "ood": n.endswith("_ood")} for n in names]


# ------------------------------------------------------------------------------------------- render
def build_study_context(study_dir: str | Path) -> dict:
    """Everything the study template needs (also writes the figures)."""
    study_dir = Path(study_dir).expanduser()
    if not study_dir.is_dir():
        raise BertologyError(f"Study directory {study_dir} does not exist or is not a folder.")
    warnings: list[str] = []
    manifest = _manifest(study_dir, warnings)
    warnings += [str(w) for w in manifest.get("warnings", [])]  # e.g. a fine-tuned seed that did not beat chance
    warnings += _skipped_experiments(study_dir)
    tables = _study_tables(study_dir, warnings, manifest)
    stale = manifest.get("stale_tables")
    if isinstance(stale, Mapping) and stale:
        warnings += stale_lines(stale)
    figs = Figures(study_dir, warnings)
    sections: list[dict] = []

    def add(id_: str, title: str, body: dict | None) -> None:
        if body is not None:
            sections.append({"id": id_, "title": title, **body})

    add("noise", "Seed noise", _noise_rule(tables, manifest))
    add("attention", "Attention change", _attention(tables, figs))
    add("similarity", "Representation similarity", _similarity(tables, figs))
    add("patterns", "Attention patterns", _patterns(tables, figs))
    add("ablation", "Head ablation", _ablation(tables, figs))
    add("which-change", "Which change matters", _which_change(tables))
    add("probe", "Structural probes", _probe(tables, figs))
    add("differences", "Task differences", _differences(tables))
    add("crosscoder-seeds", "Crosscoder features across seeds", crosscoder_seed_section(study_dir))
    add("jobs", "Jobs", _jobs(manifest))
    from bertology import __version__

    return {
        "title": "bertology study",
        "subtitle": f"{manifest.get('base', study_dir.name)}: {len(manifest.get('pairs', []) or [])} tuned models",
        "study_dir": str(study_dir),
        "rendered": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "version": __version__,
        "overview": _overview(manifest, study_dir, tables),
        "warnings": warnings,
        "sections": sections,
        "toc": [{"id": "overview", "title": "Overview"}] + [{"id": s["id"], "title": s["title"]} for s in sections]
        + [{"id": "tables", "title": "Tables"}],
        "listing": _listing(study_dir),
    }


def render_study_report(study_dir: str | Path) -> Path:
    """Write ``STUDY/report.html`` (and ``STUDY/figures/study_*.svg``) from the ``study_*`` tables; return its path."""
    study_dir = Path(study_dir).expanduser()
    context = build_study_context(study_dir)
    env = Environment(loader=PackageLoader("bertology.report", "templates"), autoescape=True,
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["num"] = fmt_value
    page = env.get_template("study.html.j2").render(**context)
    out = study_dir / "report.html"
    atomic_write_text(out, page)
    logger.info("wrote %s", out)
    return out
