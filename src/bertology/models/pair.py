"""A pretrained encoder and its fine-tuned version, checked to be comparable."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from bertology.errors import BertologyError
from bertology.models.loading import LoadedModel, load_model

_SHAPE_FIELDS = ("model_type", "num_hidden_layers", "num_attention_heads", "hidden_size")


def _tokenizer_signature(loaded: LoadedModel) -> tuple:
    tok = loaded.tokenizer
    return (
        tok.get_vocab(),
        tok.cls_token,
        tok.sep_token,
        tok.pad_token,
        getattr(tok, "do_lower_case", None),
    )


def check_compatible(base: LoadedModel, tuned: LoadedModel) -> None:
    """Raise one clear error if the two models differ in shape or tokenizer."""
    diffs = []
    for name in _SHAPE_FIELDS:
        a, b = getattr(base.model.config, name, None), getattr(tuned.model.config, name, None)
        if a != b:
            diffs.append(f"{name}: {a} vs {b}")
    if diffs:
        raise BertologyError(
            f"The models {base.name!r} and {tuned.name!r} have different shapes ({'; '.join(diffs)}); "
            "compare a fine-tuned model with the encoder it was fine-tuned from."
        )
    sa, sb = _tokenizer_signature(base), _tokenizer_signature(tuned)
    if sa != sb:
        va, vb = sa[0], sb[0]
        detail = (
            f"vocabularies differ ({len(va)} vs {len(vb)} entries, {len(set(va.items()) ^ set(vb.items()))} differing)"
            if va != vb
            else "special tokens or lower-casing differ"
        )
        raise BertologyError(
            f"The tokenizers of {base.name!r} and {tuned.name!r} do not match: {detail}. "
            "Both models must read the same token ids."
        )


@dataclass
class ModelPair:
    """Base and tuned model; ``encoders()`` gives the bare encoders that analyses hook."""

    base: LoadedModel
    tuned: LoadedModel

    def __post_init__(self) -> None:
        check_compatible(self.base, self.tuned)

    @classmethod
    def load(cls, base: str, tuned: str, *, trust_remote_code: bool = False, dtype: torch.dtype = torch.float32) -> "ModelPair":
        """Load both models (each as its classifier when it has one, in ``dtype``) and check them. A PEFT adapter as the
        tuned model goes on the base it is compared with, sharing the base's tensors (one copy of the base)."""
        loaded = load_model(base, trust_remote_code=trust_remote_code, dtype=dtype)
        return cls(loaded, load_model(tuned, trust_remote_code=trust_remote_code, dtype=dtype, adapter_base=base,
                                      shared_base=loaded))

    @property
    def tokenizer(self):
        return self.base.tokenizer

    @property
    def num_layers(self) -> int:
        return int(self.base.model.config.num_hidden_layers)

    @property
    def num_heads(self) -> int:
        return int(self.base.model.config.num_attention_heads)

    def describe(self) -> dict:
        return {"base": self.base.describe(), "tuned": self.tuned.describe()}
