"""The packaged all-MiniLM-L6-v2 through the real loading code (marker `real`)."""
import numpy as np
import pytest

from bertology.analyses.representation_similarity import same_layer
from bertology.config import CompareConfig
from bertology.data.corpus import Corpus
from bertology.models.loading import load_model
from bertology.commands.compare import compare
from bertology.testing import SENTENCES

pytestmark = pytest.mark.real


def test_builtin_minilm_loads_eager_in_eval_mode():
    loaded = load_model("minilm")
    cfg = loaded.model.config
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.hidden_size) == (6, 12, 384)
    assert cfg._attn_implementation == "eager" and not loaded.model.training
    assert loaded.source == "builtin" and len(loaded.weights_sha256) == 64
    assert loaded.tokenizer.tokenize("Fine-tuning!") == ["fine", "-", "tuning", "!"]


def test_minilm_compared_with_itself(tmp_path):
    run = compare(
        CompareConfig(base="minilm", tuned="minilm", out=str(tmp_path / "run"), rsa_tokens=60),
        corpus=Corpus.from_list(SENTENCES),
        report=False,
    )
    att = run.table("attention_change")
    assert len(att) == 6 * 12 and np.allclose(att.cosine, 1.0) and np.allclose(att.js_divergence, 0.0)
    diag = same_layer(run.table("representation_similarity"))
    assert len(diag) == 7 * 4 and np.allclose(diag.value, 1.0, atol=1e-9)
