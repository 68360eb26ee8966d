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
