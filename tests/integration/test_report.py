"""The offline HTML report: structure, escaping, no network assets, figures, and a real browser."""
from __future__ import annotations

import json
import os
import re
import shutil
from contextlib import contextmanager
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bertology.errors import BertologyError
from bertology.report.render import Report, render_report
from bertology.viz.figures import figure_to_svg, head_heatmap, layer_curve, layer_matrix, training_curve

EVIL = "</script><b>x</b>"
N_LAYERS, N_HEADS = 4, 6
SECTIONS = ("overview", "attention-change", "representation-similarity", "finetune")
FIGURES = (
    "attention_cosine",
    "attention_js",
    "attention_by_layer",
    "similarity_same_layer",
    "similarity_matrix_cka_linear",
    "similarity_matrix_rsa_pearson",
    "finetune_curves",
)
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-quic",
    "--no-first-run",
    "--disable-component-update",
    "--disable-sync",
]


# ------------------------------------------------------------------------------------ fake run dirs
def _write_table(run: Path, name: str, df: pd.DataFrame) -> None:
    (run / "tables").mkdir(parents=True, exist_ok=True)
    df.to_parquet(run / "tables" / f"{name}.parquet", index=False)
    df.to_csv(run / "tables" / f"{name}.csv", index=False)


def attention_table(seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for layer in range(1, N_LAYERS + 1):
        for head in range(N_HEADS):
            change = (layer / N_LAYERS) ** 2 * rng.uniform(0.1, 0.6)
            rows.append(dict(layer=layer, head=head, cosine=1 - change, js_divergence=0.4 * change,
                             n_examples=64, cosine_std=0.02, mode="cropped"))
    # a planted, clearly most-changed head
    rows[(3 - 1) * N_HEADS + 2].update(cosine=0.2, js_divergence=0.9)
    return pd.DataFrame(rows)


def similarity_table() -> pd.DataFrame:
    rows = []
    for k, metric in zip((0.3, 0.45, 0.5, 0.6), ("cka_linear", "cka_debiased", "rsa_pearson", "rsa_spearman")):
        for a in range(N_LAYERS + 1):
            for b in range(N_LAYERS + 1):
                same = 1 - k * (max(a, b) / N_LAYERS) ** 2
                value = np.exp(-abs(a - b) / 3) * (same if a == b else 0.9)
                rows.append(dict(layer_base=a, layer_tuned=b, metric=metric, value=value,
                                 n_tokens=1234, seed=7))
    return pd.DataFrame(rows)


def finetune_table() -> pd.DataFrame:
    rows = []
    for step in range(0, 201, 20):
        rows.append(dict(step=step, epoch=step / 100, split="train", metric="loss", value=0.7 * np.exp(-step / 80)))
        if step % 40 == 0:
            loss = 0.75 * np.exp(-step / 100)
            rows.append(dict(step=step, epoch=step / 100, split="eval", metric="loss", value=loss))
            rows.append(dict(step=step, epoch=step / 100, split="eval", metric="accuracy", value=0.5 + step / 500))
            rows.append(dict(step=step, epoch=step / 100, split="eval", metric="macro_f1", value=0.45 + step / 500))
    return pd.DataFrame(rows)


def manifest() -> dict:
    model = dict(model_type="bert", num_hidden_layers=N_LAYERS, num_attention_heads=N_HEADS, hidden_size=32)
    return {
        "bertology_version": "0.1.0",
        "created": "2026-01-01T00:00:00+00:00",
        "command": f"bertology compare --base tiny --tuned 'x{EVIL}'",
        "config": {"attention_mode": "cropped", "data": {"path": f"corpus{EVIL}.txt", "max_length": 64}},
        "models": {
            "base": {"name": f"tiny-base{EVIL}", "path": "/models/base", "weights_sha256": "a" * 64, **model},
            "tuned": {"name": "tiny-tuned", "path": f"/models/{EVIL}", "weights_sha256": "b" * 64, **model},
        },
        "data": {
            "name": f"sentences{EVIL}",
            "source": "corpus.txt",
            "n_examples": 70,
            "sha256": "c" * 64,
            "encoding": {"max_length": 64, "n_kept": 64, "n_skipped_overlong": 5, "n_truncated": 1, "n_tokens": 900},
        },
        "seed": 7,
        "device": "cpu",
        "dtype": "float32",
        "packages": {"torch": "2.13.0", "python": "3.11"},
        "tables": ["attention_change", "representation_similarity", "finetune"],
        "warnings": [f"5 examples were skipped {EVIL}"],
        "summary": {"heldout_accuracy": 0.875, "note": EVIL},
    }


def make_run(run: Path, *, tables=("attention_change", "representation_similarity", "finetune")) -> Path:
    run.mkdir(parents=True, exist_ok=True)
    (run / "manifest.json").write_text(json.dumps(manifest(), indent=2), encoding="utf-8")
    builders = {"attention_change": attention_table, "representation_similarity": similarity_table,
                "finetune": finetune_table}
    for name in tables:
        _write_table(run, name, builders[name]())
    return run


class Page(HTMLParser):
    """Collects the structure we assert on, using only the standard library."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.section_ids: list[str] = []
        self.section_h2: dict[str, str] = {}
        self.section_lede: dict[str, str] = {}
        self._section: str | None = None
        self._capture: str | None = None
        self._buf: list[str] = []
        self.script_bodies: list[tuple[dict, str]] = []
        self._script: dict | None = None
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        if tag == "section":
            self._section = a.get("id")
            self.section_ids.append(a.get("id"))
        elif tag == "h2" and self._section:
            self._capture, self._buf = "h2", []
        elif tag == "p" and self._section and "lede" in (a.get("class") or "").split():
            self._capture, self._buf = "p", []
        elif tag == "script":
            self._script, self._buf = a, []

    def handle_endtag(self, tag):
        if tag == "section":
            self._section = None
        elif tag in ("h2", "p") and self._capture == tag:
            target = self.section_h2 if tag == "h2" else self.section_lede
            target[self._section] = "".join(self._buf).strip()
            self._capture = None
        elif tag == "script" and self._script is not None:
            self.script_bodies.append((self._script, "".join(self._buf)))
            self._script = None

    def handle_data(self, data):
        if self._capture or self._script is not None:
            self._buf.append(data)
        self.text.append(data)


def parse(html: str) -> Page:
    page = Page()
    page.feed(html)
    page.close()
    return page


@pytest.fixture(scope="module")
def full_run(tmp_path_factory) -> tuple[Path, str]:
    run = make_run(tmp_path_factory.mktemp("run") / "out")
    path = render_report(run)
    return run, path.read_text(encoding="utf-8")


# -------------------------------------------------------------------------------------------- tests
def test_report_has_all_sections_with_heading_and_explanation(full_run):
    run, html = full_run
    assert (run / "report.html").is_file()
    assert html.lstrip().startswith("<!DOCTYPE html>")
    page = parse(html)
    assert page.section_ids == list(SECTIONS)
    for sid in SECTIONS:
        assert page.section_h2.get(sid), f"section {sid} has no h2"
        lede = page.section_lede.get(sid, "")
        assert lede.count(". ") >= 1 and lede.endswith("."), f"section {sid} lacks its explanation"
    # the table of contents links every section
    hrefs = {a.get("href") for t, a in page.tags if t == "a"}
    assert {f"#{s}" for s in SECTIONS} <= hrefs


def test_report_references_nothing_on_the_network(full_run):
    _, html = full_run
    page = parse(html)
    for tag, attrs in page.tags:
        for name, value in attrs.items():
            if name in ("src", "href", "xlink:href", "action", "poster", "data", "srcset"):
                assert not re.match(r"\s*(https?:)?//", value or "", re.I), f"<{tag} {name}={value!r}>"
        if tag == "script":
            assert "src" not in attrs, "scripts must be inline"
        if tag == "link":
            assert attrs.get("rel") != "stylesheet", "styles must be inline"
    assert not re.search(r"url\(\s*['\"]?(https?:)?//", html, re.I)
    assert "@import" not in html
    # the only http(s) strings allowed are XML namespace names on inline SVGs
    leftovers = re.sub(r'xmlns(:\w+)?="http://www\.w3\.org/[^"]*"', "", html)
    assert "http://" not in leftovers and "https://" not in leftovers


def test_data_strings_are_escaped_everywhere(full_run):
    _, html = full_run
    assert EVIL not in html
    assert "</script><b>" not in html
    assert "&lt;/script&gt;&lt;b&gt;x&lt;/b&gt;" in html
    page = parse(html)
    assert not [t for t, _ in page.tags if t == "b"], "a data string was injected as markup"
    assert sum(t == "script" for t, _ in page.tags) == 2  # the JSON island and our inline script
    # The JSON island escapes <, > and & and round-trips.
    (attrs, body), = [(a, b) for a, b in page.script_bodies if a.get("type") == "application/json"]
    assert "<" not in body and ">" not in body
    assert "\\u003c/script\\u003e" in body
    data = json.loads(body)
    assert data["models"]["base"]["name"] == f"tiny-base{EVIL}"
    # the escaped name is visible as text (title, model table, warnings)
    text = "".join(page.text)
    assert f"tiny-base{EVIL}" in text
    assert f"5 examples were skipped {EVIL}" in text


def test_figures_are_inlined_and_written(full_run):
    run, html = full_run
    written = sorted(p.stem for p in (run / "figures").glob("*.svg"))
    assert written == sorted(FIGURES)
    for name in FIGURES:
        svg = (run / "figures" / f"{name}.svg").read_text(encoding="utf-8")
        assert "<svg" in svg and svg.rstrip().endswith("</svg>")
        assert "DejaVuSans-" not in svg, "glyphs were embedded; svg.fonttype should be 'none'"
        assert f'id="{name}-' in svg  # ids are namespaced per figure
        assert len(svg) < 150_000
        assert f'id="fig-{name}"' in html
    assert html.count("<svg") == len(FIGURES)
    assert "<?xml" not in html and "<!DOCTYPE svg" not in html
    ids = re.findall(r'\sid="([^"]+)"', html)
    assert len(ids) == len(set(ids)), "duplicate element ids across inlined SVGs"


def test_report_content_numbers(full_run):
    run, html = full_run
    page = parse(html)
    text = " ".join(" ".join(page.text).split())
    # top-10 table with L{layer}H{head} labels; the planted head ranks first
    table = html[html.index('aria-label="Top ten most changed attention heads"'):]
    top = re.findall(r">(L\d+H\d+)<", table[: table.index("</table>")])
    assert top[0] == "L3H2" and len(top) == 10
    # provenance: skipped / truncated counts, seed and n_tokens of the similarity analysis
    assert "Skipped (over-long)" in text and "Truncated" in text
    assert "Tokens compared 1,234" in text and "Seed 7" in text
    # the summary's held-out accuracy and the fine-tuning section's last evaluation differ here: both are shown,
    # the summary's named as such; the section's card has the person's label, not "Final eval"/"Heldout"
    assert "Held-out accuracy (run summary) 0.875" in text and "Held-out accuracy 0.9 step 200" in text
    assert "Heldout" not in text and "Final eval" not in text
    assert not list(run.glob(".*.tmp")) and not list((run / "figures").glob(".*.tmp"))


def test_absent_tables_omit_their_sections(tmp_path):
    run = make_run(tmp_path / "run", tables=("attention_change",))
    page = parse(render_report(run).read_text(encoding="utf-8"))
    assert page.section_ids == ["overview", "attention-change"]
    assert sorted(p.stem for p in (run / "figures").glob("*.svg")) == [
        "attention_by_layer", "attention_cosine", "attention_js"]


def test_malformed_table_becomes_a_warning_not_a_crash(tmp_path):
    run = make_run(tmp_path / "run", tables=("attention_change",))
    _write_table(run, "representation_similarity", similarity_table().drop(columns=["value"]))
    (run / "manifest.json").unlink()  # tolerated: the report says so
    html = render_report(run).read_text(encoding="utf-8")
    page = parse(html)
    assert page.section_ids == ["overview", "attention-change"]
    assert "lacks column(s) value" in html
    assert "manifest.json is missing" in html


def test_not_a_run_directory_is_a_clear_error(tmp_path):
    with pytest.raises(BertologyError, match="does not exist"):
        render_report(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BertologyError, match="neither manifest.json nor tables"):
        render_report(tmp_path / "empty")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "manifest.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(BertologyError, match="not valid JSON"):
        render_report(tmp_path / "bad")


def test_report_object_repr_html(tmp_path):
    run = make_run(tmp_path / "run", tables=("attention_change",))
    rep = Report(run)
    assert rep.path == run / "report.html"
    html = rep.html()  # renders on first use
    assert rep.path.exists() and html.startswith("<!DOCTYPE html>")
    frame = rep._repr_html_()
    assert frame.startswith("<iframe") and "srcdoc=" in frame
    assert EVIL not in frame and "<b>" not in frame


def test_figure_functions_return_figures():
    att = attention_table()
    fig = head_heatmap(att, "cosine")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == [str(i) for i in range(1, N_LAYERS + 1)]
    assert ax.get_ylim()[0] > ax.get_ylim()[1]  # layer 1 drawn on top
    assert [t.get_text() for t in ax.get_xticklabels()] == [str(h) for h in range(N_HEADS)]
    assert len(fig.axes) == 2 and fig.axes[1].get_ylabel()  # labelled colour bar
    svg = figure_to_svg(fig, id_prefix="t")
    assert svg.startswith("<?xml") and "<text" in svg and "DejaVuSans-" not in svg
    assert figure_to_svg(head_heatmap(att, "cosine"), id_prefix="t") == svg  # deterministic
    sim = similarity_table()
    diag = sim[sim.layer_base == sim.layer_tuned].rename(columns={"layer_base": "layer"})
    for fig in (
        layer_curve(diag, hue="metric"),
        layer_matrix(sim, "cka_linear"),
        training_curve(finetune_table()),
    ):
        assert "<svg" in figure_to_svg(fig, standalone=False)[:200]
    with pytest.raises(ValueError, match="metric"):
        layer_matrix(sim, "nope")


# ------------------------------------------------------------------------------------------ browser
def _unavailable(reason: str):
    """Skip locally; in CI (CI=true) a missing browser is a failure, not a silent skip."""
    if os.environ.get("CI", "").strip().lower() == "true":
        pytest.fail(f"browser test cannot run in CI: {reason}")
    pytest.skip(reason)


def _chromium_path() -> str | None:
    for candidate in (os.environ.get("BERTOLOGY_CHROMIUM"), shutil.which("chromium"),
                      shutil.which("chromium-browser"), "/usr/bin/chromium"):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


@contextmanager
def chromium_page(path: Path):
    """Open ``path`` in headless Chromium; yield ``(page, errors)``.

    ``errors`` collects console errors, page errors and every request that leaves the local file (the
    report must work offline). Skips when no browser can run locally, fails in CI (:func:`_unavailable`).
    """
    try:
        from playwright.sync_api import Error as PlaywrightError
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("Python playwright is not installed (pip install playwright)")
    chromium = _chromium_path()
    if chromium is None:
        _unavailable("no Chromium executable found (apt-get install chromium, or set BERTOLOGY_CHROMIUM)")
    errors: list[str] = []
    with sync_playwright() as pw:
        try:
            browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS, headless=True)
        except PlaywrightError as err:
            _unavailable(f"Chromium at {chromium} could not be launched: {err}")
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("console", lambda m: errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
            page.on("request", lambda r: errors.append(f"network request: {r.url}")
                    if not r.url.startswith(("file:", "data:")) else None)
            page.goto(Path(path).resolve().as_uri(), wait_until="load")
            yield page, errors
        finally:
            browser.close()


@pytest.mark.browser
def test_report_in_headless_chromium(full_run, tmp_path):
    run, _ = full_run
    with chromium_page(run / "report.html") as (page, errors):
        assert page.eval_on_selector_all("main > section", "els => els.map(e => e.id)") == list(SECTIONS)
        assert page.locator("section svg").count() == len(FIGURES)
        assert page.locator("b").count() == 0  # the malicious model name stayed text
        assert EVIL in page.inner_text("h1")

        # Sorting: click the JS divergence header of the top-heads table twice.
        table = page.locator("#attention-change table.sortable")
        header = table.locator("thead th", has_text="JS divergence")
        first = table.locator("tbody tr").first.locator("td").nth(1)
        assert first.inner_text() == "L3H2"  # ranked by JS, descending
        header.click()
        assert header.get_attribute("aria-sort") == "ascending"
        assert first.inner_text() != "L3H2"  # the DOM was re-ordered
        header.click()
        assert header.get_attribute("aria-sort") == "descending"
        assert first.inner_text() == "L3H2"

        # The table of contents navigates within the page.
        page.click("nav.toc a[href='#finetune']")
        page.wait_for_function("location.hash === '#finetune'")

        shot = tmp_path / "report.png"
        page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 10_000
    assert errors == [], errors


def test_an_interrupted_compare_says_so_at_the_top_of_its_report_and_card(tmp_path, monkeypatch):
    """Ctrl-C after the streaming analyses: the report of the folder names the experiment that is missing, and the
    notebook card says the run did not finish; a finished run has no banner."""
    import bertology as bt
    import bertology.commands.compare as pipeline
    from bertology.report.rerender import rerender
    from bertology.testing import SENTENCES, tiny_bert_pair

    base, tuned = tiny_bert_pair(tmp_path / "pair", classifier=True)
    data = pd.DataFrame({"text": SENTENCES, "label": [i % 2 for i in range(len(SENTENCES))]})

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "_experiment", interrupted)
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        bt.compare(str(base), str(tuned), data, out=out, analyses=["attention_change", "ablation"],
                   ablation_bootstrap=10, view_examples=0)
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["status"] == "interrupted" and "ablation" in manifest["planned"]
    html = rerender(out).read_text(encoding="utf-8")
    top = html[html.index('<section id="overview"'):html.index('class="cards"') if 'class="cards"' in html else None]
    assert "This run did not finish" in top and "Missing: ablation." in " ".join(top.split())
    assert "did not finish" in bt.load_run(out)._repr_html_()
    monkeypatch.undo()
    done = bt.compare(str(base), str(tuned), data, out=out, analyses=["attention_change", "ablation"],
                      ablation_bootstrap=10, view_examples=0)  # the same command finishes it
    assert "did not finish" not in rerender(out).read_text(encoding="utf-8") and "did not finish" not in done._repr_html_()
