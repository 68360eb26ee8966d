"""Tests are offline: no hub access, tiny models built in tmp_path."""
import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# no progress bars or progress lines in tests (as in the docs build); tests of progress set or unset it themselves
os.environ.setdefault("BERTOLOGY_PROGRESS", "0")
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):  # `make test` runs a worker per core: each gets its share of threads
    _share = str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
        os.environ.setdefault(_var, _share)  # before torch, NumPy or Numba start their pools (children inherit it)

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
