"""The study report: rendered from a synthetic study directory, offline, escaped, linked to the pair reports."""
from __future__ import annotations

import json
import os
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest

from bertology.errors import BertologyError
from bertology.report.format import fmt_value
from bertology.report.study import render_study_report
from bertology.studies.noise import STUDY_TABLES
from bertology.studies.summarise import main, summarise_study
from bertology.testing.synthetic import LatentSpace, synthetic_study

SECTIONS = ("overview", "noise", "attention", "similarity", "patterns", "ablation", "probe", "differences",
            "jobs", "tables")


class _Page(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def parse(html: str) -> _Page:
    page = _Page()
    page.feed(html)
    return page


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    folder = synthetic_study(tmp_path_factory.mktemp("study"), {"sst2": 3, "mrpc": 3, "rte": 1})
    out = summarise_study(folder)
    return folder, out, out.read_text(encoding="utf-8")


def test_sections_figures_and_tables(rendered):
    folder, out, html = rendered
    assert out == folder / "report.html"
    page = parse(html)
    ids = {a.get("id") for t, a in page.tags if t == "section"}
    assert set(SECTIONS) <= ids
    assert {f"#{s}" for s in SECTIONS} <= {a.get("href") for t, a in page.tags if t == "a"}
    for name in ("study_attention_cosine_distance", "study_attention_js_divergence", "study_similarity_cka_linear",
                 "study_pattern_shares", "study_ablation", "study_probe_uuas"):
        assert (folder / "figures" / f"{name}.svg").is_file()
        assert f'id="fig-{name}"' in html
    # the study tables were computed and written for notebooks
    for name in STUDY_TABLES:
        assert (folder / "tables" / f"{name}.parquet").is_file() and (folder / "tables" / f"{name}.csv").is_file()
        assert f"tables/{name}.parquet" in html
    text = " ".join(" ".join(page.text).split())
    assert "rte has a single seed" in text
    assert "3 vs 3 seeds: the smallest possible p is 0.1 > alpha 0.05" in text
    # the planted head is listed beyond noise in the ablation table
    assert "L5H0" in text


def test_links_to_every_pair_report(rendered):
    folder, _, html = rendered
    page = parse(html)
    links = [a["href"] for t, a in page.tags if t == "a" and a.get("class") == "pair-report"]
    manifest = json.loads((folder / "manifest.json").read_text())
    assert sorted(links) == sorted(p["report"] for p in manifest["pairs"])
    assert all((folder / href).is_file() for href in links)


def test_nothing_on_the_network_and_data_escaped(rendered):
    _, _, html = rendered
    page = parse(html)
    for tag, attrs in page.tags:
        for name in ("src", "href", "xlink:href", "action"):
            assert not re.match(r"\s*(https?:)?//", attrs.get(name) or "", re.I), (tag, attrs)
        if tag == "script":
            assert "src" not in attrs
    leftovers = re.sub(r'xmlns(:\w+)?="http://www\.w3\.org/[^"]*"', "", html)
    assert "http://" not in leftovers and "https://" not in leftovers
    # the failed job's error holds markup: shown as text, never as a tag
    assert "<script>alert(1)</script>" not in html
    assert "CUDA out of memory <script>alert(1)</script>" in " ".join(page.text)
    assert sum(t == "script" for t, _ in page.tags) == 1


def test_absent_tables_leave_their_sections_out_and_bad_links_unlinked(tmp_path):
    folder = synthetic_study(tmp_path, {"a": 3}, planted={"a": 2}, tables=("attention_change",), failed_job=False)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["pairs"][0]["report"] = "javascript:alert(1)"
    manifest["pairs"][1]["report"] = "https://example.org/x.html"
    manifest["jobs"] = []
    (folder / "manifest.json").write_text(json.dumps(manifest))
    html = summarise_study(folder).read_text()
    ids = {a.get("id") for t, a in parse(html).tags if t == "section"}
    assert {"overview", "noise", "attention", "tables"} <= ids
    assert not ids & {"similarity", "patterns", "ablation", "probe", "jobs"}
    assert "javascript:" not in html and "example.org" not in html
    assert html.count('class="pair-report"') == 1


def test_skipped_experiments_and_the_heatmap_scale_are_on_the_page(tmp_path):
    """A comparison that left an experiment out for one model (a regressor among classifiers: issue 32) says so at
    the top of the study page, naming the model, the comparison and the reason; the attention heatmaps' caption
    states their colour scale (0 to the largest cell)."""
    folder = synthetic_study(tmp_path, {"a": 3, "b": 3}, planted={"a": 2}, space=LatentSpace(n_layers=3, n_heads=2),
                             tables=("attention_change",), failed_job=False)
    reason = "the labels of shared.tsv (2 distinct labels: '0', '1') are the classes of a/s0, a classifier of this run"
    for where, tuned in (("compare", "b/s0"), ("seeds/b/s0", "b/s1")):
        (folder / where).mkdir(parents=True, exist_ok=True)
        (folder / where / "manifest.json").write_text(json.dumps(
            {"kind": "compare_many", "skipped_experiments": [{"tuned": tuned, "experiment": "ablation", "reason": reason}]}))
    html = summarise_study(folder).read_text()
    text = " ".join(" ".join(parse(html).text).split())
    assert f"Ablation skipped for b/s0 (compare): {reason}." in text
    assert f"Ablation skipped for b/s1 (seeds/b/s0): {reason}." in text
    effects = pd.read_parquet(folder / "tables" / "study_effects.parquet")
    top = effects[(effects["table"] == "attention_change") & (effects["level"] == "layer")
                  & (effects["metric"] == "cosine_distance")]["change_mean"].max()
    assert f"Colours run from 0 to {fmt_value(float(top), 2)}, the largest cell, one scale for every task" in text


def test_alpha_reaches_the_tables_and_the_page(tmp_path):
    folder = synthetic_study(tmp_path, {"a": 3, "b": 3}, planted={"a": 2}, space=LatentSpace(n_layers=3, n_heads=2),
                             tables=("attention_change",))
    assert main([str(folder), "--alpha", "0.1"]) == 0
    diff = pd.read_parquet(folder / "tables" / "study_task_differences.parquet")
    assert (diff["alpha"] == 0.1).all() and diff["beyond_noise"].notna().any()  # 3 vs 3 testable at 0.1
    assert "p ≤ 0.1" in (folder / "report.html").read_text()


def test_errors_are_clear(tmp_path, capsys):
    with pytest.raises(BertologyError, match="does not exist"):
        render_study_report(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty")]) == 1
    assert "none of the study's pair tables" in capsys.readouterr().err
    with pytest.raises(BertologyError, match="no study_effects table"):
        render_study_report(tmp_path / "empty")


# --------------------------------------------------------------------------------------- browser
def _chromium() -> str | None:
    for c in (os.environ.get("BERTOLOGY_CHROMIUM"), shutil.which("chromium"), shutil.which("chromium-browser")):
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c
    return None


@pytest.mark.browser
def test_study_report_in_chromium(rendered):
    playwright = pytest.importorskip("playwright.sync_api")
    chromium = _chromium()
    if chromium is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("no Chromium in CI")
        pytest.skip("no Chromium executable")
    folder, out, _ = rendered
    with playwright.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True,
                                     args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 900})
            problems: list[str] = []
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.on("request", lambda r: problems.append(r.url) if not r.url.startswith(("file:", "data:")) else None)
            page.goto(out.resolve().as_uri(), wait_until="load")
            assert page.locator("section#attention svg").count() == 2
            # the false-positive table fits its column (its long headers wrap) instead of running out of the box
            rule_table = page.locator("section#noise .wrap-head .table-wrap").first
            assert rule_table.evaluate("e => e.scrollWidth <= e.clientWidth"), "the false-positive table overflows"
            # sorting a table by a numeric column reorders it
            header = page.locator("section#jobs thead th", has_text="Wall time")
            header.click()
            header.click()  # descending: the failed job (3 s) moves from the top to the bottom
            cells = page.locator("section#jobs tbody tr td:nth-child(4)").all_inner_texts()
            assert cells[0] == "12.5" and cells[-1] == "3"
            # a pair-report link opens the pair's own page
            page.locator("a.pair-report").first.click()
            page.wait_for_load_state("load")
            assert page.url.endswith("/report.html") and "pair report" in page.content()
            assert problems == []
        finally:
            browser.close()


def _beyond_by_hand(base: pd.DataFrame, pairs: pd.DataFrame, metric: str) -> dict:
    """Per (task, layer): the 3-seed rule done by hand, from the raw tables (no study code).

    With 3 seeds and 3 seed pairs the exact one-sided Mann-Whitney p is <= 0.05 only at its smallest
    value, 1/20, reached when every seed's |1 - same-layer similarity| exceeds every seed pair's.
    """
    same = base[(base["layer_base"] == base["layer_tuned"]) & (base["metric"] == metric)]
    change = (1 - same.groupby(["task", "seed", "layer_base"])["value"].mean()).abs()
    same = pairs[(pairs["layer_base"] == pairs["layer_tuned"]) & (pairs["metric"] == metric)]
    dist = (1 - same.groupby(["task", "seed_a", "seed_b", "layer_base"])["value"].mean()).abs()
    out = {}
    for (task, layer), c in change.groupby(level=["task", "layer_base"]):
        d = dist[(dist.index.get_level_values("task") == task) & (dist.index.get_level_values("layer_base") == layer)]
        out[(task, int(layer))] = None if len(c) < 3 else bool(c.min() > d.max())
    return out


def test_own_data_and_out_of_domain_get_seed_noise_lines_verdicts_and_links(rendered, tmp_path):
    folder, _, html = rendered
    assert "out-of-domain corpus" not in html and "own dev data" not in html
    copy = shutil.copytree(folder, tmp_path / "study")
    t = copy / "tables"
    shared = pd.read_parquet(t / "representation_similarity.parquet")
    seeds = pd.read_parquet(t / "seedpair_representation_similarity.parquet")
    # out of domain: fine-tuning moved every layer far (half the similarity), the seeds as close as before
    ood = shared.assign(value=shared["value"] * 0.5)
    ood.to_parquet(t / "representation_similarity_ood.parquet")
    seeds.to_parquet(t / "seedpair_representation_similarity_ood.parquet")
    # own dev data: base vs tuned as on the shared corpus, seeds three times as far apart
    own_seeds = seeds.assign(value=1 - 3 * (1 - seeds["value"]))
    shared.to_parquet(t / "own_representation_similarity.parquet")
    own_seeds.to_parquet(t / "own_seedpair_representation_similarity.parquet")
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["own_pairs"] = [{**p, "report": p["report"].replace("compare/", "compare_own/")} for p in manifest["pairs"]
                             if p["task"] == "sst2"]
    for p in manifest["own_pairs"]:
        (copy / p["report"]).parent.mkdir(parents=True)
        (copy / p["report"]).write_text("<p>own</p>")
    manifest["tasks"][0]["type"] = "auto"  # the spec left sst2's type to its fine-tunes
    (copy / "manifest.json").write_text(json.dumps(manifest))
    page = summarise_study(copy).read_text(encoding="utf-8")

    for corpus, base, pairs, table in (("ood", ood, seeds, "study_effects_ood"),
                                       ("own", shared, own_seeds, "own_study_effects")):
        svg = (copy / "figures" / f"study_similarity_{corpus}_cka_linear.svg").read_text()
        assert "seed vs seed" in svg  # the dashed line's legend entry
        assert f'id="fig-study_similarity_{corpus}_cka_linear"' in page
        eff = pd.read_parquet(t / f"{table}.parquet").query("table == 'representation_similarity' and metric == 'cka_linear'")
        got = {(r.task, int(r.layer)): None if pd.isna(r.beyond_noise) else bool(r.beyond_noise) for r in eff.itertuples()}
        assert got == _beyond_by_hand(base, pairs, "cka_linear")
    ood_verdicts = set(_beyond_by_hand(ood, seeds, "cka_linear").values())
    own_verdicts = set(_beyond_by_hand(shared, own_seeds, "cka_linear").values())
    assert ood_verdicts == {True, None} and False in own_verdicts  # rte: 1 seed; own: seeds too far apart to tell
    assert "measured on the out-of-domain corpus" in page and "each task is measured on its own dev data" in page
    assert not (t / "own_study_task_differences.parquet").exists() and (t / "study_task_differences_ood.parquet").exists()
    # the verdicts are in the page: the similarity table per corpus, and the counts per corpus
    rows = [[c.strip() for c in re.findall(r"<td[^>]*>([^<]*)</td>", r)] for r in
            re.findall(r"<tr>(.*?)</tr>", page.split('aria-label="Representation similarity"')[1].split("</table>")[0], re.S)]
    ood_rows = [r for r in rows if r and r[0] == "out-of-domain corpus" and r[2] == "linear CKA"]
    assert {(r[1], int(r[3])): r[-1] for r in ood_rows} == {
        k: {True: "beyond noise", None: "no estimate"}[v] for k, v in _beyond_by_hand(ood, seeds, "cka_linear").items()}
    counts = pd.read_parquet(t / "study_counts_ood.parquet").query("metric == 'cka_linear' and task == 'sst2'")
    assert int(counts["n_beyond"].iloc[0]) == int(counts["n_tested"].iloc[0]) == shared["layer_base"].nunique()
    assert "own dev data" in page.split('id="noise"')[1].split('id="attention"')[0]
    # the overview links the own-data pair reports and says what "auto" became
    links = re.findall(r'<a class="own-pair-report" href="([^"]+)">([^<]+)</a>', page)
    assert links == [(p["report"], p["tuned"]) for p in manifest["own_pairs"]]
    assert "<td>classification (auto)</td>" in page and "<td>classification</td>" in page
