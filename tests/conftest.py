"""Tests are offline: no hub access, tiny models built in tmp_path."""
import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

from bertology.testing import tiny_bert_pair  # noqa: E402


@pytest.fixture(scope="session")
def identical_pair(tmp_path_factory):
    """(base_dir, tuned_dir) of two identical tiny BERTs."""
    return tiny_bert_pair(tmp_path_factory.mktemp("identical"))


@pytest.fixture(scope="session")
def planted_pair(tmp_path_factory):
    """(base_dir, tuned_dir) where only head L2H1 differs."""
    return tiny_bert_pair(tmp_path_factory.mktemp("planted"), planted=(2, 1))


@pytest.fixture(scope="module")
def one_thread():
    """One torch and BLAS thread for a test module (``pytestmark = pytest.mark.usefixtures("one_thread")``).

    Tiny tensors run fastest on one thread, and timings stay steady on oversubscribed shared CPUs;
    the previous torch setting is restored afterwards.
    """
    import torch
    from threadpoolctl import threadpool_limits

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    with threadpool_limits(1):
        yield
    torch.set_num_threads(before)
