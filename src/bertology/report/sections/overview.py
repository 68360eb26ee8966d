"""The overview: which models, data and settings produced the run, its headlines, warnings and tables.

It is not one of ``SECTIONS``: it is built after them (their headline cards land in
``SectionInput.derived``) but drawn first, and it is always on the page.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bertology.conventions import CONVENTIONS
from bertology.report.format import flatten, fmt_value, humanize, mapping
from bertology.report.sections.base import Section, SectionInput
from bertology.report.sections.headlines import summary_cards

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
    ("format", "Format"),
    ("n_rows", "Rows read"),
    ("n_sentences", "Sentences read"),
    ("n_examples", "Examples read"),
    ("pairs", "Sentence pairs"),
    ("labels", "Labels"),
    ("columns", "Columns used"),
    ("header", "Header row"),
    ("n_empty_text", "Empty texts"),
    ("n_no_gold_label", "Without a gold label"),
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

_RUN_FIELDS = (
    ("kind", "Run kind"),
    ("seed", "Seed"),
    ("device", "Device"),
    ("dtype", "Dtype"),
    ("attn_implementation", "Attention implementation"),
    ("fingerprint", "Fingerprint"),
    ("wall_time_s", "Wall time (s)"),
)


_MEMORY_FIELDS = (
    ("device_peak_allocated_mib", "Peak device memory allocated (MiB)"),
    ("device_peak_reserved_mib", "Peak device memory reserved (MiB)"),
    ("device_allocated_at_end_mib", "Device memory allocated at the end (MiB)"),
    ("host_peak_rss_mib", "Peak host memory of the process (MiB)"),
    ("host_rss_at_start_mib", "Host memory at the start (MiB)"),
)


def _memory_rows(memory: Mapping[str, Any]) -> list[dict]:
    """The run's recorded peak memory (``manifest["memory"]``), the fields it has, in a fixed order."""
    return [{"label": label, "text": fmt_value(memory[key]), "code": False}
            for key, label in _MEMORY_FIELDS if memory.get(key) is not None]


def _model_rows(manifest: Mapping[str, Any]) -> tuple[list[str], list[dict]]:
    """Model names (base, tuned, then any other) and one row per recorded field, known fields first."""
    models = mapping(manifest.get("models"))
    model_names = [k for k in ("base", "tuned") if k in models] + [
        k for k in models if k not in ("base", "tuned")
    ]
    model_dicts = {k: mapping(models[k]) for k in model_names}
    rows = []
    seen = set()
    for key, label in _MODEL_FIELDS:
        if any(key in m for m in model_dicts.values()):
            rows.append((key, label))
            seen.add(key)
    for m in model_dicts.values():
        for key in m:
            if key not in seen:
                rows.append((key, humanize(key)))
                seen.add(key)
    model_rows = []
    for key, label in rows:
        cells = []
        for name in model_names:
            value = model_dicts[name].get(key)
            if key == "adapter" and isinstance(value, Mapping):  # a small list, not the record's JSON
                items = adapter_items(value, model_dicts[name].get("num_hidden_layers"))
                cells.append({"text": "; ".join(f"{i['label']}: {i['text']}" for i in items), "title": None,
                              "code": False, "record": items})
                continue
            text = fmt_value(value)
            hashlike = isinstance(value, str) and key.endswith("sha256") and len(value) > 16
            cells.append({"text": value[:12] + "…" if hashlike else text, "title": text if hashlike else None,
                          "code": key in ("path", "weights_sha256", "class") or hashlike, "record": None})
        differs = len({fmt_value(model_dicts[n].get(key)) for n in model_names}) > 1
        model_rows.append({"label": label, "cells": cells, "differs": differs})
    return model_names, model_rows


_PEFT_NAMES = {"LORA": "LoRA", "ADALORA": "AdaLoRA", "IA3": "IA³", "LOHA": "LoHa", "LOKR": "LoKr"}


def _layers_text(indices: list[int], n_layers: Any) -> str:
    """Module indices (0-based, as in the modules' names) as the report's layers (1..N): ``every layer``,
    ``layers 1–3`` or ``layers 1, 4``."""
    layers = sorted({i + 1 for i in indices})
    if isinstance(n_layers, int) and layers == list(range(1, n_layers + 1)):
        return f"every layer (1–{n_layers})" if n_layers > 1 else "layer 1"
    if len(layers) > 2 and layers == list(range(layers[0], layers[-1] + 1)):
        return f"layers {layers[0]}–{layers[-1]}"
    return ("layer " if len(layers) == 1 else "layers ") + ", ".join(map(str, layers))


def target_modules_text(targets: Any, n_layers: Any = None) -> str:
    """An adapter's target modules in a few words: the modules of the encoder's blocks once each, with the layers
    they are in (``attention.self.query, attention.self.value in every layer (1–6)``), then any other module; a
    peft shorthand (``all-linear``) as it is."""
    if isinstance(targets, str):
        return targets
    import re

    per_block: dict[str, list[int]] = {}
    other = []
    for name in targets or []:
        m = re.match(r"^(?:.*\.)?(?:layer|layers|block|blocks|h)\.(\d+)\.(.+)$", str(name))
        if m:
            per_block.setdefault(m.group(2), []).append(int(m.group(1)))
        else:
            other.append(str(name))
    groups: dict[str, list[str]] = {}
    for module, indices in per_block.items():
        groups.setdefault(_layers_text(indices, n_layers), []).append(module)
    parts = [f"{', '.join(modules)} in {where}" for where, modules in groups.items()]
    return "; ".join(parts + ([", ".join(other)] if other else [])) or "—"


def adapter_items(adapter: Mapping[str, Any], n_layers: Any = None) -> list[dict]:
    """A PEFT adapter's record (``models.<name>.adapter``) as a few labelled lines: method, rank, alpha, targets, base,
    the head saved with it, how it was merged; a long hash shortened."""
    a = dict(adapter)
    items = []

    def add(label: str, text: str, *, title: str | None = None, alert: bool = False, code: bool = False) -> None:
        items.append({"label": label, "text": text, "title": title, "alert": alert, "code": code})

    if a.get("peft_type"):
        add("Method", _PEFT_NAMES.get(str(a["peft_type"]).upper(), str(a["peft_type"])))
    if a.get("r") is not None:
        add("Rank", fmt_value(a["r"]))
    if a.get("lora_alpha") is not None:
        add("Alpha", fmt_value(a["lora_alpha"])
            + (f" (scale α/r = {fmt_value(a['lora_alpha'] / a['r'])})" if isinstance(a.get("r"), (int, float)) and a["r"]
               and isinstance(a["lora_alpha"], (int, float)) else ""))
    if a.get("target_modules"):
        full = a["target_modules"]
        count = f"{len(full)} modules: " if isinstance(full, (list, tuple)) else ""
        add("Targets", count + target_modules_text(full, n_layers),
            title=", ".join(map(str, full)) if isinstance(full, (list, tuple)) else None)
    if a.get("base"):
        recorded = a.get("recorded_base")
        add("Base", str(a["base"]) + (f" (recorded: {recorded})" if recorded and str(recorded) != str(a["base"]) else ""))
    if a.get("modules_to_save"):
        add("Saved whole", ", ".join(map(str, a["modules_to_save"])))
    if a.get("unsaved_head_weights"):
        add("Head weights not saved", ", ".join(map(str, a["unsaved_head_weights"])) + " (random here)", alert=True)
    shared = mapping(a.get("shares_base_weights"))
    if shared:
        add("Tensors", f"{fmt_value(shared.get('own_tensors'))} its own ({fmt_value(shared.get('own_parameters'))} "
            f"parameters), {fmt_value(shared.get('shared_tensors'))} shared with the base")
    if "merged" in a:
        add("Merged", "yes" if a["merged"] else "no", title=a.get("weights"))
    if a.get("adapter_sha256"):
        sha = str(a["adapter_sha256"])
        add("Adapter SHA-256", sha[:12] + "…" if len(sha) > 16 else sha, title=sha, code=True)
    return items


def _field_text(value: Any) -> str:
    """One recorded value as readable text: numbers with thousands separators, a mapping as "Name: value"
    pairs, a list joined; never raw JSON (the template escapes it)."""
    if isinstance(value, Mapping):
        return "; ".join(f"{humanize(str(k))}: {_field_text(v)}" for k, v in value.items()) or "—"
    if isinstance(value, (list, tuple)):
        return ", ".join(_field_text(v) for v in value) or "—"
    return fmt_value(value)


def _row(label: str, value: Any, *, hashlike: bool = False, alert: bool = False) -> dict:
    """A row of the data table; a long hash shows its first 12 characters (the whole in its title)."""
    text = _field_text(value)
    short = hashlike and isinstance(value, str) and len(value) > 16
    return {"label": label, "text": value[:12] + "…" if short else text, "title": text if short else None,
            "code": short, "alert": alert, "group": None}


def _is_corpus(value: Any) -> bool:
    """Whether a recorded value describes a corpus of its own (e.g. a fine-tuning run's ``train`` / ``eval``)."""
    return isinstance(value, Mapping) and any(key in value for key in ("n_examples", "source", "sha256"))


def _data_rows(manifest: Mapping[str, Any]) -> list[dict]:
    """The data's provenance, then how it was encoded; skipped or truncated inputs are flagged. A corpus
    recorded inside the data (a fine-tuning run's ``train`` and ``eval``) gets a group of its own rows."""
    return _corpus_rows(mapping(manifest.get("data")))


def _corpus_rows(data: Mapping[str, Any]) -> list[dict]:
    """Rows of one corpus description: known fields first, then the reader's other stats, then its encoding."""
    encoding = mapping(data.get("encoding"))
    known = dict(_DATA_FIELDS)
    rows = [_row(label, data[key], hashlike=key == "sha256") for key, label in _DATA_FIELDS if key in data]
    groups = []
    for key, value in data.items():
        if key in known or key == "encoding":
            continue
        if _is_corpus(value):
            groups.append({"label": humanize(key), "text": "", "title": None, "code": False, "alert": False,
                           "group": f"{humanize(key)} data"})
            groups += _corpus_rows(value)
        elif value is None and any(_is_corpus(v) for v in data.values()):  # e.g. no eval file: a split of train
            groups.append(_row(f"{humanize(key)} data", "none given"))
        else:
            rows.append(_row(humanize(key), value))
    enc_known = dict(_ENCODING_FIELDS)
    rows += [_row(label, encoding[key], alert=key in ("n_skipped_overlong", "n_truncated") and bool(encoding[key]))
             for key, label in _ENCODING_FIELDS if key in encoding]
    rows += [_row(humanize(key), value) for key, value in encoding.items() if key not in enc_known]
    return rows + groups


def _settings(manifest: Mapping[str, Any]) -> list[dict]:
    """Every setting, in groups: the run, then each owner's declared settings (the manifest's ``settings``,
    generated from the declarations: flag, value, and the default when the value differs), then the entries of
    the flat ``config`` they do not show (all of it for runs made before settings were declared; none for
    ``compare``, whose run settings are declared); then the analyses' parameters."""
    settings = []
    run_rows = []
    for key, label in _RUN_FIELDS:
        if key in manifest and not isinstance(manifest[key], Mapping):
            run_rows.append({"label": label, "text": fmt_value(manifest[key]), "code": False})
    run_rows += _memory_rows(mapping(manifest.get("memory")))
    if run_rows:
        settings.append({"group": "Run", "rows": run_rows})
    declared = mapping(manifest.get("settings"))
    for owner, records in declared.items():
        rows = [_declared_row(mapping(r)) for r in mapping(records).values()]
        settings.append({"group": f"Settings: {owner}", "rows": rows})
    names = {name for records in declared.values() for name in mapping(records)}
    for group, key in (("Configuration", "config"), ("Analysis parameters", "analyses")):
        entries = flatten(mapping(manifest.get(key)))
        if key == "config" and declared:  # what the declared settings do not already show (paths, columns, ...)
            if "run" in declared:  # compare: its declarations cover the run; the models and data are shown above
                continue
            entries = [(k, v) for k, v in entries if k.split(".")[0] not in names and k.split(".")[-1] not in names]
        rows = [{"label": k, "text": fmt_value(v), "code": True} for k, v in entries]
        if rows:
            settings.append({"group": group, "rows": rows})
    return settings


def _declared_row(record: Mapping[str, Any]) -> dict:
    """One declared setting: its flag, its value, and what the default was when the run changed it."""
    value, default = record.get("value"), record.get("default")
    text = fmt_value(value) if value is not None else "not given"
    if record.get("source"):  # a default the task's recipe gave (bertology.training.recipes)
        text += f" ({record['source']})"
    elif value != default:
        text += f" (default {fmt_value(default) if default is not None else 'not given'})"
    if record.get("paper"):
        text += f"; {record['paper']}"
    return {"label": str(record.get("flag", "?")), "text": text, "code": True}


def _conventions(manifest: Mapping[str, Any]) -> dict | None:
    """The manifest's paper conventions: the preset, then each convention's value, the paper it reproduces and
    the tables it changes (from the record; older records without tables fall back to :data:`CONVENTIONS`),
    each marked by whether this run wrote it."""
    record = mapping(manifest.get("conventions"))
    if not record:
        return None
    known = {c.field: c for c in CONVENTIONS}
    listed = manifest.get("tables")
    in_run = set(listed) if isinstance(listed, list) else None  # None: unknown, show every table as used
    rows = []
    for field, entry in record.items():
        if field == "preset":
            continue
        entry, conv = mapping(entry), known.get(field)
        rows.append({
            "field": field,
            "what": conv.what if conv else "",
            "value": fmt_value(entry.get("value")),
            "source": fmt_value(entry.get("source")),
            "tables": [{"name": t, "in_run": in_run is None or t in in_run}
                       for t in entry.get("tables") or (conv.tables if conv else ())],
            "paper": conv is not None and entry.get("value") != conv.default,
        })
    return {"preset": fmt_value(record.get("preset")), "rows": rows}


#: What the page holds, by the run's kind (``manifest["kind"]``): the overview's first paragraph. A kind not listed
#: (a compare run, or a manifest without a kind) reads as a comparison.
LEDES = {
    "compare": "This report puts a pretrained encoder (<em>base</em>) and its fine-tuned version (<em>tuned</em>) side "
               "by side on the same inputs and measures what changed in their attention and representations.",
    "finetune": "This report shows one fine-tuning run (<code>bertology finetune</code>): the pretrained encoder "
                "(<em>base</em>) trained on the task's data into the model saved in the run folder (<em>tuned</em>). "
                "It holds the training curves and the final held-out metrics with their 95% intervals; it does not "
                "look inside the models. To see what the training changed in attention and representations, compare "
                "the two: <code>bertology compare</code> with the saved model as <code>--tuned</code>.",
    "ablate": "This report shows an ablation run (<code>bertology ablate</code>): every head and layer of a fine-tuned "
              "model disabled in turn, and what the task loses (or gains) each time.",
    "probe": "This report shows a probing run (<code>bertology probe</code>): structural probes trained on every "
             "layer, measuring how much syntax each model's representations keep.",
    "track": "This report follows a model through its fine-tuning (<code>bertology track</code>): the analyses run on "
             "each checkpoint against the base model, plotted over the training steps.",
}
_TRACE = (" The tables below record which models, data and settings produced every number, so each figure can be "
          "traced back to the run directory.")


def lede(manifest: Mapping[str, Any]):
    """The overview's first paragraph for this run's kind (our own HTML: it names commands in ``<code>``)."""
    from markupsafe import Markup

    return Markup(LEDES.get(str(manifest.get("kind")), LEDES["compare"]) + _TRACE)


#: Manifest statuses of a run that finished.
FINISHED = ("complete", "done")


def incomplete(manifest: Mapping[str, Any], listing: list[dict]) -> dict | None:
    """The banner of a run that did not finish (None when it did, or the manifest says nothing): its status, its
    error, and the planned analyses none of whose tables was written, so missing sections are never just absent."""
    status = manifest.get("status")
    if not manifest or status in FINISHED or status is None:
        return None
    written = {str(t.get("name")) for t in listing if isinstance(t, Mapping)}
    planned = manifest.get("planned") if isinstance(manifest.get("planned"), Mapping) else {}
    missing = [name for name, tables in planned.items() if not written & {str(t) for t in tables or [name]}]
    why = {"running": "it was interrupted or killed, or is still running",
           "interrupted": "it was interrupted", "failed": "it failed"}.get(str(status), f"its status is {status!r}")
    return {"status": str(status), "why": why, "error": fmt_value(manifest.get("error")) if manifest.get("error") else None,
            "missing": missing, "known": bool(planned)}


def overview(manifest: Mapping[str, Any], listing: list[dict], warnings: list[str], derived: list[dict]) -> dict:
    """The overview's dict: the manifest's summary first, then the sections' headline cards (``derived``; one that
    shows a fact of the summary takes that fact's place, :func:`summary_cards`)."""
    model_names, model_rows = _model_rows(manifest)
    summary = summary_cards(mapping(manifest.get("summary")), derived)

    packages = [{"name": k, "version": fmt_value(v)} for k, v in mapping(manifest.get("packages")).items()]
    raw_warnings = manifest.get("warnings") or []
    if isinstance(raw_warnings, (str, Mapping)):
        raw_warnings = [raw_warnings]
    return {
        "lede": lede(manifest),
        "models": model_names,
        "model_rows": model_rows,
        "data_rows": _data_rows(manifest),
        "settings": _settings(manifest),
        "conventions": _conventions(manifest),
        "summary": summary,
        "packages": packages,
        "warnings": [fmt_value(w) if not isinstance(w, str) else w for w in raw_warnings] + warnings,
        "tables": listing,
        "command": manifest.get("command"),
        "incomplete": incomplete(manifest, listing),
    }


def build(inp: SectionInput) -> dict:
    """The overview of the run; call it after every other section so their headlines are in."""
    return overview(inp.manifest, inp.listing, inp.warnings, inp.derived)


OVERVIEW = Section(
    id="overview",
    title="Overview",
    tables={},
    build=build,
    template="sections/overview.html.j2",
)
