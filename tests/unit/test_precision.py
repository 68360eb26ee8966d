"""``--dtype``: models run in float32, bfloat16 or float16; tables stay within what the rounding allows.

Tolerance, from the arithmetic. bfloat16 keeps 8 significant bits: every stored result is rounded
with relative error at most ``u = 2^-9`` (round to nearest; 2^-8 is the spacing of its numbers).
Along any path, the tiny model's forward stores about 12 results per layer (query, key, value,
scores, softmax, context, output projection, residual + LayerNorm, FFN in, GELU, FFN out,
residual + LayerNorm): 2 layers give ``n = 24`` roundings, so an activation carries a relative error
of at most ``n u`` (first order). The tables' statistics (cosines, JS divergences, CKA, RSA, shares
of attention, anisotropy) lie in [-1, 1] and move by at most twice the relative change of their
inputs: ``|bfloat16 - float32| <= 2 n u = 0.094``. float16 keeps 11 bits: ``u = 2^-12``, 8 times smaller.
A backward pass rounds as often again (``2 n``).

``BERTOLOGY_TEST_DEVICE=cuda`` runs the model-running tests here on a GPU.
"""
from __future__ import annotations

import csv
import json
import os

import numpy as np
import pandas as pd
import pytest
import torch

from bertology.activations.extract import capture_forward, widen
from bertology.config import CompareConfig, DataConfig
from bertology.errors import BertologyError
from bertology.state_files import load_state
from bertology.models.precision import DTYPES, resolve_dtype, torch_dtype
from bertology.testing import SENTENCES, save_tiny_bert, tiny_bert_pair, tiny_tokenizer
from tests.integration.cli_checks import assert_user_error, invoke

DEVICE = os.environ.get("BERTOLOGY_TEST_DEVICE", "cpu")
ROUNDINGS = 2 * 12  # stored results along a path through the 2-layer tiny model
UNIT_ROUNDOFF = {"bfloat16": 2.0**-9, "float16": 2.0**-12}
ANALYSES = ("attention_change", "representation_similarity", "head_map", "geometry", "attention_patterns")
# Columns compared: continuous statistics. Left out: counts, the pattern class shares (a map near a rule's
# threshold may change class: a jump of 1 / n_examples) and the MDS coordinates (a rotation is free).
SKIP_COLUMNS = {"fraction", "x", "y", "stress"}


def tolerance(dtype: str) -> float:
    return 2 * ROUNDINGS * UNIT_ROUNDOFF[dtype]


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    root = tmp_path_factory.mktemp("precision")
    base, tuned = tiny_bert_pair(root / "m", planted=(2, 1), classifier=True)
    data = root / "labelled.tsv"
    with data.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh, delimiter="\t")
        w.writerow(["sentence", "label"])
        for i, s in enumerate(SENTENCES * 2):
            w.writerow([s, i % 2])
    return base, tuned, data, root


def _compare(planted, dtype: str):
    from bertology.commands.compare import compare

    base, tuned, data, root = planted
    cfg = CompareConfig(base=str(base), tuned=str(tuned), data=DataConfig(str(data)), out=str(root / f"cmp-{dtype}"),
                        analyses=ANALYSES, device=DEVICE, dtype=dtype)
    return compare(cfg, report=False, overwrite=True)


def _largest_difference(a: dict, b: dict) -> float:
    worst = 0.0
    for name, res in a.items():
        x, y = res.table, b[name].table
        assert len(x) == len(y), name
        for col in x.columns:
            if col in SKIP_COLUMNS or x[col].dtype.kind != "f":
                continue
            d = np.abs(x[col].to_numpy() - y[col].to_numpy())
            assert np.array_equal(np.isnan(d), np.isnan(x[col].to_numpy())), (name, col)  # NaN in the same places
            worst = max(worst, float(np.nanmax(d, initial=0.0)))
    return worst


def test_reduced_precision_tables_stay_within_the_rounding_bound_of_float32(planted):
    runs = {dt: _compare(planted, dt) for dt in DTYPES}
    for dt in DTYPES:
        assert runs[dt].manifest["dtype"] == dt and runs[dt].manifest["config"]["dtype"] == dt
    diff = {dt: _largest_difference(runs["float32"].results, runs[dt].results) for dt in ("bfloat16", "float16")}
    for dt, d in diff.items():
        assert d <= tolerance(dt), (dt, d)
    # the models really ran in the reduced type: differences far above float32 rounding, float16's smaller
    assert diff["bfloat16"] > diff["float16"] > 1e-6
    # and the planted head is still the one whose attention changed most
    for dt in DTYPES:
        change = runs[dt].results["attention_change"].table
        top = change.sort_values("cosine").iloc[0]
        assert (int(top["layer"]), int(top["head"])) == (2, 1), dt
    # float32 keeps the fingerprints of runs made before --dtype existed; another dtype is another run
    from bertology.commands.selection import complete_config

    cfg = complete_config(CompareConfig(tuned="t", data=DataConfig("d.txt")))
    d = cfg.to_dict()
    # the default ablation metric likewise keeps the fingerprints of runs made before --ablation-metric
    # and the default attention measures (weights alone) those of runs made before --attention-measures
    for key in ("out", "store", "dtype", "ablation_metric", "attention_measures", *cfg.not_fingerprinted):
        d.pop(key, None)
    if d.get("label_map") is None:  # and no --label-map those of runs made before it
        d.pop("label_map", None)
    d["ablation_mode"] = d["ablation_mode"][0]  # one mode is hashed as its name (runs made before mode lists)
    for key in [k for k in d if k.startswith(("crosscoder_", "activation_difference_"))]:  # theirs, when not named
        d.pop(key)
    import hashlib

    assert cfg.fingerprint() == hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]
    bf16 = complete_config(CompareConfig(tuned="t", data=DataConfig("d.txt"), dtype="bfloat16"))
    assert bf16.fingerprint() != cfg.fingerprint()
    mcc = complete_config(CompareConfig(tuned="t", data=DataConfig("d.txt"), ablation_metric="mcc"))
    assert mcc.fingerprint() != cfg.fingerprint()


def test_captured_activations_are_the_models_own_outputs_widened_to_float32(planted):
    """float32: the very tensors the model computed; bfloat16: the model's own bfloat16 outputs, widened exactly."""
    from bertology.data.batching import collate
    from bertology.data.corpus import Corpus
    from bertology.data.encode import encode_corpus
    from bertology.models.loading import load_model

    base = planted[0]
    for dt in DTYPES:
        loaded = load_model(base, dtype=torch_dtype(dt))
        model = loaded.encoder.to(DEVICE)
        enc = encode_corpus(Corpus.from_list(SENTENCES[:4]), loaded.tokenizer)
        t = collate(enc.items, loaded.tokenizer.pad_token_id or 0)
        with torch.inference_mode():
            cap = capture_forward(model, t, frozenset({"hidden_states", "attentions"}), torch.device(DEVICE))
            own = model(input_ids=t["input_ids"].to(DEVICE), attention_mask=t["attention_mask"].to(DEVICE),
                        token_type_ids=t["token_type_ids"].to(DEVICE), output_attentions=True, output_hidden_states=True)
        for mine, theirs in zip(cap.hidden_states, own.hidden_states):
            assert mine.dtype == torch.float32 and torch.equal(mine, theirs.float())
        for mine, theirs in zip(cap.attentions[1:], own.attentions):
            assert mine.dtype == torch.float32 and torch.equal(mine, theirs.float())
    x = torch.randn(3, 4)
    assert widen(x) is x  # float32 is passed through, not copied
    y = x.to(torch.bfloat16)
    assert torch.equal(widen(y).to(torch.bfloat16), y) and widen(None) is None


def test_ablate_in_bfloat16_records_it_and_stays_near_float32(planted, tmp_path):
    _, tuned, data, _ = planted
    tables = {}
    for dt in ("float32", "bfloat16"):
        out = tmp_path / dt
        result = invoke("ablate", "--model", tuned, "--data", data, "--out", out, "--bootstrap", 20, "--no-report",
                        "--device", DEVICE, "--dtype", dt)
        assert result.exit_code == 0, result.output
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["dtype"] == dt and manifest["config"]["dtype"] == dt
        tables[dt] = pd.read_parquet(out / "tables/ablation.parquet")
        assert (pd.read_parquet(out / "tables/head_importance.parquet")["importance"] >= 0).all()
    a, b = (t[t["metric"] == "loss"].reset_index(drop=True) for t in (tables["float32"], tables["bfloat16"]))
    assert len(a) == len(b) > 0
    # the loss is a mean cross-entropy of order 1 (ln 2 for a random 2-class head): the same bound, relative
    scale = float(np.abs(a["value"]).max())
    np.testing.assert_allclose(b["value"], a["value"], rtol=0, atol=tolerance("bfloat16") * scale)


def test_probe_in_bfloat16_runs_and_records_it(planted, tmp_path):
    base = planted[0]
    trees = tmp_path / "trees.conllu"
    blocks = []
    for n, s in enumerate(SENTENCES, 1):
        words = s.split()
        lines = [f"# sent_id = s{n}", f"# text = {s}"] + [
            "\t".join([str(i), w, w, "X", "_", "_", str(i - 1), "root" if i == 1 else "dep", "_", "_"])
            for i, w in enumerate(words, 1)]
        blocks.append("\n".join(lines))
    trees.write_text("\n\n".join(blocks) + "\n\n", encoding="utf-8")
    out = tmp_path / "probe"
    result = invoke("probe", "--base", base, "--random-control", "--train", trees, "--test", trees, "--rank", 4,
                    "--epochs", 1, "--out", out, "--no-report", "--device", DEVICE, "--dtype", "bfloat16")
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["dtype"] == "bfloat16"
    table = pd.read_parquet(out / "tables/probe.parquet")
    assert {"base", "random"} <= set(table["model"])
    assert table.loc[table["probe"] == "distance", "uuas"].between(0, 1).all()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_mixed_precision_gradients_are_within_the_bound_of_float32(tmp_path, dtype):
    from transformers import BertForSequenceClassification

    from bertology.data.encode import encode_corpus
    from bertology.data.corpus import Corpus
    from bertology.tasks.catalog import get_task
    from bertology.training.finetune import HeadTask
    from bertology.training.heads import Batching
    from bertology.training.loop import accumulate_gradients
    from bertology.training.precision import MixedPrecision

    device = torch.device(DEVICE)
    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(save_tiny_bert(tmp_path / "m"), num_labels=2,
                                                          attn_implementation="eager").to(device).train()
    tok = tiny_tokenizer()
    enc = encode_corpus(Corpus.from_list(SENTENCES[:6]), tok, max_length=32, overlong="truncate")
    y = np.array([0, 1, 0, 1, 1, 0])
    task = HeadTask(get_task("classification"), tok, (enc, y), (enc, y), Batching(6, 0, True, device))

    def grads(precision):
        model.zero_grad(set_to_none=True)
        loss = accumulate_gradients(model, task, list(range(6)), 3, precision=precision)
        if precision is not None:
            precision.unscale(torch.optim.SGD(model.parameters(), lr=0.0))
        return loss, {n: p.grad.detach().double().clone() for n, p in model.named_parameters() if p.grad is not None}

    loss32, g32 = grads(None)
    mixed = MixedPrecision.create(dtype, device)
    assert (mixed.scaler is not None) == (dtype == "float16")
    loss_mixed, gm = grads(mixed)
    assert all(p.dtype == torch.float32 for p in model.parameters())  # weights stay float32
    assert loss_mixed == pytest.approx(loss32, rel=tolerance(dtype))
    total32 = torch.sqrt(sum((g**2).sum() for g in g32.values()))
    err = torch.sqrt(sum(((gm[n] - g32[n]) ** 2).sum() for n in g32))
    assert 0 < err <= 2 * tolerance(dtype) * total32  # forward and backward: twice the roundings


def test_finetune_in_float16_with_a_loss_scaler_checkpoints_and_records_it(planted, tmp_path):
    base, _, data, _ = planted
    out = tmp_path / "ft"
    result = invoke("finetune", "--model", base, "--data", data, "--epochs", 1, "--batch-size", 4, "--save-every", 2,
                    "--out", out, "--device", DEVICE, "--dtype", "float16", "--no-report")
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["dtype"] == "float16" and "GradScaler" in manifest["precision"]
    state = load_state(sorted((out / "checkpoints").glob("step-*"))[-1] / "trainer_state.pt")
    assert state["scaler"]["scale"] > 0
    from safetensors.torch import load_file

    weights = load_file(out / "model" / "model.safetensors")
    assert all(t.dtype == torch.float32 for t in weights.values())


@pytest.mark.parametrize("command", ["compare", "ablate", "probe", "finetune"])
def test_an_unknown_dtype_is_one_clear_error(command, tmp_path):
    model_flag = {"compare": "--base", "probe": "--base"}.get(command, "--model")
    data_flag = {"probe": "--train"}.get(command, "--data")
    extra = {"probe": ["--test", tmp_path / "t.conllu"], "compare": ["--tuned", tmp_path / "never-loaded"]}.get(command, [])
    data = tmp_path / "d.csv"
    data.write_text("text,label\na,1\n")
    result = invoke(command, model_flag, tmp_path / "never-loaded", data_flag, data, *extra, "--dtype", "float8",
                    "--out", tmp_path / "o")
    assert_user_error(result, "--dtype", "'float8'", "float32, bfloat16, float16")


def test_a_dtype_the_device_cannot_run_is_one_clear_error(monkeypatch):
    def refuse(x, *a, **k):
        raise RuntimeError('"LayerNormKernelImpl" not implemented for \'Half\'\nmore detail')

    monkeypatch.setattr(torch.nn.functional, "layer_norm", refuse)
    with pytest.raises(BertologyError, match=r"--dtype float16 cannot run on cpu here \(\"LayerNormKernelImpl\" not implemented for 'Half'\); use --dtype float32"):
        resolve_dtype("float16", torch.device("cpu"))
    assert resolve_dtype("float32", torch.device("cpu")) == torch.float32  # float32 is never probed


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_patterns_export_without_a_gpu_is_one_clear_error(tmp_path):
    data = tmp_path / "d.txt"
    data.write_text("a b c\n")
    result = invoke("patterns", "export", "--model", tmp_path / "never-loaded", "--data", data, "--device", "cuda",
                    "--out", tmp_path / "o")
    assert_user_error(result, "CUDA is not available")


@pytest.mark.parametrize("command", ["compare", "ablate"])
def test_device_auto_runs_on_what_the_machine_has_and_records_it(command, planted, tmp_path):
    base, tuned, data, _ = planted
    out = tmp_path / "o"
    args = (["compare", "--base", base, "--tuned", tuned, "--analyses", "attention_change"] if command == "compare"
            else ["ablate", "--model", tuned, "--bootstrap", 0, "--no-importance", "--layers", 1])
    result = invoke(*args, "--data", data, "--out", out, "--no-report", "--device", "auto")
    assert result.exit_code == 0, result.output
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert json.loads((out / "manifest.json").read_text())["device"] == expected
