"""The same input gives the same numbers whatever else is selected: parsing plain text with spaCy (which
the word-level analyses trigger) must not change the tokens the models read (marker ``real``: spaCy)."""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest

from bertology.testing import save_tiny_family
from bertology.testing.tokenizers import tiny_tokenizer

sys.path.insert(0, str(Path(__file__).parents[1] / "integration"))
from cli_checks import invoke  # noqa: E402

pytestmark = [pytest.mark.real, pytest.mark.usefixtures("one_thread")]

TEXTS = [
    "The movie isn't just great, it's wonderful!",
    "I didn't like the plot; it was boring and far too long.",
    "She really liked the story, but he hated the ending.",
    "Nobody expected the ending to be so emotional and well-acted.",
    "We don't think they're coming, aren't they?",
    "A naïve critic ate crème brûlée at a café in Zürich.",
]


@pytest.mark.parametrize("model_type,kind", [("roberta", "bpe"), ("bert", "wordpiece"), ("xlm-roberta", "unigram")])
def test_streaming_tables_do_not_depend_on_the_analyses_list(tmp_path, model_type, kind):
    tok = tiny_tokenizer(kind, tmp_path / "tok")
    base = save_tiny_family(tmp_path / "base", model_type, tokenizer=tok, initializer_range=0.3)
    tuned = save_tiny_family(tmp_path / "tuned", model_type, tokenizer=tok, seed=1, initializer_range=0.3)
    data = tmp_path / "data.txt"
    data.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    tables = {}
    for name, analyses in (("plain", "attention_change,representation_similarity"),
                           ("parsed", "attention_change,representation_similarity,attention_targets")):
        out = tmp_path / name
        result = invoke("compare", "--base", base, "--tuned", tuned, "--data", data, "--out", out, "--no-report",
                        "--analyses", analyses, "--rsa-tokens", 50)
        assert result.exit_code == 0, result.output
        tables[name] = {t: pd.read_parquet(out / "tables" / f"{t}.parquet")
                        for t in ("attention_change", "representation_similarity")}
    assert (tmp_path / "parsed" / "tables" / "attention_targets.parquet").exists()  # spaCy did parse
    for t in ("attention_change", "representation_similarity"):
        pd.testing.assert_frame_equal(tables["plain"][t], tables["parsed"][t], check_exact=True)
