"""One base against several tuned models in one run (``compare_many``, ``compare --tuned NAME=PATH ...``).

Each pair's tables must equal a separate ``compare`` of that pair exactly: the pair sees the same
batches (same corpus, tokenizer, length buckets and padding) and the same kernels on the same shapes,
and the base activations it is fed are the output of the very forward a separate run would make, so
no tolerance is needed.
"""
import json

import pandas as pd
import pytest
from transformers import BertModel, BertTokenizer

from bertology.config import CompareConfig, DataConfig
from bertology.data.batching import length_batches
from bertology.data.encode import encode_corpus
from bertology.data.loaders import load_corpus
from bertology.errors import BertologyError
from bertology.multicompare import TunedModel, compare_many, parse_tuned
from bertology.commands.compare import compare
from bertology.report.many import side_by_side
from bertology.testing import SENTENCES, perturb_head, save_tiny_bert, tiny_tokenizer, tiny_vocab
from cli_checks import assert_user_error, invoke  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

ANALYSES = ("attention_change", "representation_similarity", "geometry")
PLANTED = {"a/s0": (1, 0), "a/s1": (2, 1), "b": (2, 3)}  # tuned name -> the head its copy of the base has changed
BATCH = 4


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny base, three perturbed copies (one head each) and a corpus file."""
    root = tmp_path_factory.mktemp("many")
    base = save_tiny_bert(root / "base")
    tuned = {}
    for i, (name, head) in enumerate(PLANTED.items()):
        model = BertModel.from_pretrained(base, attn_implementation="eager")
        perturb_head(model, *head, seed=i + 1)
        folder = root / f"tuned{i}"
        model.save_pretrained(folder)
        tiny_tokenizer().save_pretrained(folder)
        tuned[name] = folder
    data = root / "sentences.txt"
    data.write_text("\n".join(SENTENCES * 2) + "\n", encoding="utf-8")
    return base, tuned, data


def _config(base, data, out, tuned="") -> CompareConfig:
    return CompareConfig(base=str(base), tuned=str(tuned), data=DataConfig(str(data)), out=str(out), analyses=ANALYSES,
                         rsa_tokens=40, batch_size=BATCH, geometry_pairs=50, view_examples=1)


def _count_forwards(monkeypatch, calls: dict) -> None:
    import bertology.multicompare as mc

    real = mc.load_model

    def counting(path, **kw):
        loaded = real(path, **kw)
        key = str(path)
        calls.setdefault(key, 0)
        loaded.encoder.register_forward_hook(lambda *_: calls.__setitem__(key, calls[key] + 1))
        return loaded

    monkeypatch.setattr(mc, "load_model", counting)


@pytest.fixture(scope="module")
def many_run(models, tmp_path_factory):
    base, tuned, data = models
    calls: dict[str, int] = {"rsa": 0}
    with pytest.MonkeyPatch.context() as mp:
        _count_forwards(mp, calls)
        import bertology.metrics.similarity as sim

        real = sim.layer_terms
        mp.setattr(sim, "layer_terms", lambda x, **kw: calls.__setitem__("rsa", calls["rsa"] + 1) or real(x, **kw))
        run = compare_many(_config(base, data, tmp_path_factory.mktemp("out") / "many"),
                           [TunedModel(n, str(p)) for n, p in tuned.items()], report=False)
    return run, calls


def test_each_pair_equals_a_separate_compare(models, many_run, tmp_path):
    base, tuned, data = models
    run, _ = many_run
    for name, path in tuned.items():
        alone = compare(_config(base, data, tmp_path / name.replace("/", "-"), tuned=path), report=False)
        pair = run.pairs[name]
        assert pair.out == run.out / "pairs" / name.replace("/", "~")
        assert sorted(alone.results) == sorted(pair.results) == json.loads((pair.out / "manifest.json").read_text())["tables"]
        for table in alone.results:
            written = pd.read_parquet(pair.out / "tables" / f"{table}.parquet")
            pd.testing.assert_frame_equal(written, pd.read_parquet(alone.out / "tables" / f"{table}.parquet"), check_exact=True)
        # and the planted head is the one the pair finds
        att = pair.table("attention_change")
        top = att.sort_values("cosine").iloc[0]
        assert (top["layer"], top["head"]) == PLANTED[name]


def test_the_base_forward_runs_once_per_batch(models, many_run):
    base, tuned, data = models
    _, calls = many_run
    encoded = encode_corpus(load_corpus(str(data)), tiny_tokenizer(), 128, "skip")
    n_batches = len(list(length_batches(encoded.items, BATCH)))
    assert n_batches > 1
    views = 1  # the report's one attention view runs each model once more
    assert calls[str(base)] == n_batches + views * len(tuned)  # the shared pass, then one view per pair
    for path in tuned.values():
        assert calls[str(path)] == n_batches + views
    layers = 2 + 1  # hidden states of the tiny BERT: embeddings and 2 layers
    # RSA signatures once per distinct layer sample: the base's once for all pairs; a tuned copy's hidden states
    # below its planted layer equal the base's (the same bytes), so only those from that layer up are new
    assert calls["rsa"] == layers + sum(layers - layer for layer, _ in PLANTED.values())


def test_combined_tables_stack_the_pairs_with_tuned_task_seed(models, many_run):
    _, tuned, _ = models
    run, _ = many_run
    assert set(run.tables) == set(run.pairs["b"].results)
    for name, table in run.tables.items():
        on_disk = pd.read_parquet(run.out / "tables" / f"{name}.parquet")
        assert list(on_disk.columns[:3]) == ["tuned", "task", "seed"]
        assert len(on_disk) == sum(len(run.pairs[n].results[name].table) for n in tuned)
        for n in tuned:
            part = on_disk[on_disk.tuned == n].reset_index(drop=True)
            own = run.pairs[n].results[name].table.rename(columns={"seed": f"{name}_seed"}).reset_index(drop=True)
            pd.testing.assert_frame_equal(part.drop(columns=["tuned", "task", "seed"]), own, check_exact=True,
                                          check_dtype=False)
    att = pd.read_parquet(run.out / "tables/attention_change.parquet")
    keys = att.drop_duplicates("tuned").set_index("tuned")
    assert keys.loc["a/s0", "task"] == "a" and keys.loc["a/s0", "seed"] == 0 and keys.loc["a/s1", "seed"] == 1
    assert pd.isna(keys.loc["b", "task"]) and pd.isna(keys.loc["b", "seed"])
    manifest = json.loads((run.out / "manifest.json").read_text())
    assert manifest["kind"] == "compare_many" and manifest["status"] == "complete"
    assert [p["dir"] for p in manifest["pairs"]] == ["pairs/a~s0", "pairs/a~s1", "pairs/b"]


def test_a_second_run_skips_the_finished_pairs(models, many_run, monkeypatch):
    base, tuned, data = models
    run, _ = many_run
    before = {n: (r.out / "tables/attention_change.parquet").stat().st_mtime_ns for n, r in run.pairs.items()}
    calls: dict[str, int] = {}
    _count_forwards(monkeypatch, calls)
    again = compare_many(_config(base, data, run.out), [TunedModel(n, str(p)) for n, p in tuned.items()], report=False)
    assert again.skipped == list(tuned)
    assert calls[str(base)] == 0 and all(calls[str(p)] == 0 for p in tuned.values())
    assert before == {n: (r.out / "tables/attention_change.parquet").stat().st_mtime_ns for n, r in again.pairs.items()}
    pd.testing.assert_frame_equal(again.tables["attention_change"], run.tables["attention_change"])
    assert not (run.out / "pairs/b/report.html").exists()
    with_report = compare_many(_config(base, data, run.out), [TunedModel(n, str(p)) for n, p in tuned.items()])
    assert with_report.skipped == list(tuned) and (run.out / "pairs/b/report.html").exists()  # made for a finished pair
    assert 'href="pairs/b/report.html"' in (run.out / "report.html").read_text()
    with pytest.raises(BertologyError, match="holds another run"):
        compare_many(_config(base, data, run.out), [TunedModel("a/s0", str(tuned["a/s0"]))])


def test_parse_tuned_names_tasks_and_seeds(tmp_path):
    a, b = parse_tuned(["sst2/s0=runs/x", "mnli=org/model"])
    assert (a.name, a.path, a.task, a.seed) == ("sst2/s0", "runs/x", "sst2", 0)
    assert (b.name, b.task, b.seed) == ("mnli", None, None)
    assert parse_tuned(["minilm"]) == [TunedModel("tuned", "minilm")]
    odd = tmp_path / "lr=1e-5"
    odd.mkdir()
    assert parse_tuned([str(odd)])[0].path == str(odd)  # an existing folder with "=" is a plain path
    assert TunedModel("x/y z", "p").slug == "x~y_z"
    with pytest.raises(BertologyError, match="more than once"):
        parse_tuned(["a=p", "a=q"])
    with pytest.raises(BertologyError, match="NAME=PATH"):
        parse_tuned(["=p"])
    with pytest.raises(BertologyError, match="share the folder"):
        parse_tuned(["a b=p", "a_b=q"])


@pytest.mark.parametrize("bad", ["duplicate", "layers", "tokenizer"])
def test_bad_input_is_refused_before_any_work(models, tmp_path, bad):
    base, tuned, data = models
    good = [TunedModel("a/s0", str(tuned["a/s0"]))]
    if bad == "duplicate":
        extra, match = TunedModel("a/s0", str(tuned["a/s1"])), "more than once"
    elif bad == "layers":
        extra, match = TunedModel("deep", str(save_tiny_bert(tmp_path / "deep", num_hidden_layers=3))), "different shapes"
    else:
        other = save_tiny_bert(tmp_path / "other")
        vocab = tiny_vocab()
        swapped = {t: (vocab["dog"] if t == "cat" else vocab["cat"] if t == "dog" else i) for t, i in vocab.items()}
        BertTokenizer(vocab=swapped, do_lower_case=True).save_pretrained(other)
        extra, match = TunedModel("other", str(other)), "tokenizers"
    out = tmp_path / "out"
    with pytest.raises(BertologyError, match=match):
        compare_many(_config(base, data, out), [*good, extra])
    assert not out.exists()


def test_cli_repeated_tuned_writes_combined_tables_and_pair_reports(models, tmp_path):
    base, tuned, data = models
    out = tmp_path / "cli"
    result = invoke("compare", "--base", base, "--tuned", f"a/s0={tuned['a/s0']}", "--tuned", f"a/s1={tuned['a/s1']}",
                    "--data", data, "--out", out, "--analyses", "attention_change", "--batch-size", BATCH, "--view-examples", 0)
    assert result.exit_code == 0, result.output
    att = pd.read_parquet(out / "tables/attention_change.parquet")
    assert set(att.task) == {"a"} and sorted(set(att.seed)) == [0, 1]
    assert (out / "pairs/a~s0/report.html").exists() and (out / "pairs/a~s1/report.html").exists()
    assert "L1H0" in result.output and "L2H1" in result.output  # each pair's most changed head
    page = (out / "report.html").read_text()
    assert all(f'href="pairs/{s}/report.html"' in page for s in ("a~s0", "a~s1"))
    view = side_by_side({"attention_change": att})[0]  # the page's side-by-side: 1 - mean cosine, layer x tuned
    expect = att.assign(change=1 - att.cosine).groupby(["layer", "tuned"]).change.mean().unstack()
    assert view["columns"] == ["a/s0", "a/s1"] and [r[0] for r in view["rows"]] == ["1", "2"]
    shown = [float(x) for r in view["rows"] for x in r[1:]]
    assert shown == pytest.approx(expect.to_numpy().ravel().tolist(), abs=5e-5)
    assert all(f"<td>{x}</td>" in page for r in view["rows"] for x in r[1:])  # shown to 4 decimals
    dup = invoke("compare", "--base", base, "--tuned", f"a={tuned['a/s0']}", "--tuned", f"a={tuned['a/s1']}",
                 "--data", data, "--out", tmp_path / "dup")
    assert_user_error(dup, "'a' given more than once")
    (out / "report.html").unlink()
    again = invoke("report", out)  # re-renders the index page and each pair's report
    assert again.exit_code == 0, again.output
    assert (out / "report.html").read_text() == page
    assert not (tmp_path / "dup").exists()
