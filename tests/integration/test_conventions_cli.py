"""``compare --conventions clark2019`` on a tiny model: Clark's conventions reach the analyses and the manifest,
an explicit flag wins over the preset, and a bad value is one clear error."""
import json

import pandas as pd

from cli_checks import assert_user_error, invoke  # noqa: E402

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
