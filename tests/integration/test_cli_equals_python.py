"""Every command twice with the same settings: once through the CLI, once through its library function, into two
folders. The tables must be equal and the manifests equal up to what differs between any two runs.

What the manifests may differ in (and only that), dropped by :func:`normalised`:

* timestamps: ``created``, ``started``, ``finished``;
* wall times: ``wall_time_s``, ``timing_s``, ``timings``, ``timings_s``, ``training_per_epoch``, ``seconds``,
  ``train_time_s``;
* the invocation: ``command`` (``sys.argv``);
* paths: each run's own folder, replaced by ``<OUT>`` in every string; and where a fingerprint is made from
  paths inside the run's folder (absa: the compare run names its tuned model by path, the fine-tuning run
  hashes its ``out``), that ``fingerprint``.
"""
from __future__ import annotations

import csv
import json
import shutil
import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from absa_fixture import write_absa  # noqa: E402

from bertology.testing import SENTENCES, save_tiny_bert, split_classifier, tiny_bert_pair  # noqa: E402
from cli_checks import assert_user_error, invoke  # noqa: E402
from study_helpers import tiny_study  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

#: Keys whose values differ between two identical runs: timestamps, wall times, the command line.
VOLATILE = {"created", "started", "finished", "wall_time_s", "timing_s", "timings_s", "timings", "training_per_epoch", "seconds",
            "train_time_s", "command", "memory"}


def normalised(value, out: Path, drop: frozenset = frozenset()):
    """``value`` without the :data:`VOLATILE` keys (and ``drop``), with ``out`` (the run's own folder) written ``<OUT>``."""
    roots = sorted({str(out), str(Path(out).resolve())}, key=len, reverse=True)
    if isinstance(value, dict):
        return {k: normalised(v, out, drop) for k, v in value.items() if k not in VOLATILE | drop}
    if isinstance(value, list):
        return [normalised(v, out, drop) for v in value]
    if isinstance(value, str):
        for root in roots:
            value = value.replace(root, "<OUT>")
    return value


def manifest(folder: Path, name: str = "manifest.json") -> dict:
    return json.loads((folder / name).read_text(encoding="utf-8"))


def assert_same_run(cli: Path, py: Path, tables: list[str], *, roots: tuple[Path, Path] | None = None,
                    drop: frozenset = frozenset()) -> None:
    """The tables of the two run folders are equal, and their manifests up to :func:`normalised` (``roots``: the
    folders whose paths are written ``<OUT>``, default the run folders themselves)."""
    for table in tables:
        pd.testing.assert_frame_equal(pd.read_parquet(cli / "tables" / f"{table}.parquet"),
                                      pd.read_parquet(py / "tables" / f"{table}.parquet"))
    root_cli, root_py = roots or (cli, py)
    assert normalised(manifest(cli), root_cli, drop) == normalised(manifest(py), root_py, drop)


def cli_ok(*args) -> str:
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    return result.output


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cli-equals-python")


def test_ablate(root):
    from bertology.errors import BertologyError
    from bertology.commands.ablate import ablate

    clf = save_tiny_bert(root / "clf", classifier=True, initializer_range=0.3)
    data = root / "labelled.csv"
    with data.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["text", "label"])
        writer.writerows(zip(SENTENCES * 2, split_classifier(clf, SENTENCES * 2)))
    cli_ok("ablate", "--model", clf, "--data", data, "--out", root / "ablate-cli", "--bootstrap", 50,
           "--pruning-step", 0.5, "--conventions", "kovaleva2019", "--no-report")
    run = ablate(str(clf), str(data), {"n_bootstrap": 50, "pruning_step": 0.5, "conventions": "kovaleva2019"},
                 out=root / "ablate-py", report=False)
    tables = ["ablation", "head_importance", "pruning_curve"]
    assert sorted(run.tables) == sorted(tables)
    assert_same_run(root / "ablate-cli", root / "ablate-py", tables)
    pd.testing.assert_frame_equal(run.table("ablation"), pd.read_parquet(root / "ablate-py/tables/ablation.parquet"))
    # --conventions is recorded (it changes no ablation number, so not the fingerprint) and a bad preset is one line
    assert run.manifest["conventions"] == {"preset": "kovaleva2019"}
    assert run.manifest["settings"]["ablate"]["conventions"]["value"] == "kovaleva2019"
    default = ablate(str(clf), str(data), {"n_bootstrap": 50, "pruning_step": 0.5}, out=None)
    assert default.manifest["conventions"] == {"preset": "bertology"}
    assert default.manifest["fingerprint"] == run.manifest["fingerprint"]
    from bertology.report.render import render_report

    page = render_report(root / "ablate-py").read_text(encoding="utf-8")
    assert "Preset <code>kovaleva2019</code>. No paper convention applies to the tables of this run" in page
    bad = invoke("ablate", "--model", clf, "--data", data, "--out", root / "ablate-bad", "--conventions", "kovaleva")
    assert_user_error(bad, "--conventions (conventions) must be one of", "kovaleva2019")
    with pytest.raises(BertologyError, match=r"\(conventions\) must be one of bertology, clark2019, kovaleva2019"):
        ablate(str(clf), str(data), {"conventions": "kovaleva"})


def test_ablate_revert(root):
    """``ablate --mode revert --base``: the CLI and :func:`bertology.commands.ablate.ablate` write the same run."""
    from bertology.commands.ablate import ablate

    base, tuned = tiny_bert_pair(root / "revert-pair", planted=(1, 2), classifier=True)
    data = root / "revert.csv"
    with data.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["text", "label"])
        writer.writerows(zip(SENTENCES * 2, split_classifier(tuned, SENTENCES * 2)))
    cli_ok("ablate", "--mode", "revert", "--base", base, "--model", tuned, "--data", data, "--out", root / "revert-cli",
           "--bootstrap", 50, "--no-report")
    run = ablate(str(tuned), str(data), {"mode": "revert", "n_bootstrap": 50}, base=str(base), out=root / "revert-py",
                 report=False)
    assert sorted(run.tables) == ["ablation"] and set(run.table("ablation")["mode"]) == {"revert"}
    assert_same_run(root / "revert-cli", root / "revert-py", ["ablation"])


def test_compare(root):
    import bertology as bt

    base, tuned = tiny_bert_pair(root / "compare-pair", planted=(1, 0))
    data = root / "sentences.txt"
    data.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    cli_ok("compare", "--base", base, "--tuned", tuned, "--data", data, "--out", root / "compare-cli",
           "--analyses", "attention_change,representation_similarity,head_map", "--rsa-tokens", 40,
           "--head-map-examples", 4, "--view-examples", 1, "--no-report")
    run = bt.compare(str(base), str(tuned), str(data), out=root / "compare-py", rsa_tokens=40, head_map_examples=4,
                     analyses=["attention_change", "representation_similarity", "head_map"], view_examples=1)
    tables = ["attention_change", "representation_similarity", "head_map", "head_distance"]
    assert sorted(run.tables) == sorted(tables)
    assert_same_run(root / "compare-cli", root / "compare-py", tables)


def test_finetune(root):
    import bertology as bt

    model = save_tiny_bert(root / "ft-base")
    data = root / "ft.tsv"
    rows = [f"{s}\t{i % 2}" for i, s in enumerate(SENTENCES * 2)]
    data.write_text("sentence\tlabel\n" + "\n".join(rows) + "\n", encoding="utf-8")
    cli_ok("finetune", "--model", model, "--data", data, "--out", root / "ft-cli", "--epochs", 1, "--batch-size", 4,
           "--lr", 1e-4)
    run = bt.finetune(str(model), data, out=root / "ft-py", epochs=1, batch_size=4, learning_rate=1e-4)
    assert "finetune" in run.tables
    # the fine-tuning fingerprint hashes its own folder (out): equal runs in two folders differ only there
    assert_same_run(root / "ft-cli", root / "ft-py", sorted(run.tables))
    from safetensors.torch import load_file

    a, b = load_file(root / "ft-cli/model/model.safetensors"), load_file(root / "ft-py/model/model.safetensors")
    assert a.keys() == b.keys() and all(bool((a[k] == b[k]).all()) for k in a)


def _conllu(sentences) -> str:
    blocks = []
    for n, s in enumerate(sentences, 1):
        lines = [f"# sent_id = s{n}", f"# text = {s}"]
        for i, w in enumerate(s.split(), 1):
            lines.append("\t".join([str(i), w, w, "PUNCT" if w in ".,!?" else "X", "_", "_", str(i - 1),
                                    "root" if i == 1 else "dep", "_", "_"]))
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n\n"


def test_probe(root):
    from bertology.commands.probe import ProbeData, ProbeModels, probe

    base, tuned = tiny_bert_pair(root / "probe-pair", planted=(1, 0))
    train, test = root / "train.conllu", root / "test.conllu"
    train.write_text(_conllu(SENTENCES * 2), encoding="utf-8")
    test.write_text(_conllu(SENTENCES[:5]), encoding="utf-8")
    cli_ok("probe", "--base", base, "--tuned", tuned, "--random-control", "--train", train, "--test", test,
           "--rank", 4, "--epochs", 2, "--batch-size", 6, "--out", root / "probe-cli", "--no-report")
    run = probe(ProbeModels(str(base), str(tuned), random_control=True), ProbeData(str(train), str(test)),
                {"rank": 4, "epochs": 2, "batch_size": 6}, out=root / "probe-py", report=False)
    assert list(run.tables) == ["probe", "probe_baseline"]
    assert_same_run(root / "probe-cli", root / "probe-py", ["probe", "probe_baseline"])


def test_absa(root):
    from bertology.commands.absa import AbsaConfig, run_absa

    data = write_absa(root / "rest.xml")
    base = save_tiny_bert(root / "absa-base")
    cli_ok("absa", "--data", data, "--base", base, "--out", root / "absa-cli", "--epochs", 1, "--batch-size", 8,
           "--eval-fraction", 0.4, "--no-opinions", "--view-examples", 0, "--no-report")
    run = run_absa(AbsaConfig(data=str(data), out=str(root / "absa-py"), base=str(base), epochs=1, batch_size=8,
                              eval_fraction=0.4, opinions=False, view_examples=0, report=False))
    tables = ["absa_heads", "absa_head_change", "absa_sep_share"]
    assert sorted(run.tables) == sorted(tables)
    # the compare run's fingerprint names the tuned model by its path (inside each run's own folder)
    both = (root / "absa-cli", root / "absa-py")
    assert_same_run(*(r / "study" for r in both), tables, roots=both, drop=frozenset({"fingerprint"}))
    assert_same_run(*(r / "finetune" for r in both), ["finetune"], roots=both, drop=frozenset({"fingerprint"}))


def test_patterns_export_and_train(root, identical_pair):
    from bertology.experiments.pattern_cnn import TrainSettings
    from bertology.commands.patterns import ExportSettings, export_patterns, train_patterns

    base, _ = identical_pair
    data = root / "sentences.txt"
    data.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    cli_ok("patterns", "export", "--model", base, "--data", data, "--out", root / "pat-cli", "--examples", 4,
           "--limit", 24, "--seed", 1)
    run = export_patterns(str(base), str(data), ExportSettings(examples=4, limit=24, seed=1), out=root / "pat-py")
    cli_labels = pd.read_csv(root / "pat-cli/labels.csv", keep_default_na=False)
    pd.testing.assert_frame_equal(cli_labels, run.table("labels"))
    assert normalised(manifest(root / "pat-cli", "export.json"), root) == normalised(run.manifest, root)

    # two classes taken in turn (enough for two folds), then train on the same CSV both ways
    cli_labels["label"] = ["vertical", "diagonal"] * (len(cli_labels) // 2)
    labels = root / "labelled.csv"
    cli_labels.to_csv(labels, index=False)
    shutil.copy(root / "pat-cli/maps.npz", root / "maps.npz")
    cli_ok("patterns", "train", labels, "--out", root / "cnn-cli", "--folds", 2, "--epochs", 2)
    trained = train_patterns(labels, TrainSettings(epochs=2), out=root / "cnn-py", folds=2)
    assert normalised(manifest(root / "cnn-cli", "pattern_cnn.json"), root) == normalised(trained.manifest, root)
    assert (root / "cnn-cli/pattern_cnn.safetensors").read_bytes() == (root / "cnn-py/pattern_cnn.safetensors").read_bytes()


def test_view(root, identical_pair):
    from bertology.commands.view import view

    base, tuned = identical_pair
    cli_ok("view", "the cat sat .", "--model", base, "--compare", tuned, "--out", root / "view-cli.json")
    run = view("the cat sat .", model=str(base), compare=str(tuned), out=root / "view-py.json")
    assert run.out == root / "view-py.json"
    assert (root / "view-cli.json").read_text(encoding="utf-8") == run.out.read_text(encoding="utf-8")


def test_track(root):
    from bertology.commands.track import track

    base = save_tiny_bert(root / "track-base")
    data = root / "track.csv"
    pd.DataFrame({"sentence": SENTENCES * 2, "label": ["pos", "neg"] * len(SENTENCES)}).to_csv(data, index=False)
    cli_ok("finetune", "--model", base, "--data", data, "--out", root / "ft", "--epochs", 1, "--batch-size", 8,
           "--save-every", 2, "--no-report")
    shutil.copytree(root / "ft", root / "track-cli")
    shutil.copytree(root / "ft", root / "track-py")
    cli_ok("track", root / "track-cli", "--max-examples", 8)
    run = track(root / "track-py", max_examples=8)
    names = [f"track_{a}" for a in run.tables]
    assert names == ["track_attention_change", "track_representation_similarity"]
    assert_same_run(root / "track-cli", root / "track-py", names)


def test_study(root):
    from bertology.studies.runner import run_study

    spec = tiny_study(root / "study", seeds=(0,))
    cli_ok("study", spec, "--out", root / "study-cli")
    run = run_study(spec, root / "study-py")
    assert run.tables and not run.failed
    assert_same_run(root / "study-cli", root / "study-py", sorted(run.tables))
