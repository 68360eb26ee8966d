"""``compare`` with geometry and PCA views: tables, resume of the second table, report sections, flags."""
import pandas as pd
import pytest
from typer.testing import CliRunner

from bertology.cli import app
from bertology.config import CompareConfig, DataConfig
from bertology.errors import BertologyError
from bertology.commands.compare import compare
from bertology.testing import SENTENCES, tiny_bert_pair

runner = CliRunner()


@pytest.fixture(scope="module")
def pair_dirs(tmp_path_factory):
    return tiny_bert_pair(tmp_path_factory.mktemp("pair"), planted=(2, 1))


@pytest.fixture()
def data(tmp_path):
    path = tmp_path / "s.txt"
    path.write_text("\n".join(SENTENCES * 3) + "\n", encoding="utf-8")
    return path


def _config(pair_dirs, data, out, **kw):
    base, tuned = pair_dirs
    return CompareConfig(base=str(base), tuned=str(tuned), data=DataConfig(path=str(data)), out=str(out),
                         analyses=("geometry", "pca_views"), view_examples=0, geometry_pairs=20,
                         geometry_min_contexts=2, **kw)


def test_geometry_and_pca_views_in_compare_and_report(pair_dirs, data, tmp_path):
    run = compare(_config(pair_dirs, data, tmp_path / "run", pca_examples=(0, 3)))
    g = run.table("geometry")
    assert {"model", "layer", "metric", "value", "n"} <= set(g.columns)
    assert set(g["layer"]) == {0, 1, 2} and set(g["model"]) == {"base", "tuned"}
    # every sentence occurs three times, so many words have several contexts
    assert (g[g["metric"] == "self_similarity"]["n"] > 0).all()
    # layer 0 and layer 1 are untouched by a perturbation planted in layer 2
    aniso = g[g["metric"] == "anisotropy"].pivot_table(index="layer", columns="model", values="value")
    assert aniso.loc[0, "base"] == pytest.approx(aniso.loc[0, "tuned"])
    assert aniso.loc[1, "base"] == pytest.approx(aniso.loc[1, "tuned"])
    assert "geometry_words" in run.results
    p = run.table("pca_views")
    assert set(p["example"]) == {0, 3} and set(p["fit"]) == {"per_layer", "shared"}
    html = run.report.read_text(encoding="utf-8")
    assert 'id="geometry"' in html and 'id="pca-views"' in html and "fig-geometry" in html

    again = compare(_config(pair_dirs, data, tmp_path / "run", pca_examples=(0, 3)))
    assert {"geometry", "pca_views"} <= set(again.resumed)
    pd.testing.assert_frame_equal(again.table("geometry_words"), run.table("geometry_words"), check_dtype=False)


def test_pca_examples_outside_the_corpus_are_refused(pair_dirs, data, tmp_path):
    with pytest.raises(BertologyError, match="not in the corpus"):
        compare(_config(pair_dirs, data, tmp_path / "run", pca_examples=(0, 999)))


def test_cli_pca_examples_flag(pair_dirs, data, tmp_path):
    base, tuned = pair_dirs
    args = ["compare", "--base", str(base), "--tuned", str(tuned), "--data", str(data), "--analyses", "geometry,pca_views",
            "--geometry-pairs", "10", "--view-examples", "0", "--no-report"]
    ok = runner.invoke(app, args + ["--out", str(tmp_path / "a"), "--pca-examples", "3"])
    assert ok.exit_code == 0, ok.output
    assert pd.read_parquet(tmp_path / "a/tables/pca_views.parquet")["example"].nunique() == 3
    assert "anisotropy by layer" in " ".join(ok.output.split())
    bad = runner.invoke(app, args + ["--out", str(tmp_path / "b"), "--pca-examples", "a,b"])
    assert bad.exit_code == 2 and "--pca-examples (pca_examples) takes a count" in " ".join(bad.output.split())


def test_out_of_domain_similarity_beside_the_task_data(pair_dirs, data, tmp_path):
    base, tuned = pair_dirs
    ood = tmp_path / "ood.txt"
    ood.write_text("colourless green ideas sleep furiously .\nthe stock market fell sharply on monday .\n" * 4, encoding="utf-8")
    config = CompareConfig(base=str(base), tuned=str(tuned), data=DataConfig(path=str(data)), out=str(tmp_path / "run"),
                           analyses=("representation_similarity",), view_examples=0, rsa_tokens=40, ood_data=str(ood))
    run = compare(config)
    t = run.table("representation_similarity_ood")
    assert set(t["domain"]) == {"out"} and set(t["metric"]) >= {"cka_linear", "rsa_pearson"}
    same = t[(t["layer_base"] == t["layer_tuned"]) & (t["metric"] == "cka_linear")].set_index("layer_base")["value"]
    # the planted head is in layer 2: layers 0 and 1 are identical on any corpus
    assert same[0] == pytest.approx(1.0) and same[1] == pytest.approx(1.0) and same[2] < 1.0
    ind = run.table("representation_similarity")
    ind = ind[(ind["layer_base"] == ind["layer_tuned"]) & (ind["metric"] == "cka_linear")].set_index("layer_base")["value"]
    assert same[2] != ind[2]  # computed on the other corpus's tokens
    assert run.manifest["ood_data"]["n_examples"] == 8
    html = run.report.read_text(encoding="utf-8")
    assert "fig-similarity_domains" in html and "out of domain" in html
    # another out-of-domain corpus is another run: refused without --overwrite
    ood.write_text("a different corpus entirely .\n" * 5, encoding="utf-8")
    with pytest.raises(BertologyError, match="another run|overwrite"):
        compare(config)
