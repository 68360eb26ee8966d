"""[CLS] share of every attention row on the built-in MiniLM: attention weights beside the norm-based maps.

Run: PYTHONPATH=src python benchmarks/cls_share.py  (offline; 20 fixed sentences, CPU, float32)
"""
import torch
from transformers import AutoModel, AutoTokenizer

from bertology.activations.contributions import contribution_maps
from bertology.models.loading import resolve_model

SENTENCES = [f"The {a} {n} was {adj}, and the staff seemed {adj2}." for a, n, adj, adj2 in [
    ("new", "menu", "great", "friendly"), ("old", "room", "dirty", "rude"), ("small", "cafe", "cosy", "busy"),
    ("large", "hall", "cold", "helpful"), ("quiet", "bar", "pleasant", "slow"), ("loud", "pub", "crowded", "kind"),
    ("cheap", "hotel", "awful", "tired"), ("fancy", "bistro", "lovely", "warm"), ("dark", "lounge", "odd", "calm"),
    ("bright", "kitchen", "clean", "quick")]]
SENTENCES += [f"I would not go back to that {w} again." for w in
              ("place", "shop", "park", "museum", "theatre", "gym", "school", "beach", "station", "market")]


def main() -> None:
    path = resolve_model("minilm")[1]
    tok, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    shares = {"weights": [], "norm": []}
    with torch.inference_mode():
        for s in SENTENCES:
            t = tok(s, return_tensors="pt")
            maps = contribution_maps(model, dict(t), ("weights", "norm"))
            for m in shares:
                shares[m].append(torch.stack([maps[m][l][0, :, :, 0].mean() for l in range(1, len(maps[m]))]))
    for m, v in shares.items():
        per_layer = torch.stack(v).mean(0)
        print(f"{m}: [CLS] share {float(per_layer.mean()):.4f}; by layer " + " ".join(f"{x:.3f}" for x in per_layer.tolist()))


if __name__ == "__main__":
    main()
