"""The report's section registry: page order, declared tables, and adding a section from outside."""
from __future__ import annotations

import json
import re
import sys
from importlib.resources import files
from pathlib import Path

import pandas as pd
import pytest

from bertology.report.format import fmt_value
from bertology.report.render import KNOWN_TABLES, build_context, render_report
from bertology.report.sections import OVERVIEW, SECTIONS, Section, SectionInput, known_tables
from bertology.results import write_table

sys.path.insert(0, str(Path(__file__).parent))
from test_report import parse  # noqa: E402

PAGE_ORDER = (
    "attention-change", "attention-patterns", "representation-similarity", "attention-targets", "relation-heads", "absa",
    "head-map", "geometry", "pca-views", "weight-change", "probe", "token-probe", "ablation", "revert", "transplant",
    "changed-vs-needed", "measure-agreement", "crosscoder", "activation-difference", "attention-viewer", "tracking",
    "finetune",
)


def test_registry_keeps_the_page_order_and_every_template():
    assert tuple(s.id for s in SECTIONS) == PAGE_ORDER
    templates = files("bertology.report") / "templates"
    for section in (OVERVIEW, *SECTIONS):
        assert (templates / section.template).is_file(), section.template
        assert section.title and not section.title.endswith(".")


def test_known_tables_are_what_the_sections_declare():
    assert KNOWN_TABLES == known_tables(SECTIONS)
    assert {"attention_change", "representation_similarity_ood", "head_distance", "pruning_curve"} <= set(KNOWN_TABLES)
    assert KNOWN_TABLES["attention_change"] == ("layer", "head", "cosine", "js_divergence", "n_examples")


def test_two_sections_must_agree_on_a_shared_table():
    a = Section("a", "A", {"t": ("x",)}, lambda inp: None, "a.html.j2")
    b = Section("b", "B", {"t": ("x", "y")}, lambda inp: None, "b.html.j2")
    assert known_tables([a, a]) == {"t": ("x",)}
    with pytest.raises(ValueError, match="columns of table 't'"):
        known_tables([a, b])


# ------------------------------------------------------------------------ a section added from outside
def _toy_build(inp: SectionInput) -> dict | None:
    """The whole of a new section's code: read its table, derive a headline, return the template's dict."""
    df = inp.table("toy_counts")
    if df is None:
        return None
    total = float(df["count"].sum())
    inp.derived.append({"label": "Toy total", "text": fmt_value(total), "note": None})
    return {"total": total, "facts": [("Rows", str(len(df)))]}


TOY = Section(id="toy-counts", title="Toy counts", tables={"toy_counts": ("name", "count")}, build=_toy_build,
              template="sections/toy_counts.html.j2")

TOY_TEMPLATE = """{% from "macros.html.j2" import facts %}
<section id="toy-counts">
  <h2>{{ s.title }}</h2>
  <p class="lede">A section that lives outside the package. It counts things.</p>
  {{ facts(s.facts) }}
  <p class="toy-total">{{ s.total | num }}</p>
</section>
"""


@pytest.fixture()
def toy_templates(tmp_path) -> Path:
    folder = tmp_path / "templates"
    (folder / "sections").mkdir(parents=True)
    (folder / TOY.template).write_text(TOY_TEMPLATE, encoding="utf-8")
    return folder


def _toy_run(run: Path, with_table: bool = True) -> Path:
    run.mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps({"kind": "compare"}), encoding="utf-8")
    write_table(run, "finetune", pd.DataFrame({"step": [0, 10], "split": "eval", "metric": "accuracy",
                                               "value": [0.5, 0.75]}))
    if with_table:
        write_table(run, "toy_counts", pd.DataFrame({"name": ["a", "b"], "count": [4000, 321]}))
    return run


def test_a_new_section_is_one_module_one_template_and_one_registry_entry(tmp_path, toy_templates):
    run = _toy_run(tmp_path / "run")
    html = render_report(run, sections=(*SECTIONS, TOY), template_dirs=[toy_templates]).read_text(encoding="utf-8")
    page = parse(html)
    assert page.section_ids == ["overview", "finetune", "toy-counts"]  # after the registry's sections
    assert page.section_h2["toy-counts"] == "Toy counts"
    toc = re.search(r'<nav class="toc".*?</nav>', html, re.S).group(0)
    assert '<a href="#toy-counts">Toy counts</a>' in toc
    section = re.search(r'<section id="toy-counts">.*?</section>', html, re.S).group(0)
    assert '<p class="toy-total">4,321</p>' in section and "<dt>Rows</dt><dd>2</dd>" in section
    assert "Toy total" in html  # its headline card in the overview
    listing = {t["name"]: t["shown"] for t in build_context(run, (*SECTIONS, TOY))["overview"]["tables"]}
    assert listing == {"finetune": True, "toy_counts": True}


def test_without_its_table_the_new_section_is_left_out(tmp_path, toy_templates):
    run = _toy_run(tmp_path / "run", with_table=False)
    html = render_report(run, sections=(*SECTIONS, TOY), template_dirs=[toy_templates]).read_text(encoding="utf-8")
    assert 'id="toy-counts"' not in html and "Toy counts" not in html


def test_the_registry_alone_does_not_show_an_unknown_table(tmp_path):
    run = _toy_run(tmp_path / "run")
    html = render_report(run).read_text(encoding="utf-8")
    assert 'id="toy-counts"' not in html
    listing = {t["name"]: t["shown"] for t in build_context(run)["overview"]["tables"]}
    assert listing == {"finetune": True, "toy_counts": False}


def test_the_run_settings_show_the_recorded_peak_memory():
    """A CUDA run's memory record reaches the report's Run group, in MiB, and the note stays out of it."""
    from bertology.report.sections.overview import _settings

    manifest = {"kind": "compare", "device": "cuda", "memory": {
        "device": "cuda", "device_peak_allocated_mib": 1182.4, "device_peak_reserved_mib": 1310.0,
        "host_peak_rss_mib": 4637.2, "host_rss_at_start_mib": 3102.5, "note": "..."}}
    run = {r["label"]: r["text"] for g in _settings(manifest) if g["group"] == "Run" for r in g["rows"]}
    assert run["Peak device memory allocated (MiB)"].replace(",", "") == "1182"  # fmt_value: whole MiB at this size
    assert "Peak host memory of the process (MiB)" in run and "Host memory at the start (MiB)" in run
    assert not any("Device memory allocated at the end" in k for k in run)
    cpu = {r["label"] for g in _settings({"memory": {"device": "cpu", "host_peak_rss_mib": 900.0}}) for r in g["rows"]}
    assert cpu == {"Peak host memory of the process (MiB)"}
