"""The conventions on the command line: ``bertology probe --conventions hewitt2019`` and ``bertology compare
--conventions kovaleva2019`` record every convention (value, source, tables) in the manifest, and the
report lists them in its conventions block; ``compare --conventions clark2019`` reaches the analyses, an
explicit flag wins over the preset, and a bad value is one clear error."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from bertology.conventions import CONVENTIONS
from cli_checks import assert_user_error, invoke  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

# id, form, upos, xpos, head, deprel: a HYPH word (UPOS PUNCT, not in Hewitt's list) and a '.'
SENTENCE = [("i", "PRON", "PRP", 4, "nsubj"), ("did", "AUX", "VBD", 4, "aux"), ("not", "PART", "RB", 4, "neg"),
            ("like", "VERB", "VB", 0, "root"), ("the", "DET", "DT", 8, "det"), ("well", "ADV", "RB", 8, "advmod"),
            ("-", "PUNCT", "HYPH", 8, "punct"), ("movie", "NOUN", "NN", 4, "dobj"), (".", "PUNCT", ".", 4, "punct")]


def _conllu(n: int) -> str:
    text = " ".join(w for w, *_ in SENTENCE)
    block = [f"# text = {text}"] + ["\t".join([str(i), w, w, u, x, "_", str(h), d, "_", "_"])
                                    for i, (w, u, x, h, d) in enumerate(SENTENCE, 1)]
    return "\n\n".join("\n".join(block) for _ in range(n)) + "\n\n"


def test_bertology_probe_accepts_and_records_the_preset(identical_pair, tmp_path):
    data = tmp_path / "gold.conllu"
    data.write_text(_conllu(6), encoding="utf-8")
    out = tmp_path / "run"
    result = invoke("probe", "--base", identical_pair[0], "--train", data, "--test", data, "--rank", 4, "--epochs", 1,
                    "--layers", "0", "--conventions", "hewitt2019", "--out", out)
    assert result.exit_code == 0, result.output
    m = json.loads((out / "manifest.json").read_text())
    record = m["conventions"]
    assert record["preset"] == "hewitt2019" and record["probe_punctuation"]["value"] == "hewitt2019"
    assert "Hewitt" in record["probe_punctuation"]["source"] and record["probe_punctuation"]["tables"] == ["probe"]
    assert m["config"]["punctuation"] == "hewitt2019" and "XPOS" in m["probe"]["punctuation"]
    html = (out / "report.html").read_text(encoding="utf-8")
    assert 'id="conventions"' in html and "Hewitt &amp; Manning 2019" in html
    explicit = invoke("probe", "--base", identical_pair[0], "--train", data, "--test", data, "--rank", 4, "--epochs", 1,
                      "--layers", "0", "--conventions", "hewitt2019", "--probe-punctuation", "upos",
                      "--out", tmp_path / "explicit", "--no-report")
    assert explicit.exit_code == 0, explicit.output
    assert json.loads((tmp_path / "explicit/manifest.json").read_text())["config"]["punctuation"] == "upos"


def test_compare_records_every_convention_and_the_report_lists_them(identical_pair, tmp_path):
    data = tmp_path / "gold.conllu"
    data.write_text(_conllu(3), encoding="utf-8")
    out = tmp_path / "run"
    result = invoke("compare", "--base", identical_pair[0], "--tuned", identical_pair[1], "--data", data,
                    "--analyses", "attention_targets", "--conventions", "kovaleva2019", "--out", out)
    assert result.exit_code == 0, result.output
    m = json.loads((out / "manifest.json").read_text())
    record = m["conventions"]
    assert record["preset"] == "kovaleva2019"
    assert {c.field for c in CONVENTIONS} <= set(record)  # every convention, whether the preset sets it or not
    assert record["word_categories"]["value"] == "kovaleva2019" and record["word_categories"]["tables"] == ["attention_targets"]
    assert m["analyses"]["attention_targets"]["word_categories"] == "kovaleva2019"
    html = (out / "report.html").read_text(encoding="utf-8")
    block = html[html.index('id="conventions"'):]
    block = block[: block.index("</section>") if "</section>" in block else len(block)]
    for conv in CONVENTIONS:  # a generic loop: each convention's field, value and tables
        assert f"<code>{conv.field}</code>" in block
        for table in conv.tables:
            assert table in block
    assert "Kovaleva et al. 2019" in block and "kovaleva2019" in block


# Two parsed sentences with multi-piece words ("cats", "reading", "books"), so relation heads have pairs.
CONLLU = """\
1\tthe\tthe\tDET\t_\t_\t2\tdet\t_\t_
2\tcats\tcat\tNOUN\t_\t_\t3\tnsubj\t_\t_
3\tsat\tsit\tVERB\t_\t_\t0\troot\t_\t_
4\t.\t.\tPUNCT\t_\t_\t3\tpunct\t_\t_

1\tjohn\tjohn\tPROPN\t_\t_\t2\tnsubj\t_\t_
2\tsaw\tsee\tVERB\t_\t_\t0\troot\t_\t_
3\tmary\tmary\tPROPN\t_\t_\t2\tobj\t_\t_
4\treading\tread\tVERB\t_\t_\t2\txcomp\t_\t_
5\tbooks\tbook\tNOUN\t_\t_\t4\tobj\t_\t_
6\t.\t.\tPUNCT\t_\t_\t2\tpunct\t_\t_
"""


def test_clark_preset_reaches_every_analysis_and_an_explicit_flag_wins(planted_pair, tmp_path):
    base, tuned = planted_pair
    data = tmp_path / "tiny.conllu"
    data.write_text(CONLLU, encoding="utf-8")
    out = tmp_path / "run"
    result = invoke("compare", "--base", base, "--tuned", tuned, "--data", data, "--out", out, "--no-report",
                    "--analyses", "attention_targets,relation_heads,head_map", "--relation-min-count", 1,
                    "--conventions", "clark2019", "--entropy-smoothing", "none")
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    conv = manifest["conventions"]
    assert conv["preset"] == "clark2019"
    assert conv["relation_word_attention"]["value"] == "clark2019" and "released code" in conv["relation_word_attention"]["source"]
    assert conv["head_map_distance"]["value"] == "clark2019"
    assert conv["entropy_smoothing"]["value"] == "none"  # the explicit flag wins over the preset
    assert manifest["config"]["relation_word_attention"] == "clark2019"
    head_map = pd.read_parquet(out / "tables" / "head_map.parquet")
    assert (head_map["distance"] == "clark2019").all()
    assert_user_error(invoke("compare", "--base", base, "--tuned", tuned, "--data", data, "--out", tmp_path / "o",
                             "--head-map-distance", "cosine"), "head_map_distance", "clark2019")
