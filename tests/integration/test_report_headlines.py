"""The report's overview as a new user reads it (issue 45, 7b): a fine-tune report says what a fine-tune run holds,
its cards carry a person's labels once each, an adapter is a small list, and the headline cards pick by one named
measure, in the decimals that tell the pick apart, and pick the special token whose attention changed most."""
from __future__ import annotations

import json
import re

import pandas as pd

from bertology.report.render import build_context, render_report
from bertology.report.sections.overview import target_modules_text
from bertology.results import write_table

COMPARE_LEDE = "side by side"


def _finetune_run(tmp_path):
    """A fine-tune run folder as ``bertology finetune`` writes it (the summary in ``summary_of``'s shape)."""
    run = tmp_path / "ft"
    rows = [(0, 0.0, "eval", "accuracy", 0.5), (6, 1.0, "eval", "accuracy", 0.75), (6, 1.0, "eval", "macro_f1", 0.7),
            (6, 1.0, "eval", "loss", 0.5), (6, 1.0, "train", "loss", 0.4)]
    write_table(run, "finetune", pd.DataFrame(rows, columns=["step", "epoch", "split", "metric", "value"]))
    write_table(run, "finetune_intervals", pd.DataFrame(
        [("eval", m, v, lo, hi, 12, 1000, "percentile bootstrap") for m, v, lo, hi in
         (("accuracy", 0.75, 0.5, 0.9167), ("macro_f1", 0.7, 0.45, 0.9), ("loss", 0.5, 0.4, 0.6))],
        columns=["split", "metric", "value", "ci_low", "ci_high", "n_eval", "n_bootstrap", "ci_method"]))
    arch = {"model_type": "bert", "family": "BERT", "class": "BertForSequenceClassification", "is_classifier": True,
            "num_attention_heads": 4, "hidden_size": 32, "attn_implementation": "eager"}
    manifest = {
        "kind": "finetune", "status": "done", "tables": ["finetune", "finetune_intervals"],
        "models": {"base": {"name": "tiny", "source": "local", "path": "/m", "num_hidden_layers": 3, **arch},
                   "tuned": {"name": "tiny, fine-tuned", "source": "this run", "path": "ft/model",
                             "num_hidden_layers": 2, "weights_sha256": "d" * 64, **arch}},
        "result": {"task": "classification", "training_objective": "supervised (cross-entropy)"},
        "summary": {"objective": "supervised (cross-entropy)", "task": "classification", "n_train": 48, "n_eval": 12,
                    "metrics": {"accuracy": 0.75, "macro_f1": 0.7, "loss": 0.5, "n_eval": 12},
                    "wall_time_s": 0.803, "train_time_s": 0.137, "steps": 6,
                    "intervals": {"n_eval": 12, "unit": "examples", "accuracy": [0.5, 0.9167],
                                  "macro_f1": [0.45, 0.9], "loss": [0.4, 0.6]},
                    "layers": {"dropped": [3], "remaining": 2},
                    "lora": {"rank": 8, "alpha": 16, "targets": ["query", "value"], "trainable_percent": 7.5}},
    }
    (run / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return run


def _cards(run) -> dict[str, dict]:
    cards = build_context(run)["overview"]["summary"]
    labels = [c["label"] for c in cards]
    assert len(labels) == len(set(labels)), f"a card twice: {labels}"
    return {c["label"]: c for c in cards}


def test_a_finetune_report_says_what_a_finetune_run_holds_not_the_comparison(tmp_path):
    html = render_report(_finetune_run(tmp_path)).read_text(encoding="utf-8")
    lede = re.search(r'<section id="overview">.*?<p class="lede">(.*?)</p>', html, re.S).group(1)
    assert COMPARE_LEDE not in lede and "puts a pretrained encoder" not in html
    assert "one fine-tuning run" in lede and "<code>bertology compare</code>" in lede  # our own markup, not escaped


def test_a_compare_report_keeps_the_comparison_intro(tmp_path):
    run = tmp_path / "cmp"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"kind": "compare", "models": {}}), encoding="utf-8")
    assert COMPARE_LEDE in build_context(run)["overview"]["lede"]


def test_finetune_cards_carry_labels_once_each_and_the_interval_joins_its_metric(tmp_path):
    cards = _cards(_finetune_run(tmp_path))
    assert not [label for label in cards if "›" in label or "Metrics" in label or "Intervals" in label]
    acc = cards["Held-out accuracy"]  # the fine-tuning section's card, in the summary's place: not twice
    assert acc["text"] == "0.75" and "95% CI [0.5, 0.9167] over 12 examples" in acc["note"]
    assert "Held-out macro F1" in cards and "Held-out loss" not in cards  # the loss is in the section's table
    assert cards["Held-out examples"]["text"] == "12" and cards["Training examples"]["text"] == "48"
    assert cards["Wall time"]["text"] == "0.803 s" and cards["Training time"]["text"] == "0.137 s"
    assert cards["Optimisation steps"]["text"] == "6" and cards["Training objective"]["text"].startswith("supervised")
    assert cards["Layers removed"]["text"] == "3" and cards["Layers removed"]["note"] == "2 remain"
    assert cards["LoRA adapter"]["text"] == "rank 8, alpha 16" and "targets query, value" in cards["LoRA adapter"]["note"]
    order = list(cards)
    assert order.index("Held-out examples") < order.index("Held-out accuracy") < order.index("Wall time")


def test_the_tuned_column_of_a_finetune_report_is_filled(tmp_path):
    ov = build_context(_finetune_run(tmp_path))["overview"]
    assert ov["models"] == ["base", "tuned"]
    tuned = [row["cells"][1]["text"] for row in ov["model_rows"]]
    assert "—" not in tuned  # every recorded field of the base is recorded for the tuned model too
    layers = next(r for r in ov["model_rows"] if r["label"] == "Layers")
    assert [c["text"] for c in layers["cells"]] == ["3", "2"] and layers["differs"]


ADAPTER = {
    "peft_type": "LORA", "task_type": "SEQ_CLS", "base": "m", "recorded_base": "/tmp/m", "merged": True,
    "weights": "the adapter merged into a copy of its base (merge_and_unload); the base is held twice",
    "unsaved_head_weights": [], "r": 4, "lora_alpha": 8,
    "target_modules": [f"bert.encoder.layer.{i}.attention.self.{m}" for i in (0, 1) for m in ("query", "value")]
    + ["bert.pooler.dense"],
    "modules_to_save": ["classifier", "score"],
    "shares_base_weights": {"shared_tensors": 27, "own_tensors": 16, "own_parameters": 17506},
    "adapter_sha256": "e" * 64,
}


def test_an_adapter_reads_as_a_small_list_not_json(tmp_path):
    run = tmp_path / "lora"
    run.mkdir()
    arch = {"model_type": "bert", "num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 32}
    (run / "manifest.json").write_text(json.dumps({"kind": "compare", "models": {
        "base": {"name": "m", **arch}, "tuned": {"name": "adapter", "source": "adapter", **arch, "adapter": ADAPTER}}}))
    row = next(r for r in build_context(run)["overview"]["model_rows"] if r["label"] == "Adapter")
    items = {i["label"]: i["text"] for i in row["cells"][1]["record"]}
    assert items["Method"] == "LoRA" and items["Rank"] == "4" and items["Alpha"] == "8 (scale α/r = 2)"
    assert items["Base"] == "m (recorded: /tmp/m)" and items["Saved whole"] == "classifier, score"
    assert items["Targets"] == ("5 modules: attention.self.query, attention.self.value in every layer (1–2); "
                                "bert.pooler.dense")
    assert items["Adapter SHA-256"] == "e" * 12 + "…"
    html = render_report(run).read_text(encoding="utf-8")
    models = html[html.index('<table class="models">'):]
    models = models[:models.index("</table>")]
    assert '<dl class="record">' in models and "<dt>Rank</dt>" in models
    assert "&#34;r&#34;" not in models and '{"' not in models and "peft_type" not in models


def test_target_modules_name_their_layers_in_the_reports_numbering():
    names = [f"encoder.layer.{i}.attention.self.query" for i in (0, 3)]
    assert target_modules_text(names, 6) == "attention.self.query in layers 1, 4"
    assert target_modules_text(["query", "value"], 6) == "query, value"
    assert target_modules_text("all-linear") == "all-linear"


# ----------------------------------------------------------------------- headline picks on planted tables
def _compare_run(tmp_path, tables: dict[str, pd.DataFrame]):
    run = tmp_path / "cmp"
    for name, df in tables.items():
        write_table(run, name, df)
    (run / "manifest.json").write_text(json.dumps({"kind": "compare", "tables": list(tables)}), encoding="utf-8")
    return run


def _targets(cls: tuple[float, float], sep: tuple[float, float]) -> pd.DataFrame:
    rows = []
    for model, i in (("base", 0), ("tuned", 1)):
        for layer in (1, 2):
            for head in range(2):
                rows += [dict(model=model, layer=layer, head=head, target="cls", value=cls[i] if layer == 2 else 0.1),
                         dict(model=model, layer=layer, head=head, target="sep", value=sep[i] if layer == 2 else 0.1),
                         dict(model=model, layer=layer, head=head, target="punct", value=0.05)]
    return pd.DataFrame(rows)


def test_the_special_token_headline_picks_the_largest_change(tmp_path):
    # the demo's case: [SEP] 0.03 -> 0.03 was shown while [CLS] 0.34 -> 0.20 was not
    cards = _cards(_compare_run(tmp_path / "a", {"attention_targets": _targets((0.34, 0.20), (0.03, 0.031))}))
    card = cards["Attention to [CLS], layer 2"]
    assert card["text"] == "0.34 → 0.20" and "[SEP] 0.03 → 0.03" in card["note"]
    assert not [label for label in cards if "[SEP]" in label]
    cards = _cards(_compare_run(tmp_path / "b", {"attention_targets": _targets((0.30, 0.29), (0.05, 0.45))}))
    assert cards["Attention to [SEP], layer 2"]["text"] == "0.05 → 0.45"


def _attention(js: list[float], cosine: list[float]) -> pd.DataFrame:
    return pd.DataFrame([dict(layer=1 + i // 4, head=i % 4, cosine=c, js_divergence=j, n_examples=10)
                         for i, (j, c) in enumerate(zip(js, cosine))])


def _head_map(moved: list[float]) -> pd.DataFrame:
    return pd.DataFrame([dict(model=m, layer=1 + i // 4, head=i % 4, x=0.0, y=0.0, moved=v, n_examples=5)
                         for m in ("base", "tuned") for i, v in enumerate(moved)])


def test_one_most_changed_head_by_one_named_measure(tmp_path):
    js = [0.01, 0.2, 0.19, 0.0, 0.0, 0.0, 0.0, 0.0]
    cos = [0.95, 0.70, 0.60, 1.0, 1.0, 1.0, 1.0, 1.0]  # the lowest cosine (L1H2) is not the largest JS (L1H1)
    moved = [0.1, 0.2, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0]   # nor is the head map's farthest mover (L1H2)
    cards = _cards(_compare_run(tmp_path / "both", {"attention_change": _attention(js, cos), "head_map": _head_map(moved)}))
    most = [label for label in cards if "head" in label.lower() and "most" in label.lower()]
    assert most == ["Most changed head (JS divergence)"]  # the head map does not name a second one
    card = cards["Most changed head (JS divergence)"]
    assert card["text"] == "L1H1" and card["note"].startswith("JS divergence 0.200 (next: L1H2, 0.190)")
    alone = _cards(_compare_run(tmp_path / "map", {"head_map": _head_map(moved)}))
    assert alone["Head that moved most (JS distance, head map)"]["text"] == "L1H2"


def test_the_most_changed_head_shows_the_digits_that_pick_it_or_says_none_stands_out(tmp_path):
    js = [0.12341, 0.12346, 0.1, 0.0, 0.0, 0.0, 0.0, 0.0]
    card = _cards(_compare_run(tmp_path / "close", {"attention_change": _attention(js, [0.9] * 8)}))[
        "Most changed head (JS divergence)"]
    assert card["text"] == "L1H1" and "JS divergence 0.1235 (next: L1H0, 0.1234)" in card["note"]
    tiny = [0.00001, 0.00004, 0.0, 0.0, 0.00002, 0.0, 0.0, 0.0]
    card = _cards(_compare_run(tmp_path / "flat", {"attention_change": _attention(tiny, [0.99999] * 8)}))[
        "Most changed head (JS divergence)"]
    assert card["text"] == "none stands out"
    assert card["note"] == "all 8 heads: JS divergence ≤ 0.0005, cosine = 1.000"
