"""Optional on-disk activation store: hidden states as safetensors shards plus a fingerprinted manifest.

Each extraction batch becomes one shard holding, for both models and every layer, the hidden states
of the batch's real tokens (padding removed, special tokens kept, float16), with the example index
and position of every row. The manifest records both models' weight hashes and the corpus
fingerprint, so a store is never read back against other models or data.
"""
from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import load_file, save_file

from bertology.activations.batch import PairBatch
from bertology.data.encode import EncodedCorpus
from bertology.errors import BertologyError
from bertology.models.pair import ModelPair
from bertology.results import atomic_write, atomic_write_text, now_iso

STORE_VERSION = 1


class ActivationStore:
    """Writes (``create`` + ``add`` + ``close``) or reads (``open`` + ``iter_shards``) a store folder."""

    requires = frozenset({"hidden_states"})

    def __init__(self, path: Path, manifest: dict, dtype: str = "float16"):
        self.path, self.manifest, self.dtype = path, manifest, dtype

    @staticmethod
    def fingerprints(pair: ModelPair, encoded: EncodedCorpus) -> dict:
        ids = np.concatenate([it.input_ids for it in encoded.items]) if encoded.items else np.zeros(0)
        import hashlib

        return {
            "base_weights": pair.base.weights_sha256 or pair.base.path,
            "tuned_weights": pair.tuned.weights_sha256 or pair.tuned.path,
            "tokens_sha256": hashlib.sha256(ids.astype(np.int64).tobytes()).hexdigest(),
            "n_examples": len(encoded.items),
        }

    @classmethod
    def create(cls, path: str | Path, pair: ModelPair, encoded: EncodedCorpus, *, overwrite: bool = False,
               dtype: str = "float16") -> "ActivationStore":
        path = Path(path)
        if path.exists() and any(path.iterdir()):
            if not overwrite:
                raise BertologyError(f"Activation store {path} is not empty; pass another folder or overwrite.")
            shutil.rmtree(path)
        path.mkdir(parents=True, exist_ok=True)
        manifest = {
            "version": STORE_VERSION,
            "created": now_iso(),
            "dtype": dtype,
            "num_layers": pair.num_layers,
            "layers": "hidden-state layers 0..N (0 = embeddings)",
            "fingerprints": cls.fingerprints(pair, encoded),
            "shards": [],
            "complete": False,
        }
        store = cls(path, manifest, dtype)
        store._write_manifest()
        return store

    @classmethod
    def open(cls, path: str | Path, pair: ModelPair | None = None, encoded: EncodedCorpus | None = None) -> "ActivationStore":
        """Open a finished store; with ``pair``/``encoded`` given, refuse one made from other models or data."""
        path = Path(path)
        mpath = path / "manifest.json"
        if not mpath.exists():
            raise BertologyError(f"{path} is not an activation store (no manifest.json).")
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
        if not manifest.get("complete"):
            raise BertologyError(f"Activation store {path} is incomplete (its extraction was interrupted).")
        if pair is not None and encoded is not None:
            want = cls.fingerprints(pair, encoded)
            have = manifest.get("fingerprints", {})
            diff = [k for k in want if want[k] != have.get(k)]
            if diff:
                raise BertologyError(f"Activation store {path} was made from other models or data ({', '.join(diff)} differ).")
        return cls(path, manifest, manifest.get("dtype", "float16"))

    def _write_manifest(self) -> None:
        atomic_write_text(self.path / "manifest.json", json.dumps(self.manifest, indent=2))

    def add(self, batch: PairBatch) -> None:
        rows, cols = batch.mask.nonzero(as_tuple=True)
        tensors: dict[str, np.ndarray] = {
            "example": batch.example_indices[rows.cpu().numpy()],
            "position": cols.cpu().numpy().astype(np.int64),
        }
        for side, cap in (("base", batch.base), ("tuned", batch.tuned)):
            for layer, h in enumerate(cap.hidden_states):
                tensors[f"{side}.{layer}"] = h[rows, cols].to(torch.float16 if self.dtype == "float16" else torch.float32).cpu().numpy()
        name = f"shard-{len(self.manifest['shards']):05d}.safetensors"
        atomic_write(self.path / name, lambda p: save_file(tensors, str(p)))
        self.manifest["shards"].append({"file": name, "n_tokens": int(len(rows))})
        self._write_manifest()

    def close(self) -> None:
        self.manifest["complete"] = True
        self._write_manifest()

    def iter_shards(self) -> Iterator[dict[str, np.ndarray]]:
        """Yield each shard as a dict: ``example``, ``position``, ``base.<layer>``, ``tuned.<layer>``."""
        for shard in self.manifest["shards"]:
            yield load_file(str(self.path / shard["file"]))

    def hidden_states(self, side: str, layer: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All stored vectors of one model and layer: (example, position, vectors)."""
        ex, pos, vec = [], [], []
        for shard in self.iter_shards():
            ex.append(shard["example"])
            pos.append(shard["position"])
            vec.append(shard[f"{side}.{layer}"])
        return np.concatenate(ex), np.concatenate(pos), np.concatenate(vec)
