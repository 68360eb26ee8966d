"""The report's fine-tuning section: evaluation slices apart from the curves, anisotropy before/after."""
import json

import pandas as pd

from bertology.report.render import build_context, render_report
from bertology.results import write_table


def _run(tmp_path, with_slices=True, with_anisotropy=True):
    run = tmp_path / "run"
    rows = [(0, 0.0, "eval", "accuracy", 0.50, "all"), (10, 1.0, "eval", "accuracy", 0.80, "all"),
            (10, 1.0, "train", "loss", 0.4, "all"), (0, 0.0, "eval", "loss", 0.7, "all"), (10, 1.0, "eval", "loss", 0.45, "all")]
    if with_slices:
        rows += [(10, 1.0, "eval", "accuracy", 0.10, "with_words"), (10, 1.0, "eval", "n_eval", 30, "with_words"),
                 (10, 1.0, "eval", "accuracy", 0.95, "without_words"), (10, 1.0, "eval", "n_eval", 70, "without_words")]
    write_table(run, "finetune", pd.DataFrame(rows, columns=["step", "epoch", "split", "metric", "value", "slice"]))
    if with_anisotropy:
        aniso = pd.DataFrame([(m, layer, "anisotropy", v, 100) for m, vals in (("base", (0.1, 0.3, 0.2)), ("tuned", (0.1, 0.2, 0.05)))
                              for layer, v in enumerate(vals)], columns=["model", "layer", "metric", "value", "n"])
        write_table(run, "anisotropy", aniso)
    (run / "manifest.json").write_text(json.dumps({"kind": "finetune"}), encoding="utf-8")
    return run


def test_slices_are_a_table_of_their_own_and_do_not_bend_the_final_metrics(tmp_path):
    run = _run(tmp_path)
    ctx = build_context(run)
    sec = ctx["sections"]["finetune"]
    final = {row[0]["value"]: [c["text"] for c in row[1:]] for row in sec["table"]["rows"]}
    assert "0.8" in final["accuracy"]  # the 'all' row, not a mean with the slices (0.617)
    slices = {row[0]["text"]: row for row in sec["slices"]["rows"]}
    assert set(slices) == {"with_words", "without_words"}
    html = render_report(run).read_text(encoding="utf-8")
    assert "Evaluation slices" in html and "fig-finetune_anisotropy" in html


def test_without_slices_or_anisotropy_the_section_has_neither(tmp_path):
    html = render_report(_run(tmp_path, with_slices=False, with_anisotropy=False)).read_text(encoding="utf-8")
    assert 'id="finetune"' in html and "Evaluation slices" not in html and "fig-finetune_anisotropy" not in html


def test_the_data_of_a_finetune_run_reads_as_named_fields_not_json(tmp_path):
    """The overview's Data table shows each split's reader stats as named rows (thousands separators,
    column roles spelt out, the hash shortened), escaped; no raw JSON of the stats."""
    run = _run(tmp_path, with_slices=False, with_anisotropy=False)
    train = {"name": "nli </script><b>x</b>", "source": "/d/train.tsv", "n_examples": 12340, "pairs": True,
             "labels": "2 classes", "sha256": "ab" * 32, "columns": {"text": "premise", "label": "gold"},
             "format": "tsv", "n_rows": 12345, "n_no_gold_label": 5, "label_warnings": ["one", "two"]}
    (run / "manifest.json").write_text(json.dumps({"kind": "finetune", "data": {"train": train, "eval": None}}))
    rows = build_context(run)["overview"]["data_rows"]
    assert [r["group"] for r in rows if r["group"]] == ["Train data"]
    text = {r["label"]: r["text"] for r in rows if not r["group"]}
    assert text["Rows read"] == f"{12345:,}" == "12,345" and text["Examples read"] == "12,340"
    assert text["Without a gold label"] == "5" and text["Columns used"] == "Text: premise; Label: gold"
    assert text["Label warnings"] == "one, two" and text["Data SHA-256"] == "ab" * 6 + "…"
    assert text["Eval data"] == "none given" and text["Name"] == train["name"]
    html = render_report(run).read_text(encoding="utf-8")
    data = html[html.index("<h3>Data</h3>"):html.index("<h3>Settings</h3>")]
    assert "nli &lt;/script&gt;&lt;b&gt;x&lt;/b&gt;" in data and "<b>x</b>" not in data
    assert '{"' not in data and "&#34;columns&#34;" not in data and "12,345" in data
