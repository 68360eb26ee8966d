"""``scale_gpu.py`` with the ``compute()`` of representation_similarity, geometry and pca_views timed (issue 18).

The end-to-end compare varies between processes by more than one ``compute()`` costs; this prints each
``compute()``'s seconds (``TIMED ...`` on stderr) inside the same run, so a change to one of them can be seen::

    PYTHONPATH=<tree>/src python benchmarks/compute_timed.py --data SST-2/dev.tsv --n 500 --size base \\
        --device cpu --dtypes float32 --repeats 1 --methods compare --no-warmup --out /tmp/timed.json
"""
from __future__ import annotations

import runpy
import sys
import time
from pathlib import Path

from bertology.analyses import geometry, pca_views, representation_similarity


def _timed(cls: type) -> None:
    real = cls.compute

    def compute(self):
        t0 = time.perf_counter()
        res = real(self)
        print(f"TIMED {cls.__name__}.compute {time.perf_counter() - t0:.2f} s", file=sys.stderr, flush=True)
        return res

    cls.compute = compute


if __name__ == "__main__":
    for c in (representation_similarity.RepresentationSimilarity, geometry.Geometry, pca_views.PCAViews):
        _timed(c)
    here = Path(__file__).parent
    sys.path.insert(0, str(here))
    sys.argv = [str(here / "scale_gpu.py"), *sys.argv[1:]]
    runpy.run_path(str(here / "scale_gpu.py"), run_name="__main__")
