"""The CLI on tiny models saved to a temp dir: outputs, resume, and one clear message per bad input."""
import json

import numpy as np
import pandas as pd
import pytest

from bertology.testing import SENTENCES, save_tiny_bert, tiny_vocab
from cli_checks import assert_user_error, invoke  # noqa: E402


ATTENTION_COLUMNS = {"layer", "head", "cosine", "js_divergence", "n_examples"}
SIMILARITY_COLUMNS = {"layer_base", "layer_tuned", "metric", "value", "n_tokens"}


@pytest.fixture()
def corpus_txt(tmp_path):
    path = tmp_path / "sentences.txt"
    path.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    return path


def test_compare_writes_tables_manifest_and_report(planted_pair, corpus_txt, tmp_path):
    base, tuned = planted_pair
    out = tmp_path / "run"
    result = invoke("compare", "--base", base, "--tuned", tuned, "--data", corpus_txt, "--out", out, "--rsa-tokens", 40)
    assert result.exit_code == 0, result.output
    att = pd.read_parquet(out / "tables/attention_change.parquet")
    sim = pd.read_parquet(out / "tables/representation_similarity.parquet")
    assert ATTENTION_COLUMNS <= set(att.columns) and SIMILARITY_COLUMNS <= set(sim.columns)
    assert set(sim.metric) == {"rsa_pearson", "rsa_spearman", "cka_linear", "cka_debiased"}
    assert pd.read_csv(out / "tables/attention_change.csv").shape == att.shape
    top = att.sort_values("cosine").iloc[0]
    assert (top["layer"], top["head"]) == (2, 1)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["models"]["base"]["weights_sha256"] and manifest["data"]["n_examples"] == len(SENTENCES)
    assert manifest["seed"] == 0 and manifest["attn_implementation"] == "eager"
    # what each streamed analysis cost: its updates over the pass and its compute, beside the forward passes
    timings = manifest["timings"]
    assert {"attention_change", "representation_similarity"} <= set(timings["analyses"]) <= set(manifest["analyses"])
    assert all(set(t) == {"update_s", "compute_s"} and min(t.values()) >= 0 for t in timings["analyses"].values())
    staged = timings["forward_s"] + sum(sum(t.values()) for t in timings["analyses"].values())
    assert 0 < staged <= manifest["wall_time_s"] + 0.01
    # what the run held at its peak: on the CPU the device is the host, so there is no device record
    memory = manifest["memory"]
    assert memory["device"] == "cpu" and not any(k.startswith("device_") for k in memory)
    if memory["host_peak_rss_mib"] is not None:  # Linux (/proc) or ru_maxrss
        assert memory["host_peak_rss_mib"] >= memory["host_rss_at_start_mib"] > 0
    assert (out / "report.html").exists()
    assert "L2H1" in result.output  # the summary names the most changed head


def test_model_compared_with_itself_gives_cka_one_and_cosine_one(identical_pair, corpus_txt, tmp_path):
    base, _ = identical_pair
    out = tmp_path / "self"
    result = invoke("compare", "--base", base, "--tuned", base, "--data", corpus_txt, "--out", out, "--no-report")
    assert result.exit_code == 0, result.output
    att = pd.read_parquet(out / "tables/attention_change.parquet")
    sim = pd.read_parquet(out / "tables/representation_similarity.parquet")
    assert np.allclose(att.cosine, 1.0)
    diag = sim[sim.layer_base == sim.layer_tuned]
    assert np.allclose(diag.value, 1.0, atol=1e-9)


def test_rerun_resumes_and_a_different_run_is_refused(identical_pair, corpus_txt, tmp_path):
    base, tuned = identical_pair
    out = tmp_path / "run"
    args = ["compare", "--base", base, "--tuned", tuned, "--data", corpus_txt, "--out", out, "--no-report"]
    assert invoke(*args).exit_code == 0
    again = invoke(*args)
    assert again.exit_code == 0 and "resumed" in again.output
    other = invoke(*args, "--seed", 5)
    assert_user_error(other, "holds another run", "--overwrite")
    assert invoke(*args, "--seed", 5, "--overwrite").exit_code == 0
    assert json.loads((out / "manifest.json").read_text())["seed"] == 5


def test_missing_model_path(corpus_txt, tmp_path):
    result = invoke("compare", "--tuned", tmp_path / "nope", "--data", corpus_txt, "--out", tmp_path / "o")
    assert_user_error(result, "does not exist")


def test_tokenizer_mismatch(identical_pair, corpus_txt, tmp_path):
    from transformers import BertTokenizer

    base, _ = identical_pair
    other = save_tiny_bert(tmp_path / "other")
    vocab = tiny_vocab()
    swapped = {tok: (i if tok not in ("cat", "dog") else vocab["dog" if tok == "cat" else "cat"]) for tok, i in vocab.items()}
    BertTokenizer(vocab=swapped, do_lower_case=True).save_pretrained(other)
    result = invoke("compare", "--base", base, "--tuned", other, "--data", corpus_txt, "--out", tmp_path / "o")
    assert_user_error(result, "tokenizers", "do not match")
    assert not (tmp_path / "o").exists()  # nothing half-written


def test_shape_mismatch(identical_pair, corpus_txt, tmp_path):
    base, _ = identical_pair
    bigger = save_tiny_bert(tmp_path / "bigger", num_hidden_layers=3)
    result = invoke("compare", "--base", base, "--tuned", bigger, "--data", corpus_txt, "--out", tmp_path / "o")
    assert_user_error(result, "different shapes", "num_hidden_layers: 2 vs 3")


def test_empty_corpus(identical_pair, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n", encoding="utf-8")
    base, tuned = identical_pair
    result = invoke("compare", "--base", base, "--tuned", tuned, "--data", empty, "--out", tmp_path / "o")
    assert_user_error(result, "no examples")


def test_malformed_conllu_line(identical_pair, tmp_path):
    bad = tmp_path / "bad.conllu"
    bad.write_text(
        "# text = the cat sat\n1\tthe\tthe\tDET\tDT\t_\t2\tdet\t_\t_\n2\tcat\tcat\tNOUN\tNN\t_\t3\tnsubj\t_\t_\n"
        "3\tsat\tsit\tVERB\n\n",
        encoding="utf-8",
    )
    base, tuned = identical_pair
    result = invoke("compare", "--base", base, "--tuned", tuned, "--data", bad, "--out", tmp_path / "o")
    assert_user_error(result, "bad.conllu", "line 4")


def test_non_utf8_file(identical_pair, tmp_path):
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("the movie was good .\nun film tr\xe8s dr\xf4le\n".encode("latin-1"))
    base, tuned = identical_pair
    result = invoke("compare", "--base", base, "--tuned", tuned, "--data", latin, "--out", tmp_path / "o")
    assert_user_error(result, "latin1.txt", "UTF-8")


def test_output_folder_holding_something_else(identical_pair, corpus_txt, tmp_path):
    out = tmp_path / "busy"
    out.mkdir()
    (out / "thesis.tex").write_text("precious", encoding="utf-8")
    base, tuned = identical_pair
    result = invoke("compare", "--base", base, "--tuned", tuned, "--data", corpus_txt, "--out", out)
    assert_user_error(result, "not empty")
    assert (out / "thesis.tex").read_text() == "precious"


def test_overlong_examples_are_counted_and_reported(identical_pair, tmp_path):
    data = tmp_path / "long.txt"
    data.write_text("the cat sat .\n" + "the movie " * 40 + "\na dull film\n", encoding="utf-8")
    base, tuned = identical_pair
    out = tmp_path / "o"
    result = invoke("compare", "--base", base, "--tuned", tuned, "--data", data, "--out", out, "--max-length", 16, "--no-report")
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["data"]["encoding"]["n_skipped_overlong"] == 1
    assert "skipped" in " ".join(result.output.split())
    assert pd.read_parquet(out / "tables/attention_change.parquet").n_examples.iloc[0] == 2


def test_report_and_env_commands(identical_pair, corpus_txt, tmp_path):
    base, tuned = identical_pair
    out = tmp_path / "run"
    assert invoke("compare", "--base", base, "--tuned", tuned, "--data", corpus_txt, "--out", out, "--no-report").exit_code == 0
    assert not (out / "report.html").exists()
    result = invoke("report", out)
    assert result.exit_code == 0, result.output
    assert (out / "report.html").exists()
    assert_user_error(invoke("report", tmp_path), "not a bertology run")
    # a corrupted table: the report is still written without its section, and the command says so and fails
    (out / "tables/attention_change.parquet").write_bytes(b"not parquet")
    (out / "tables/attention_change.csv").write_text("not,a\n\"broken", encoding="utf-8")
    broken = invoke("report", out)
    assert_user_error(broken, "Table(s) attention_change of", "could not be read")
    assert "Could not read tables/attention_change.parquet" in " ".join(broken.output.split())
    assert (out / "report.html").exists()
    env = invoke("env", "--json")
    assert env.exit_code == 0 and "torch" in json.loads(env.output)["packages"]


CONLLU = """# text = the cat sat on the mat .
1\tthe\tthe\tDET\tDT\t_\t2\tdet\t_\t_
2\tcat\tcat\tNOUN\tNN\t_\t3\tnsubj\t_\t_
3\tsat\tsit\tVERB\tVBD\t_\t0\troot\t_\t_
4\ton\ton\tADP\tIN\t_\t6\tcase\t_\t_
5\tthe\tthe\tDET\tDT\t_\t6\tdet\t_\t_
6\tmat\tmat\tNOUN\tNN\t_\t3\tobl\t_\t_
7\t.\t.\tPUNCT\t.\t_\t3\tpunct\t_\t_

# text = john did not see mary .
1\tjohn\tjohn\tPROPN\tNNP\t_\t4\tnsubj\t_\t_
2\tdid\tdo\tAUX\tVBD\t_\t4\taux\t_\t_
3\tnot\tnot\tPART\tRB\t_\t4\tadvmod\t_\t_
4\tsee\tsee\tVERB\tVB\t_\t0\troot\t_\t_
5\tmary\tmary\tPROPN\tNNP\t_\t4\tobj\t_\t_
6\t.\t.\tPUNCT\t.\t_\t4\tpunct\t_\t_

"""


def test_compare_on_a_treebank_writes_targets_and_relation_heads(planted_pair, tmp_path):
    data = tmp_path / "gold.conllu"
    data.write_text(CONLLU, encoding="utf-8")
    base, tuned = planted_pair
    out = tmp_path / "run"
    result = invoke("compare", "--base", base, "--tuned", tuned, "--data", data, "--out", out,
                    "--relation-min-count", 1, "--rsa-tokens", 8)
    assert result.exit_code == 0, result.output
    targets = pd.read_parquet(out / "tables/attention_targets.parquet")
    assert {"model", "layer", "head", "target", "value"} <= set(targets.columns)
    assert {"cls", "sep", "punct", "noun", "negation"} <= set(targets.target)
    rel = pd.read_parquet(out / "tables/relation_heads.parquet")
    assert {"model", "relation", "direction", "layer", "head", "accuracy", "baseline_offset",
            "baseline_accuracy", "n"} <= set(rel.columns)
    assert {"det", "nsubj", "all"} <= set(rel.relation) and set(rel.model) == {"base", "tuned"}
    # gold trees: no spaCy note; both sections in the report
    assert "spaCy" not in " ".join(result.output.split())
    html = (out / "report.html").read_text(encoding="utf-8")
    assert 'id="attention-targets"' in html and 'id="relation-heads"' in html


def test_plain_text_is_parsed_with_spacy_for_relation_heads(identical_pair, corpus_txt, tmp_path):
    pytest.importorskip("spacy")
    from bertology.assets import spacy_model_name

    if spacy_model_name() is None:
        pytest.skip("no spaCy English pipeline installed")
    base, tuned = identical_pair
    out = tmp_path / "run"
    result = invoke("compare", "--base", base, "--tuned", tuned, "--data", corpus_txt, "--out", out,
                    "--analyses", "relation_heads", "--relation-min-count", 1, "--no-report")
    assert result.exit_code == 0, result.output
    assert "spaCy" in " ".join(result.output.split())
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["tables"] == ["relation_heads"]
    assert any("spaCy" in w for w in manifest["warnings"])


RELATIONS = [
    {"text": "the movie was funny but the plot was boring .", "from": "movie", "to": "funny", "relation": "aspect"},
    {"text": "john saw mary and he liked her book .", "from": "he", "to": "john", "relation": "coref"},
]


def test_user_relations_join_the_dependency_relations(planted_pair, tmp_path):
    data = tmp_path / "gold.conllu"
    data.write_text(CONLLU, encoding="utf-8")
    rel_file = tmp_path / "rel.jsonl"
    rel_file.write_text("\n".join(json.dumps(r) for r in RELATIONS) + "\n", encoding="utf-8")
    base, tuned = planted_pair
    out = tmp_path / "run"
    args = ("compare", "--base", base, "--tuned", tuned, "--data", data, "--out", out, "--relation-min-count", 1,
            "--analyses", "relation_heads", "--relations", rel_file)
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    rel = pd.read_parquet(out / "tables/relation_heads.parquet")
    assert set(rel.kind) == {"dependency", "span"}
    spans = rel[rel.kind == "span"]
    assert set(spans.relation) == {"aspect", "coref"} and set(spans.direction) == {"from->to", "to->from"}
    assert (spans.n == 1).all() and spans.accuracy.between(0, 1).all()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["analyses"]["user_relations"]["n_relations"] == 2
    html = (out / "report.html").read_text(encoding="utf-8")
    assert "coref" in html and "aspect" in html
    # the same command resumes; an edited relations file is a different run
    assert invoke(*args).exit_code == 0
    rel_file.write_text(json.dumps(RELATIONS[0]) + "\n", encoding="utf-8")
    assert_user_error(invoke(*args), "different")


def test_bad_relations_file_is_one_message(identical_pair, corpus_txt, tmp_path):
    base, tuned = identical_pair
    bad = tmp_path / "rel.jsonl"
    bad.write_text('{"text": "the cat sat on the mat .", "from": "the", "to": "cat"}\n', encoding="utf-8")
    result = invoke("compare", "--base", base, "--tuned", tuned, "--data", corpus_txt, "--out", tmp_path / "o",
                    "--analyses", "attention_change", "--relations", bad)
    assert_user_error(result, "rel.jsonl line 1", "occurs 2 times")
    assert not (tmp_path / "o").exists()


def test_user_relation_named_like_a_dependency_relation_is_refused_before_work(planted_pair, tmp_path):
    data = tmp_path / "gold.conllu"
    data.write_text(CONLLU, encoding="utf-8")
    rel_file = tmp_path / "rel.jsonl"
    rel_file.write_text(json.dumps({**RELATIONS[0], "relation": "det"}) + "\n", encoding="utf-8")
    base, tuned = planted_pair
    result = invoke("compare", "--base", base, "--tuned", tuned, "--data", data, "--out", tmp_path / "o",
                    "--analyses", "relation_heads", "--relations", rel_file)
    assert_user_error(result, "det", "rename them")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(("args", "says"), [
    (["absa", "--data", "x.xml", "--max-sentences", "abc"], "Invalid value for '--max-sentences'"),
    (["compare", "--tuned", "x", "--data", "y", "--nope"], "No such option: --nope"),
])
def test_a_usage_error_is_one_line_naming_the_help(args, says):
    """Not click's boxed usage block: one line, like every other error of the command line."""
    result = invoke(*args)
    text = result.output.strip()
    assert result.exit_code == 2 and len(text.splitlines()) == 1, text
    assert text.startswith("error: ") and says in text and f"(see 'bertology {args[0]} --help')" in text
