"""The attention viewer's data (shapes, rows, segments, diff), its escaping, and the ``view`` command."""
from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from transformers import BertTokenizer
from typer.testing import CliRunner

from bertology.cli import app
from bertology.errors import BertologyError
from bertology.models.loading import load_model
from bertology.testing import save_tiny_bert, tiny_vocab
from bertology.activations import views
from bertology.activations.views import compute_view
from bertology.viz import viewer
from bertology.viz.viewer import AttentionView, json_for_script, render_fragment, render_page

EVIL = "</script><script>alert(1)</script>"
TEXT, PAIR = "the cat sat on the mat .", "a dog ran fast ."
runner = CliRunner()


class Scripts(HTMLParser):
    """Tags and script bodies, as a browser's tokenizer would split them."""

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.scripts: list[tuple[dict, str]] = []
        self._open: dict | None = None
        self._buf: list[str] = []
        self.feed(html)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag == "script":
            self._open, self._buf = dict(attrs), []

    def handle_endtag(self, tag):
        if tag == "script" and self._open is not None:
            self.scripts.append((self._open, "".join(self._buf)))
            self._open = None

    def handle_data(self, data):
        if self._open is not None:
            self._buf.append(data)


@pytest.fixture(scope="module")
def planted(planted_pair):
    return [load_model(str(p)) for p in planted_pair]


@pytest.fixture(scope="module")
def identical(identical_pair):
    return [load_model(str(p)) for p in identical_pair]


@pytest.fixture(scope="module")
def pair_view(planted) -> dict:
    return compute_view(planted, TEXT, PAIR)


def test_shapes_rows_and_labels(pair_view, planted):
    v = pair_view
    n = len(v["tokens"])
    assert v["tokens"][0] == "[CLS]" and v["tokens"][-1] == "[SEP]" and n == 1 + 7 + 1 + 5 + 1
    assert (v["n_layers"], v["n_heads"]) == (2, 4) and v["layers"] == [1, 2]
    assert [m["name"] for m in v["models"]] == ["base", "tuned"]
    assert v["models"][1]["model"] == planted[1].name
    for name in ("base", "tuned"):
        att = np.asarray(v["attention"][name])
        assert att.shape == (2, 4, n, n)
        np.testing.assert_allclose(att.sum(-1), 1.0, atol=n * 0.5e-4)  # rows sum to 1 up to rounding
        assert np.all(np.round(att, 4) == att)
    # sentence A/B: [CLS] A [SEP] are segment 0, B [SEP] segment 1; specials flagged
    first_sep = v["tokens"].index("[SEP]")
    assert v["segments"] == [0] * (first_sep + 1) + [1] * (n - first_sep - 1)
    assert [i for i, s in enumerate(v["special"]) if s] == [0, first_sep, n - 1]


def test_view_round_trips_through_json(pair_view, tmp_path):
    assert json.loads(json.dumps(pair_view)) == pair_view
    view = AttentionView(pair_view)
    path = view.save(tmp_path / "views" / "one.json")
    assert AttentionView.load(path).data == pair_view
    assert not list(path.parent.glob(".*.tmp"))
    np.testing.assert_array_equal(AttentionView.load(path).diff(), view.diff())


def test_single_model_and_attention_matches_a_direct_forward(planted):
    import torch

    base = planted[0]
    v = AttentionView(compute_view(base, TEXT))
    assert v.names == ["base"] and v.data["text_pair"] is None and set(v.data["segments"]) == {0}
    enc = base.tokenizer(TEXT, return_tensors="pt")
    with torch.inference_mode():
        out = base.model(**enc, output_attentions=True)
    direct = torch.stack([a[0] for a in out.attentions]).numpy()
    np.testing.assert_allclose(v.attention(), direct, atol=0.5e-4 + 1e-7)
    with pytest.raises(BertologyError, match="one model"):
        v.diff()


def test_diff_is_zero_for_identical_and_only_at_the_planted_head(identical, planted):
    assert not np.any(AttentionView(compute_view(identical, TEXT, PAIR)).diff())
    diff = np.abs(AttentionView(compute_view(planted, TEXT, PAIR)).diff()).max(axis=(2, 3))
    assert diff[1, 1] > 0.01  # layer 2 (index 1), head 1
    diff[1, 1] = 0
    assert not np.any(diff)


def test_refuses_mismatched_tokenizers_shapes_and_long_texts(planted, tmp_path):
    cased = save_tiny_bert(tmp_path / "cased")
    BertTokenizer(vocab=tiny_vocab(), do_lower_case=False).save_pretrained(cased)
    with pytest.raises(BertologyError, match="tokenise the text differently"):
        compute_view([planted[0], load_model(str(cased))], "The cat sat .")
    deeper = load_model(str(save_tiny_bert(tmp_path / "deep", num_hidden_layers=3)))
    with pytest.raises(BertologyError, match=r"differ in shape \(base: 2 layers x 4 heads, tuned: 3 x 4\)"):
        compute_view([planted[0], deeper], TEXT)
    with pytest.raises(BertologyError, match="9 tokens long.*maximum of 5"):
        compute_view(planted[0], TEXT, max_length=5)
    with pytest.raises(BertologyError, match="empty"):
        compute_view(planted[0], "  ")
    with pytest.raises(BertologyError, match="distinct"):
        compute_view(planted, TEXT, names=("a", "a"))


def test_json_for_script_cannot_break_out():
    data = {"tokens": [EVIL, "a & b", "x\u2028y"], "text": "<!-- -->"}
    text = json_for_script(data)
    assert not set("<>&\u2028\u2029") & set(text)
    assert "\\u003c/script\\u003e" in text
    assert json.loads(text) == data


def test_fragment_escapes_every_data_string(pair_view, planted):
    evil = dict(pair_view, text=EVIL, text_pair=EVIL, tokens=[EVIL] + pair_view["tokens"][1:],
                models=[{"name": "base", "model": EVIL}, pair_view["models"][1]])
    for html in (render_fragment(evil, "v1"), render_page(evil, title=EVIL)):
        assert EVIL not in html and "<script>alert" not in html
        page = Scripts(html)
        assert [t for t, _ in page.tags].count("script") == 2  # the JSON island and the viewer script
        (island,) = [body for attrs, body in page.scripts if attrs.get("type") == "application/json"]
        assert island.startswith("{") and json.loads(island) == evil
    # the real tokenizer path: the text is stored verbatim (its tokens become [UNK]) and still escaped
    real = compute_view(planted[0], f"the cat {EVIL}")
    assert real["text"].endswith(EVIL) and "[UNK]" in real["tokens"]
    html = render_fragment(real, "v2")
    assert EVIL not in html and [t for t, _ in Scripts(html).tags].count("script") == 2


def test_fragments_are_namespaced_and_self_contained(pair_view):
    one, two = render_fragment(pair_view, "view-a"), render_fragment(pair_view, "view-b")
    for frag, eid in ((one, "view-a"), (two, "view-b")):
        assert f'<div class="bv" id="{eid}"' in frag and f'id="{eid}-data"' in frag
        assert f'window.BertologyViewer.mount("{eid}")' in frag
    assert "if (window.BertologyViewer) { return; }" in one  # the library is defined once per page
    with pytest.raises(ValueError, match="element_id"):
        render_fragment(pair_view, 'x" onload="alert(1)')
    with pytest.raises(BertologyError, match="Not an attention view"):
        render_fragment({"tokens": []}, "x")
    frags = {AttentionView(pair_view)._repr_html_() for _ in range(2)}
    ids = {re.search(r'id="(bertology-view-[0-9a-f]+)"', f).group(1) for f in frags}
    assert len(ids) == 2  # notebooks: each display gets its own id


def test_assets_are_offline_and_page_uses_the_report_csp(pair_view):
    js, css = viewer._asset("viewer.js"), viewer._asset("viewer.css")
    for src in (js, css):
        assert not re.search(r"https?:|//cdn|@import|url\(", src, re.I)
        assert "</script" not in src.lower() and "</style" not in src.lower() and "<!--" not in src
    assert not re.search(r"\beval\s*\(|new Function|setTimeout\(\s*['\"]", js)
    template = Path(viewer.__file__).parents[1] / "report" / "templates" / "report.html.j2"
    report_csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', template.read_text()).group(1)
    page = render_page(pair_view)
    assert f'content="{report_csp}"' in page and page.startswith("<!DOCTYPE html>")
    assert "http://" not in page and "https://" not in page


# ---------------------------------------------------------------------------------------------- CLI
def test_cli_view_writes_a_page(planted_pair, tmp_path):
    base, tuned = planted_pair
    out = tmp_path / "sub" / "view.html"
    result = runner.invoke(app, ["view", "--model", str(base), "--compare", str(tuned), TEXT, PAIR, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == str(out)
    html = out.read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html>") and 'data-bertology-view="1"' in html
    data = json.loads(Scripts(html).scripts[0][1])
    assert data["text_pair"] == PAIR and [m["model"] for m in data["models"]] == [str(base), str(tuned)]
    result = runner.invoke(app, ["view", "--model", str(base), TEXT, "--out", str(tmp_path / "v.json")])
    assert result.exit_code == 0 and AttentionView.load(tmp_path / "v.json").names == ["base"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "./no/such/model"], "does not exist"),
        (["--max-length", "4"], "more than the maximum of 4"),
    ],
)
def test_cli_view_user_errors_are_one_line(planted_pair, tmp_path, args, message):
    if args[0] == "--max-length":
        args = ["--model", str(planted_pair[0])] + args
    out = tmp_path / "view.html"
    result = runner.invoke(app, ["view", *args, TEXT, "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "error:" in result.output
    assert message in " ".join(result.output.split())
    assert len(result.output.strip().splitlines()) <= 2  # one message (rich may soft-wrap it once)
    assert not out.exists()


def test_segments_without_token_type_ids():
    """RoBERTa-style pairs (<s> A </s></s> B </s>) carry no token_type_ids: B starts after A's specials."""
    enc = {"input_ids": list(range(8)), "special_tokens_mask": [1, 0, 0, 1, 1, 0, 0, 1]}
    assert views._segments(enc, paired=True) == [0, 0, 0, 0, 0, 1, 1, 1]
    assert views._segments(enc, paired=False) == [0] * 8
