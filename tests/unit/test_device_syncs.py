"""Issue 35: the streaming analyses' per-batch host-to-device copies go through ``transfer.send``.

On CUDA a plain host-to-device copy from pageable memory ends in ``cudaStreamSynchronize`` (the host waits for every
queued kernel); ``send`` stages the array in pinned memory and copies with ``non_blocking=True`` there, and on the
CPU (and MPS) it is ``torch.as_tensor(array, dtype, device)`` exactly, so the CPU tables are those of before
(pinned by each analysis's own tests). Here, on the CPU: ``send`` and the host tensor it would pin give
``torch.as_tensor``'s values and dtypes, and every analysis's device path (forced) sends its per-batch index and mask
arrays through ``send`` and makes no other tensor from host data on a device (``torch.as_tensor``/``torch.tensor``
with a ``device`` refused outside ``send``; what this cannot see: ``.to(device)`` of a host tensor, a no-op on the
CPU). The CUDA-only tests (``on_a_gpu``) run every analysis's updates on GPU batches under
``torch.cuda.set_sync_debug_mode("error")``, which raises on any synchronising CUDA call: no per-batch sync.
"""
import json
import sys
import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from bertology import transfer
from bertology.activations.batch import PairBatch
from bertology.analyses.absa_heads import AbsaHeads, absa_instances
from bertology.analyses.attention_change import AttentionChange
from bertology.analyses.attention_patterns import AttentionPatterns
from bertology.analyses.attention_targets import AttentionTargets
from bertology.analyses.geometry import Geometry, WordSample
from bertology.analyses.head_map import HeadMap
from bertology.analyses.pca_views import PCAViews
from bertology.analyses.relation_heads import RelationHeads
from bertology.analyses.representation_similarity import RepresentationSimilarity
from bertology.analyses.span_relations import SpanRelationHeads
from bertology.data.absa import AbsaPairs, absa_pairs, read_absa
from bertology.data.corpus import Corpus
from bertology.data.encode import encode_corpus
from bertology.data.spans import load_span_relations
from bertology.models.pair import ModelPair
from bertology.testing import batch_on, captured_batches, random_annotated_corpus

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from absa_fixture import write_absa  # noqa: E402

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: checks the GPU path itself")

SPANS = [
    {"text": "the movies were funny but the plot was boring .", "from": "movies", "to": "funny", "relation": "aspect"},
    {"text": "john saw mary and he liked her books .", "from": "he", "to": "john", "relation": "coref"},
    {"text": "the dogs ran fast but they were slow .", "from": "they", "to": ["the dogs"], "relation": "coref"},
    {"text": "the old man was reading a very good book .", "from": "book", "to": ["very", "good"]},
]
ANALYSES = ("patterns", "targets", "head_map", "relations", "spans", "absa", "rsa", "geometry", "pca", "change")


def _corpus() -> Corpus:
    """Annotated sentences (trees, UPOS, XPOS, labels), every fourth a sentence pair annotated over both texts."""
    return random_annotated_corpus(16, 0, min_words=4, pair_every=4, labels=True)


class _TorchRsa(RepresentationSimilarity):
    """RSA on the path a GPU takes (rows gathered and grids computed in torch), forced on the CPU."""

    compute_on_device = True
    host_rows = False


@pytest.fixture(scope="module")
def planted(planted_pair):
    return ModelPair.load(*map(str, planted_pair))


@pytest.fixture(scope="module")
def inputs(planted, tmp_path_factory):
    """Per analysis: a maker ``(device_path) -> analysis`` (``True``: the GPU's path forced; ``None``: chosen from
    the maps' device) and the batches it reads (kept from the extraction loop, on the CPU)."""
    tmp = tmp_path_factory.mktemp("syncs")
    L, H, tok = planted.num_layers, planted.num_heads, planted.tokenizer
    corpus = _corpus()
    enc = encode_corpus(corpus, tok)
    (tmp / "rel.jsonl").write_text("\n".join(json.dumps(r) for r in SPANS) + "\n")
    span_corpus, rels = load_span_relations(tmp / "rel.jsonl")
    pairs = absa_pairs(read_absa(write_absa(tmp / "rest.xml")), "qa_m").pairs[:12]
    instances = absa_instances(pairs)
    sep = tok.sep_token_id

    def forced(a, on: bool | None, *flags: str):
        for flag in flags:
            target = a
            *path, name = flag.split(".")
            for p in path:
                target = getattr(target, p)
            setattr(target, name, on)
        return a

    def stats(batch: PairBatch) -> None:  # the shared statistics, filled as the extraction loop's analyses would
        for layer in range(1, L + 1):
            batch.layer_stats(layer)

    both = frozenset({"attentions", "hidden_states"})
    batches = captured_batches(planted, enc, both, batch_size=5, each=stats)
    span_batches = captured_batches(planted, encode_corpus(span_corpus, tok), both, batch_size=3, each=stats)
    absa_batches = captured_batches(planted, encode_corpus(AbsaPairs(pairs, "qa_m").corpus(), tok, 64, "truncate"),
                                    both, batch_size=4, each=stats)
    makers = {
        "patterns": lambda on: forced(AttentionPatterns(tok, L, H), on, "on_device"),
        "targets": lambda on: AttentionTargets(corpus, tok, L, H),  # one path: the device's
        "head_map": lambda on: forced(HeadMap(L, H, max_examples=6, seed=3), on, "on_device"),
        "relations": lambda on: forced(RelationHeads(corpus, L, H, min_count=1), on, "score_on_device"),
        "spans": lambda on: forced(SpanRelationHeads(rels, L, H), on, "count_on_device"),
        "absa": lambda on: forced(AbsaHeads(instances, L, H, sep), on, "sum_on_device", "spans.count_on_device"),
        "rsa": lambda on: (_TorchRsa if on else RepresentationSimilarity)(L, n_tokens=20, seed=1),
        "geometry": lambda on: forced(Geometry(L, tokenizer=tok, n_pairs=9, seed=1,
                                               word_sample=WordSample(max_words=6, max_contexts=6)), on, "on_device"),
        "pca": lambda on: forced(PCAViews(L, tokenizer=tok, corpus=corpus, examples=4, seed=1), on, "on_device"),
        "change": lambda on: AttentionChange(L, H),  # one path; nothing from the host per batch
    }
    read = {"spans": span_batches, "absa": absa_batches}
    return {name: (makers[name], read.get(name, batches)) for name in ANALYSES}


# ------------------------------------------------------------------------------------------ send on the CPU

CASES = [
    (np.array([[True, False], [False, True]]), None),
    (np.arange(12, dtype=np.int64).reshape(3, 4)[:, 1], None),  # a strided column (keys_np[:, 1])
    (np.arange(6, dtype=np.int32), torch.long),
    (np.linspace(0.0, 1.0, 5), None),
    (np.asfortranarray(np.arange(6, dtype=np.int64).reshape(2, 3)), None),  # column-major: staged contiguous
    ([0.5, 1.5], None),  # a list of floats: torch's default float32, not NumPy's float64
    ([1, 2, 3], torch.long),
    (7, None),
    (torch.arange(4), None),
]


@pytest.mark.parametrize("array,dtype", CASES)
def test_send_on_the_cpu_is_torch_as_tensor(array, dtype):
    """On the CPU ``send`` is ``torch.as_tensor(array, dtype, device)``; the host tensor it pins on CUDA holds the
    same values in the same dtype, contiguous (the staging can be checked here: only the pinning needs CUDA)."""
    ref = torch.as_tensor(array.copy() if isinstance(array, np.ndarray) else array, dtype=dtype)
    for got in (transfer.send(array, "cpu", dtype), transfer.send(array, torch.device("cpu"), dtype),
                transfer.staged(array, dtype)):
        assert got.dtype == ref.dtype and got.device == ref.device and got.shape == ref.shape
        torch.testing.assert_close(got, ref, rtol=0, atol=0)
    assert transfer.staged(array, dtype).is_contiguous()


def test_send_takes_a_read_only_array_without_a_warning():
    """A read-only array (e.g. a cached lookup) is staged through a writable copy: no ``from_numpy`` warning."""
    a = np.arange(5)
    a.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = transfer.staged(a)
    torch.testing.assert_close(got, torch.arange(5), rtol=0, atol=0)


@contextmanager
def _sends_counted(monkeypatch):
    """Counts ``transfer.send`` calls; refuses ``torch.as_tensor``/``torch.tensor`` with a ``device`` outside it."""
    calls: list[torch.device] = []
    inside = [False]
    real_send, real_as_tensor, real_tensor = transfer.send, torch.as_tensor, torch.tensor

    def send(array, device, dtype=None):
        calls.append(torch.device(device))
        inside[0] = True
        try:
            return real_send(array, device, dtype)
        finally:
            inside[0] = False

    def guarded(real):
        def make(*args, **kwargs):
            if kwargs.get("device") is not None and not inside[0]:
                raise AssertionError("a tensor made from host data on a device outside transfer.send")
            return real(*args, **kwargs)

        return make

    with monkeypatch.context() as m:
        m.setattr(transfer, "send", send)
        m.setattr(torch, "as_tensor", guarded(real_as_tensor))
        m.setattr(torch, "tensor", guarded(real_tensor))
        yield calls


@pytest.mark.parametrize("name", ANALYSES)
def test_the_device_paths_send_their_host_arrays_through_send(name, inputs, monkeypatch):
    """Each analysis's device path (forced on the CPU) sends its per-batch host arrays through ``send`` (at least
    once per batch; attention_change reads nothing from the host: none) and makes no device tensor from host data
    by ``torch.as_tensor``/``torch.tensor`` itself; its state and tables are those of the same updates unwatched."""
    make, batches = inputs[name]
    watched, plain = make(True), make(True)
    with torch.inference_mode():
        with _sends_counted(monkeypatch) as calls:
            for batch in batches:
                watched.update(batch)
        for batch in batches:
            plain.update(batch)
    if name == "change":
        assert calls == []
    else:
        assert len(calls) >= len(batches), (name, len(calls), len(batches))
        assert all(d.type == "cpu" for d in calls)
    got, ref = watched.compute().table, plain.compute().table
    assert len(ref) > 0
    pd.testing.assert_frame_equal(got, ref, check_exact=True)


# ------------------------------------------------------------------------------------------ on a GPU

@contextmanager
def _syncs_refused():
    """Inside the block a synchronising CUDA call raises (``set_sync_debug_mode("error")``); "default" on exit."""
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


@needs_cuda
@pytest.mark.parametrize("name", ANALYSES)
def test_on_a_gpu_the_updates_make_no_device_sync(name, inputs, planted):
    """Each analysis's updates on GPU batches (its default path there), after the first, under
    ``set_sync_debug_mode("error")``: none waits for the device. The first batch runs unwatched: it sets the state
    up (allocations, one-time moves of the accumulators, CUDA's own lazy initialisation), once per run, not per batch.
    The shared layer statistics are filled inside the watched block, as the extraction loop does per batch."""
    make, batches = inputs[name]
    moved = [batch_on(b, "cuda") for b in batches]  # new batches: their statistics are computed on the GPU
    assert len(moved) >= 2
    a, L = make(None), planted.num_layers
    with torch.inference_mode():
        for layer in range(1, L + 1):
            moved[0].layer_stats(layer)
        a.update(moved[0])
        torch.cuda.synchronize()
        with _syncs_refused():
            for batch in moved[1:]:
                for layer in range(1, L + 1):
                    batch.layer_stats(layer)
                a.update(batch)
    torch.cuda.synchronize()
    assert len(a.compute().table) > 0
