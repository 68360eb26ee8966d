"""``bertology probe`` on tiny models and a tiny CoNLL-U: outputs, resume after an interruption, refusal,
clear errors."""
import json

import numpy as np
import pandas as pd
import pytest

from bertology.testing import SENTENCES, tiny_bert_pair
from cli_checks import assert_user_error, invoke  # noqa: E402


PROBE_COLUMNS = {"model", "layer", "probe", "split", "uuas", "dspr", "root_acc", "nspr", "n_sentences", "rank",
                 "epochs", "best_dev_loss"}


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _conllu(sentences, heads=True) -> str:
    """Each sentence as a right-branching chain (word k heads word k+1), '.'/','/'!' tagged PUNCT."""
    blocks = []
    for n, s in enumerate(sentences, 1):
        words = s.split()
        lines = [f"# sent_id = s{n}", f"# text = {s}"]
        for i, w in enumerate(words, 1):
            upos = "PUNCT" if w in ".,!?" else "X"
            head = str(i - 1) if heads else "_"
            lines.append("\t".join([str(i), w, w, upos, "_", "_", head, "root" if i == 1 else "dep", "_", "_"]))
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n\n"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tiny_bert_pair(tmp_path_factory.mktemp("probe-pair"), planted=(1, 0))


@pytest.fixture()
def data(tmp_path):
    train = tmp_path / "train.conllu"
    train.write_text(_conllu(SENTENCES * 3), encoding="utf-8")
    test = tmp_path / "test.conllu"
    test.write_text(_conllu(SENTENCES[:6]), encoding="utf-8")
    return train, test


def _args(models, data, out, *extra):
    base, tuned = models
    train, test = data
    return ["probe", "--base", base, "--tuned", tuned, "--random-control", "--train", train, "--test", test,
            "--rank", 8, "--epochs", 3, "--batch-size", 6, "--out", out, *extra]


def test_probe_writes_table_figures_manifest(models, data, tmp_path):
    out = tmp_path / "run"
    result = invoke(*_args(models, data, out))
    assert result.exit_code == 0, result.output
    t = pd.read_parquet(out / "tables/probe.parquet")
    assert PROBE_COLUMNS <= set(t.columns)
    assert len(t) == 3 * 3 * 2 * 2  # base/tuned/random x layers 0..2 x distance/depth x dev/test
    assert set(t["model"]) == {"base", "tuned", "random"} and set(t["split"]) == {"dev", "test"}
    assert t[t.probe == "distance"]["root_acc"].isna().all() and t[t.probe == "depth"]["uuas"].isna().all()
    assert t[t.probe == "distance"]["uuas"].between(0, 1).all()
    assert set(t["rank"]) == {8}
    assert pd.read_csv(out / "tables/probe.csv").shape == t.shape
    assert {p.name for p in (out / "figures").glob("*.svg")} == {"probe_distance.svg", "probe_depth.svg"}
    m = json.loads((out / "manifest.json").read_text())
    assert m["kind"] == "probe" and m["status"] == "complete" and m["pooling"] == "mean of sub-word pieces"
    assert set(m["models"]) == {"base", "tuned", "random"} and m["models"]["random"]["seed"] == 0
    assert m["probe"]["data"]["dev"]["n_sentences"] == 3 and m["probe"]["data"]["test"]["n_sentences"] == 6
    assert m["feature_dtype"] == m["config"]["feature_dtype"] == m["probe"]["features"]["dtype"] == "float32"
    assert m["probe"]["features"]["memory_mapped"] is True
    # the settings section, generated from the declarations (punctuation's default: the preset's)
    assert m["settings"]["probe"]["rank"]["value"] == 8 and m["settings"]["probe"]["rank"]["flag"] == "--rank"
    assert m["settings"]["probe"]["punctuation"] == {
        "value": "upos", "default": "upos", "flag": "--probe-punctuation", "paper": "Hewitt & Manning 2019",
        "changes_numbers": True, "help": m["settings"]["probe"]["punctuation"]["help"]}
    assert m["settings"]["options"]["keep_features"]["changes_numbers"] is False
    assert not (out / "partial").exists()  # features are dropped unless --keep-features
    html = (out / "report.html").read_text(encoding="utf-8")
    assert 'id="probe"' in html and "fig-probe_distance" in html and "Best UUAS, base" in html
    text = " ".join(result.output.split())
    assert "base: best test uuas" in text and "random: best test" in text
    # the linear-chain baseline: the trees here are right-branching chains, so it scores every edge and every root
    chain = pd.read_parquet(out / "tables/probe_baseline.parquet")
    assert set(chain["split"]) == {"dev", "test"} and set(chain["baseline"]) == {"linear_chain"}
    test_chain = chain[chain.split == "test"].set_index("probe")
    assert test_chain.loc["distance", "uuas"] == 1.0 and test_chain.loc["depth", "root_acc"] == 1.0
    assert "linear-chain baseline (no model): UUAS 1.000 [1.000, 1.000]" in text and "probe_baseline" in m["tables"]
    assert "linear chain (baseline)" in html and "linear chain 1.000" in html
    # 8 x 32 weights per probe against the training words (3 x the sentences, 3 of them held out): warned
    words = m["probe"]["data"]["train"]["n_words"]
    assert words < 8 * 32
    assert any(f"have {words:,} words for 256 weights" in w for w in m["warnings"]), m["warnings"]
    assert f"have {words:,} words for 256 weights" in text
    # the same command again finds the finished run
    again = invoke(*_args(models, data, out))
    assert again.exit_code == 0 and "nothing to do" in " ".join(again.output.split())


def test_interrupted_run_continues_with_the_same_command(models, data, tmp_path, monkeypatch):
    from bertology.experiments import probe

    ref = tmp_path / "ref"
    assert invoke(*_args(models, data, ref)).exit_code == 0

    out = tmp_path / "run"
    original = probe._StackTrainer.end_epoch
    calls = {"n": 0}

    def flaky(self, dev_loss):
        original(self, dev_loss)
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(probe._StackTrainer, "end_epoch", flaky)
    stopped = invoke(*_args(models, data, out))
    assert stopped.exit_code == 130
    assert "run the same command again" in " ".join(stopped.output.split())
    assert not (out / "tables/probe.parquet").exists()
    assert (out / "partial/features/train-base.safetensors").exists()
    monkeypatch.setattr(probe._StackTrainer, "end_epoch", original)

    extracted = []
    real_extract = probe.extract_word_features
    monkeypatch.setattr(probe, "extract_word_features", lambda *a, **k: extracted.append(1) or real_extract(*a, **k))
    again = invoke(*_args(models, data, out))
    assert again.exit_code == 0, again.output
    assert "resuming" in again.output and not extracted  # features came from partial/
    pd.testing.assert_frame_equal(pd.read_parquet(out / "tables/probe.parquet"), pd.read_parquet(ref / "tables/probe.parquet"))

    other = invoke(*_args(models, data, out, "--seed", 1))
    assert_user_error(other, "holds another run", "--overwrite")
    ok = invoke(*_args(models, data, out, "--seed", 1, "--overwrite", "--probes", "depth", "--layers", "0,2"))
    assert ok.exit_code == 0, ok.output
    t = pd.read_parquet(out / "tables/probe.parquet")
    assert set(t["probe"]) == {"depth"} and set(t["layer"]) == {0, 2}


def test_dev_file_is_used_when_given(models, data, tmp_path):
    train, test = data
    dev = tmp_path / "dev.conllu"
    dev.write_text(_conllu(SENTENCES[3:8]), encoding="utf-8")
    out = tmp_path / "run"
    base, _ = models
    result = invoke("probe", "--base", base, "--train", train, "--dev", dev, "--test", test, "--rank", 4,
                    "--epochs", 1, "--out", out)
    assert result.exit_code == 0, result.output
    t = pd.read_parquet(out / "tables/probe.parquet")
    assert set(t["model"]) == {"base"}
    assert set(t[t.split == "dev"]["n_sentences"]) == {5}
    assert set(t[t.split == "test"]["n_sentences"]) == {6}


def test_conllu_without_heads_is_refused(models, data, tmp_path):
    no_heads = tmp_path / "noheads.conllu"
    no_heads.write_text(_conllu(SENTENCES, heads=False), encoding="utf-8")
    base, _ = models
    result = invoke("probe", "--base", base, "--train", no_heads, "--test", data[1], "--out", tmp_path / "o")
    assert_user_error(result, "no dependency heads", "need gold trees")
    assert not (tmp_path / "o").exists()


def test_text_without_spacy_model_is_refused(models, data, tmp_path):
    txt = tmp_path / "s.txt"
    txt.write_text("\n".join(SENTENCES), encoding="utf-8")
    base, _ = models
    result = invoke("probe", "--base", base, "--train", txt, "--test", data[1], "--spacy-model", "no_such_pipeline_xyz",
                    "--out", tmp_path / "o")
    assert_user_error(result)
    text = " ".join(result.output.split())
    assert "spaCy" in text and ("no_such_pipeline_xyz" in text or "not installed" in text)
    assert not (tmp_path / "o").exists()


def test_empty_corpus_and_bad_layers_are_refused(models, data, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n", encoding="utf-8")
    base, _ = models
    assert_user_error(invoke("probe", "--base", base, "--train", empty, "--test", data[1], "--out", tmp_path / "o"),
                      "has no examples")
    assert_user_error(invoke("probe", "--base", base, "--train", data[0], "--test", data[1], "--layers", "0,9",
                             "--epochs", 1, "--out", tmp_path / "o2"), "out of range")
    assert_user_error(invoke("probe", "--base", base, "--train", data[0], "--test", data[1], "--feature-dtype", "int8",
                             "--epochs", 1, "--out", tmp_path / "o3"),
                      "--feature-dtype (feature_dtype) must be one of float16, float32, not 'int8'")


def test_feature_dtype_is_recorded_and_float16_holds_half_the_bytes(models, data, tmp_path):
    base, _ = models
    runs = {}
    for dtype in ("float16", "float32"):
        out = tmp_path / dtype
        result = invoke("probe", "--base", base, "--train", data[0], "--test", data[1], "--rank", 4, "--epochs", 1,
                        "--feature-dtype", dtype, "--no-report", "--out", out)
        assert result.exit_code == 0, result.output
        runs[dtype] = json.loads((out / "manifest.json").read_text())
    assert runs["float32"]["feature_dtype"] == runs["float32"]["config"]["feature_dtype"] == "float32"
    assert runs["float16"]["fingerprint"] != runs["float32"]["fingerprint"]
    b16, b32 = (runs[d]["probe"]["features"]["bytes"]["train"]["base"] for d in ("float16", "float32"))
    n_words = runs["float16"]["probe"]["data"]["train"]["n_words"]
    assert b32 == 2 * b16 == 4 * 3 * n_words * 32  # layers 0..2 x words x hidden 32 x 4 bytes


@pytest.mark.real
def test_plain_text_is_parsed_with_spacy(models, tmp_path):
    pytest.importorskip("spacy")
    from bertology.assets import spacy_model_name

    if spacy_model_name(None) is None:
        pytest.skip("no English spaCy pipeline installed")
    txt = tmp_path / "s.txt"
    txt.write_text("\n".join(SENTENCES * 2), encoding="utf-8")
    base, _ = models
    out = tmp_path / "run"
    result = invoke("probe", "--base", base, "--train", txt, "--test", txt, "--rank", 4, "--epochs", 1, "--out", out)
    assert result.exit_code == 0, result.output
    t = pd.read_parquet(out / "tables/probe.parquet")
    assert np.isfinite(t[t.probe == "distance"]["uuas"]).all()
    m = json.loads((out / "manifest.json").read_text())
    assert m["data"]["train"]["annotated"]["n_parsed"] == len(SENTENCES) * 2


def test_compare_runs_the_probes_when_given_trees(models, data, tmp_path):
    from bertology.config import CompareConfig, DataConfig
    from bertology.errors import BertologyError
    from bertology.commands.compare import compare

    base, tuned = models
    train, test = data
    sentences = tmp_path / "s.txt"
    sentences.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    config = CompareConfig(base=str(base), tuned=str(tuned), data=DataConfig(path=str(sentences)), out=str(tmp_path / "run"),
                           analyses=("attention_change", "probe"), view_examples=0, probe_train=str(train),
                           probe_test=str(test), probe_rank=8, probe_epochs=3)
    run = compare(config)
    t = run.table("probe")
    assert set(t["model"]) == {"base", "tuned", "random"} and set(t["split"]) == {"dev", "test"}
    assert len(t) == 3 * 3 * 2 * 2 and t[t["probe"] == "distance"]["uuas"].between(0, 1).all()
    assert run.manifest["analyses"]["probe"]["settings"]["rank"] == 8
    assert not (tmp_path / "run/partial/probe").exists()
    assert 'id="probe"' in run.report.read_text(encoding="utf-8")
    chain = run.table("probe_baseline")
    assert set(chain["split"]) == {"dev", "test"} and chain[chain.probe == "distance"]["uuas"].eq(1.0).all()
    assert any("weights per probe" in w for w in run.manifest["warnings"])  # the tiny treebank is too small for rank 8
    # the probe files' contents are part of the run's identity
    test.write_text(_conllu(SENTENCES[2:7]), encoding="utf-8")
    with pytest.raises(BertologyError, match="overwrite"):
        compare(config)
    # named without probe data: a clear error; with the default 'all', silently left out
    bare = CompareConfig(base=str(base), tuned=str(tuned), data=DataConfig(path=str(sentences)), out=str(tmp_path / "b"),
                         analyses=("probe",), view_examples=0)
    with pytest.raises(BertologyError, match="--probe-train and --probe-test"):
        compare(bare)


def test_token_probes_from_the_cli_with_control_and_mdl(models, data, tmp_path):
    """--probe-task upos adds the token_probe table (every model and layer), its summary lines and manifest
    record; a run without it keeps its fingerprint (the token settings enter only when a task is asked for)."""
    out = tmp_path / "run"
    result = invoke(*_args(models, data, out, "--probe-task", "upos", "--probe-max-iter", 50))
    assert result.exit_code == 0, result.output
    t = pd.read_parquet(out / "tables/token_probe.parquet")
    assert set(t["model"]) == {"base", "tuned", "random"} and set(t["probe_task"]) == {"upos"}
    assert len(t) == 3 * 3  # tiny BERT: layers 0..2
    assert np.allclose(t["selectivity"], t["accuracy"] - t["control_accuracy"])
    assert (t["compression"] > 0).all() and t["accuracy"].between(0, 1).all()
    # the tags here are X and PUNCT: the majority rate is X's share of the test words
    assert t["majority_rate"].between(0.5, 1).all()
    m = json.loads((out / "manifest.json").read_text())
    assert m["config"]["token_probe"]["tasks"] == ["upos"] and "token_probe" in m["tables"]
    assert m["token_probe"]["data"]["test"]["n_sentences"] == 6
    # one feature pass: the test sentences are the structural probes' own (their train lost a dev share)
    assert m["token_probe"]["features_from"] == {"train": dict.fromkeys(("base", "tuned", "random"), "computed"),
                                                 "test": dict.fromkeys(("base", "tuned", "random"), "shared")}
    alone = tmp_path / "alone"
    assert invoke(*_args(models, data, alone, "--probe-task", "upos", "--probe-max-iter", 50, "--probes",
                         "none")).exit_code == 0
    pd.testing.assert_frame_equal(pd.read_parquet(alone / "tables/token_probe.parquet"), t)  # same numbers
    text = " ".join(result.output.split())
    assert "token probe upos, base: best accuracy" in text and "most selective layer" in text
    plain = tmp_path / "plain"
    assert invoke(*_args(models, data, plain)).exit_code == 0
    assert json.loads((plain / "manifest.json").read_text())["fingerprint"] != m["fingerprint"]
    assert not (plain / "tables/token_probe.parquet").exists()


def test_an_unknown_token_probe_task_is_one_line(models, data, tmp_path):
    result = invoke(*_args(models, data, tmp_path / "x", "--probe-task", "lemma"))
    assert_user_error(result, "Unknown probe task")


def test_a_probe_task_with_one_training_label_is_refused_by_name(models, data, tmp_path):
    """The chains of ``_conllu`` label every arc but the root's ``dep``: an edge_deprel probe has one class to learn,
    which scikit-learn cannot fit (it was an internal error) and which would score 1 for nothing."""
    result = invoke(*_args(models, data, tmp_path / "x", "--probe-task", "upos,edge_deprel"))
    assert_user_error(result, "Probe task edge_deprel", "training word pairs carry the same label ('dep')",
                      "at least two labels")
    assert not (tmp_path / "x" / "tables" / "token_probe.parquet").exists()
    assert "Structural probes" not in result.output  # refused before the structural probes ran (they warn of capacity)


def test_erasure_from_the_cli_reaches_the_table_manifest_and_report(models, data, tmp_path):
    """--erase upos probes upos, adds the erased probe's columns, records the erasure in the manifest, and the
    report shows the token-probe section with an erasure panel."""
    out = tmp_path / "run"
    result = invoke(*_args(models, data, out, "--erase", "upos", "--probe-max-iter", 50, "--no-probe-mdl"))
    assert result.exit_code == 0, result.output
    t = pd.read_parquet(out / "tables/token_probe.parquet")
    assert set(t["probe_task"]) == {"upos"} and t["erased_accuracy"].between(0, 1).all()
    m = json.loads((out / "manifest.json").read_text())
    assert m["token_probe"]["erasure"]["method"].startswith("LEACE")
    assert isinstance(m["token_probe"]["erasure"]["warnings"], list)
    html = (out / "report.html").read_text(encoding="utf-8")
    assert 'id="token-probe"' in html and "after LEACE erasure" in html
    assert (out / "figures/token_probe_upos.svg").exists()
    assert "after LEACE erasure at most" in " ".join(result.output.split())


def test_erasing_from_the_tuned_models_own_task(tmp_path, data):
    """--erase upos --erase-task-data: the tuned classifier scored intact and with upos erased from each layer (an
    ablation table, mode erase, one unit per hidden state), its line printed, its record in the manifest, drawn by
    the report's ablation section in the erasure's words; a second identical run is reused as it is."""
    from bertology.testing import moved_classifier_pair

    base, tuned, labels = moved_classifier_pair(tmp_path / "pair")
    task = tmp_path / "task.tsv"
    pd.DataFrame({"sentence": SENTENCES * 2, "label": labels}).to_csv(task, sep="\t", index=False)
    out = tmp_path / "run"
    args = ["probe", "--base", base, "--tuned", tuned, "--train", data[0], "--test", data[1], "--rank", 8,
            "--epochs", 2, "--batch-size", 6, "--erase", "upos", "--erase-task-data", task, "--no-probe-mdl",
            "--probe-max-iter", 50, "--n-bootstrap", 50, "--out", out]
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    t = pd.read_parquet(out / "tables/ablation.parquet")
    assert set(t["mode"]) == {"erase"}
    acc = t[t["metric"] == "accuracy"]
    assert list(acc["label"]) == ["intact", "L0 erased", "L1 erased", "L2 erased"]
    assert acc.iloc[0]["value"] == pytest.approx(1.0)  # the labels are the tuned model's own predictions
    assert (acc.iloc[1:]["ci_low"] <= acc.iloc[1:]["delta"]).all() and (acc.iloc[1:]["delta"] <= acc.iloc[1:]["ci_high"]).all()
    m = json.loads((out / "manifest.json").read_text())
    rec = m["token_probe"]["task_erasure"]
    assert rec["concept"] == "upos" and rec["n_examples"] == len(labels)
    assert m["config"]["token_probe"]["erase_task_data_sha256"]
    assert "erasing upos from the tuned model: largest accuracy change at" in " ".join(result.output.split())
    html = (out / "report.html").read_text(encoding="utf-8")
    assert 'id="ablation"' in html and "Erasures" in html
    again = invoke(*args)
    assert again.exit_code == 0 and json.loads((out / "manifest.json").read_text())["fingerprint"] == m["fingerprint"]


def test_task_erasure_needs_one_erased_task(models, data, tmp_path):
    result = invoke(*_args(models, data, tmp_path / "x", "--erase", "upos,xpos", "--erase-task-data", "t.tsv"))
    assert_user_error(result, "exactly one task")


def test_compare_runs_token_probes_and_old_runs_keep_their_fingerprint(models, data, tmp_path):
    """--probe-task inside compare: the token_probe table beside the structural probes, its lines in the summary,
    seed-noise changes per task and layer; a compare without it has the fingerprint it had before the setting."""
    from bertology.config import CompareConfig, DataConfig
    from bertology.experiments.probe import token_probe_changes
    from bertology.commands.compare import compare
    from bertology.commands.selection import complete_config

    base, tuned = models
    train, test = data
    sentences = tmp_path / "s.txt"
    sentences.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    common = dict(base=str(base), tuned=str(tuned), data=DataConfig(path=str(sentences)), analyses=("probe",),
                  view_examples=0, probe_train=str(train), probe_test=str(test), probe_rank=8, probe_epochs=2)
    plain = complete_config(CompareConfig(out=str(tmp_path / "a"), **common))
    explicit = complete_config(CompareConfig(out=str(tmp_path / "b"), **common, settings={"probe_tasks": None,
                                                                                       "probe_control": True}))
    assert plain.fingerprint() == explicit.fingerprint()  # the added settings at their defaults stay out of it
    d = {k: v for k, v in plain.to_dict().items() if k not in plain.not_fingerprinted}
    assert not any(k.startswith("probe_tasks") for k in d)
    asked = CompareConfig(out=str(tmp_path / "run"), **common, settings={"probe_tasks": "upos", "probe_mdl": False,
                                                                          "probe_max_iter": 50})
    assert complete_config(asked).fingerprint() != plain.fingerprint()
    run = compare(asked)
    t = run.table("token_probe")
    assert set(t["model"]) == {"base", "tuned", "random"} and set(t["probe_task"]) == {"upos"} and len(t) == 9
    from bertology.experiments.probe import summary

    tables = {name: run.table(name) for name in ("probe", "probe_baseline", "token_probe")}
    assert "token probe upos, base: best accuracy" in summary(tables)
    assert 'id="token-probe"' in run.report.read_text(encoding="utf-8")
    changes = token_probe_changes(t.assign(task="a", seed=0), ["task", "seed"])
    sel = changes[changes["metric"] == "upos selectivity"].sort_values("layer")
    assert list(sel["unit"]) == ["L0", "L1", "L2"]
    by_hand = t.pivot(index="layer", columns="model", values="selectivity")
    np.testing.assert_allclose(sel["change"], (by_hand["tuned"] - by_hand["base"]).to_numpy())


def test_task_erasure_is_refused_before_any_model_runs(models, data, tmp_path):
    """Without --tuned, or with task data that cannot be read, one line at the start (not after the probes)."""
    base, _ = models
    task = tmp_path / "task.tsv"
    pd.DataFrame({"sentence": SENTENCES, "label": [0, 1] * (len(SENTENCES) // 2)}).to_csv(task, sep="\t", index=False)
    no_tuned = invoke("probe", "--base", base, "--train", data[0], "--test", data[1], "--erase", "upos",
                      "--erase-task-data", task, "--out", tmp_path / "a")
    assert_user_error(no_tuned, "give --tuned")
    assert not (tmp_path / "a" / "manifest.json").exists()
    missing = invoke(*_args(models, data, tmp_path / "b", "--erase", "upos", "--erase-task-data", tmp_path / "no.tsv"))
    assert missing.exit_code != 0 and not (tmp_path / "b" / "manifest.json").exists()


def _tag_file(sentences) -> str:
    """CoNLL-2003-style blocks (word, tag); a word's tag is ``B-NUM`` for digits, ``B-P`` for punctuation, else ``O``."""
    blocks = []
    for s in sentences:
        lines = [f"{w} {'B-P' if w in '.,!?' else 'B-NUM' if w.isdigit() else 'O'}" for w in s.split()]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def test_token_probes_alone_on_a_tag_file(models, tmp_path):
    """A tag file has words and tags but no trees: the structural probes refuse it with the way out (--probes
    none); with it, --probe-task tags probes the tag column on every layer of every model, the summary, manifest
    and report without the structural probes' table or figures; a finished run is returned as it is."""
    base, tuned = models
    train, test = tmp_path / "train.bio", tmp_path / "test.bio"
    train.write_text(_tag_file(SENTENCES * 3), encoding="utf-8")
    test.write_text(_tag_file(SENTENCES[:6]), encoding="utf-8")
    common = ["probe", "--base", base, "--tuned", tuned, "--random-control", "--train", train, "--test", test,
              "--probe-task", "tags", "--probe-max-iter", 50]
    refused = invoke(*common, "--out", tmp_path / "refused")
    assert_user_error(refused, "no dependency heads", "--probes none")
    nothing = invoke("probe", "--base", base, "--train", train, "--test", test, "--probes", "none",
                     "--out", tmp_path / "nothing")
    assert_user_error(nothing, "Nothing to probe", "--probe-task")
    out = tmp_path / "run"
    result = invoke(*common, "--probes", "none", "--out", out)
    assert result.exit_code == 0, result.output
    assert not (out / "tables/probe.parquet").exists() and not list((out / "figures").glob("probe_*.svg"))
    t = pd.read_parquet(out / "tables/token_probe.parquet")
    assert set(t["model"]) == {"base", "tuned", "random"} and set(t["probe_task"]) == {"tags"} and len(t) == 9
    words = [w for s in SENTENCES[:6] for w in s.split()]
    tags = ["B-P" if w in ".,!?" else "B-NUM" if w.isdigit() else "O" for w in words]
    majority = max(tags.count(x) for x in set(tags)) / len(tags)
    np.testing.assert_allclose(t["majority_rate"], majority)  # the tag column's own labels, not UPOS
    m = json.loads((out / "manifest.json").read_text())
    assert m["status"] == "complete" and m["config"]["probes"] == [] and "probe" not in m["tables"]
    text = " ".join(result.output.split())
    assert "token probe tags, base: best accuracy" in text and "best test" not in text
    html = (out / "report.html").read_text(encoding="utf-8")
    assert 'id="token-probe"' in html and 'id="probe"' not in html
    written = (out / "tables/token_probe.parquet").stat().st_mtime_ns
    again = invoke(*common, "--probes", "none", "--out", out)
    assert again.exit_code == 0, again.output
    assert (out / "tables/token_probe.parquet").stat().st_mtime_ns == written  # reused, not recomputed
    assert "token probe tags, base: best accuracy" in " ".join(again.output.split())


def test_token_probes_alone_read_conllu_without_heads(models, data, tmp_path):
    """--probes none reads a CoNLL-U file's UPOS column even where its HEAD column is empty (refused with trees)."""
    no_heads = tmp_path / "noheads.conllu"
    no_heads.write_text(_conllu(SENTENCES * 2, heads=False), encoding="utf-8")
    base, _ = models
    out = tmp_path / "run"
    result = invoke("probe", "--base", base, "--train", no_heads, "--test", no_heads, "--probes", "none",
                    "--probe-task", "upos", "--probe-max-iter", 50, "--no-probe-mdl", "--out", out)
    assert result.exit_code == 0, result.output
    t = pd.read_parquet(out / "tables/token_probe.parquet")
    assert set(t["model"]) == {"base"} and len(t) == 3 and t["accuracy"].between(0, 1).all()
