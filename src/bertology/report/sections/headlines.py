"""The manifest's ``summary`` as the overview's headline cards: a person's label for each fact, one card per fact.

A fine-tuning run's summary holds nested records (``metrics``, ``intervals``, ``lora`` ...) and a demo's its own
keys (``heldout_accuracy`` ...). Flattened as they are, they would read ``Metrics › accuracy`` beside the fine-tuning
section's card of the same number; here each known fact gets its label (``Held-out accuracy``), an interval joins
its metric's card as a note, and a fact a section's card already shows (the same ``key``) is left out.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from bertology.report.format import flatten, fmt_value, humanize, mapping

__all__ = ["summary_cards"]

#: Labels of the scalar facts runs record in their summary (fine-tuning runs, the demo).
LABELS = {
    "objective": "Training objective",
    "task": "Task",
    "n_train": "Training examples",
    "n_eval": "Held-out examples",
    "steps": "Optimisation steps",
    "resumed_from_step": "Resumed from step",
    "demo": "Demo",
    "train_examples": "Training examples",
    "heldout_examples": "Held-out examples",
    "compared_examples": "Examples compared",
    "ablation_examples": "Examples in the sweeps",
    "sweeps": "Sweeps",
    "one_seed": "One seed",
    "fine_tuned_model": "Fine-tuned model",
    "data_citation": "Data",
}
#: Facts in seconds: their card reads ``0.8 s``.
SECONDS = {"wall_time_s": "Wall time", "train_time_s": "Training time"}


def _card(label: str, text: Any, note: str | None = None, key: str | None = None) -> dict:
    return {"label": label, "text": text if isinstance(text, str) else fmt_value(text), "note": note,
            **({"key": key} if key else {})}


def _metric_names() -> set[str]:
    from bertology.viz.figures import METRIC_LABELS

    return set(METRIC_LABELS)


def _heldout_label(metric: str) -> str:
    from bertology.report.sections.finetune import heldout_label

    return heldout_label(metric)


def _interval_note(intervals: Mapping[str, Any], metric: str) -> str | None:
    ci = intervals.get(metric)
    if not isinstance(ci, (list, tuple)) or len(ci) != 2:
        return None
    n = intervals.get("n_eval")
    over = f" over {fmt_value(n)} {intervals.get('unit') or 'examples'}" if n is not None else ""
    return f"95% CI [{fmt_value(ci[0])}, {fmt_value(ci[1])}]{over}"


def _words(value: Any) -> str:
    return ", ".join(str(v) for v in value) if isinstance(value, (list, tuple)) else fmt_value(value)


def _excluded(v: Mapping) -> list[dict]:
    note = (f"{fmt_value(v['n_dropped'])} of {fmt_value(v['n_before'])} training examples dropped"
            if v.get("n_dropped") is not None and v.get("n_before") is not None else None)
    return [_card("Excluded words", _words(v.get("words")), note)]


def _layers(v: Mapping) -> list[dict]:
    note = f"{fmt_value(v['remaining'])} remain" if v.get("remaining") is not None else None
    return [_card("Layers removed", _words(v.get("dropped")), note)]


def _frozen(v: Mapping) -> list[dict]:
    layers = v.get("layers") or 0
    parts = [f"{fmt_value(layers)} layer{'s' if layers != 1 else ''}"] if layers else []
    parts += ["the embeddings"] if v.get("embeddings") else []
    params = mapping(v.get("parameters"))
    note = (f"{fmt_value(params['trainable'])} of {fmt_value(params['total'])} parameters trained"
            if params.get("trainable") is not None and params.get("total") is not None else None)
    return [_card("Frozen", " and ".join(parts) or "nothing", note)]


def _early_stopping(v: Mapping) -> list[dict]:
    text = "stopped early" if v.get("stopped_early") else "ran every step"
    bits = [f"best step {fmt_value(v['best_step'])}"] if v.get("best_step") is not None else []
    if v.get("patience") is not None:
        bits.append(f"patience {fmt_value(v['patience'])} evaluations" + (f" on {v['metric']}" if v.get("metric") else ""))
    return [_card("Early stopping", text, "; ".join(bits) or None)]


def _lora(v: Mapping) -> list[dict]:
    text = ", ".join(f"{name} {fmt_value(v[key])}" for key, name in (("rank", "rank"), ("alpha", "alpha")) if key in v)
    bits = [f"targets {_words(v['targets'])}"] if v.get("targets") else []
    if v.get("trainable_percent") is not None:
        bits.append(f"{fmt_value(v['trainable_percent'])}% of the parameters trained")
    return [_card("LoRA adapter", text or "yes", "; ".join(bits) or None)]


def _tracking(v: Mapping) -> list[dict]:
    note = "; ".join(b for b in (_words(v["analyses"]) if v.get("analyses") else "",
                                 f"in {v['folder']}" if v.get("folder") else "") if b) or None
    text = f"every {fmt_value(v['every'])} steps" if v.get("every") is not None else "yes"
    return [_card("Tracked while training", text, note)]


#: Nested records with a card (or cards) of their own.
RECORDS: dict[str, Callable[[Mapping], list[dict]]] = {
    "excluded_words": _excluded, "layers": _layers, "frozen": _frozen, "early_stopping": _early_stopping,
    "lora": _lora, "tracking": _tracking,
}


def _slices(v: Mapping, metrics: set[str]) -> list[dict]:
    cards = []
    for name, record in v.items():
        record = mapping(record)
        metric = next((m for m in record if m in metrics and m != "loss"), None)
        if metric is None:
            continue
        note = (f"over {fmt_value(record['n_eval'])} held-out example{'' if record['n_eval'] == 1 else 's'}"
                if record.get("n_eval") is not None else None)
        cards.append(_card(f"{_heldout_label(metric)}, slice {name}", record[metric], note))
    return cards


def summary_cards(summary: Mapping[str, Any], derived: list[dict]) -> list[dict]:
    """The overview's cards: those of a run's ``summary``, in its order, then the sections' (``derived``). A fact a
    section's card shows (the same ``key``, e.g. ``heldout.accuracy``) is that card, in the summary's place."""
    keyed = {d["key"]: d for d in derived if d.get("key")}
    covered = set(keyed)
    placed: set[str] = set()
    metrics = _metric_names()
    intervals = mapping(summary.get("intervals"))
    cards: list[dict] = []

    def metric_card(metric: str, value: Any) -> None:
        # the loss is a headline only where no task metric is (the fine-tuning section's table has it)
        key = f"heldout.{metric}"
        if key in keyed and keyed[key]["text"] == fmt_value(value):  # the section's card says it: in its place
            if key not in placed:
                cards.append(keyed[key])
                placed.add(key)
        elif key in keyed:  # another number under the same name: both shown, this one named by where it is from
            cards.append(_card(f"{_heldout_label(metric)} (run summary)", value, _interval_note(intervals, metric)))
        elif not (metric == "loss" and any(k.startswith("heldout.") for k in covered)):
            cards.append(_card(_heldout_label(metric), value, _interval_note(intervals, metric), key))

    for key, value in summary.items():
        if key == "intervals":  # each interval is a note on its metric's card
            continue
        if key == "metrics" and isinstance(value, Mapping):
            for metric, v in value.items():
                if metric != "n_eval" and not isinstance(v, Mapping):  # n_eval: the "Held-out examples" card
                    metric_card(str(metric), v)
        elif key.startswith("heldout_") and key.removeprefix("heldout_") in metrics:
            metric_card(key.removeprefix("heldout_"), value)
        elif key == "slices" and isinstance(value, Mapping):
            cards += _slices(value, metrics)
        elif key in RECORDS and isinstance(value, Mapping):
            cards += RECORDS[key](value)
        elif key in SECONDS:
            cards.append(_card(SECONDS[key], f"{fmt_value(value)} s" if isinstance(value, (int, float)) else value))
        elif key in LABELS:
            cards.append(_card(LABELS[key], value))
        elif isinstance(value, Mapping):
            cards += [_card(humanize(f"{key}.{k}"), v) for k, v in flatten(value)]
        else:
            cards.append(_card(humanize(key), value))
    return cards + [d for d in derived if d.get("key") not in placed]
