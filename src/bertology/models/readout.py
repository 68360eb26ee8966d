"""A model's own output head applied to given vectors, as the model applies it (the lens of model diffing).

:func:`head_logits` runs the whole task model on one-token inputs with ``hidden_states[N]`` (the output of the last
block) replaced by the given vectors, so every module after it (BERT's pooler ``dense + tanh`` on position 0, a
RoBERTa or ELECTRA classification head, a masked-LM head's transform and decoder) runs as the model's own code
does: with one token, the position a head pools from and the mean over positions are that vector. Dropout is off
(eval mode). :func:`masked_lm_head` loads a checkpoint's masked-LM head where its config names one.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from bertology.models import sites
from bertology.models.hooks import on_layers, remove_hooks

#: Architectures whose checkpoints hold a masked-LM head (``cls.predictions`` in BERT).
MLM_SUFFIXES = ("ForMaskedLM", "ForPreTraining")


@contextmanager
def last_hidden_replaced(model: nn.Module, vectors: torch.Tensor) -> Iterator[None]:
    """Inside: the output of the last block (``hidden_states[N]``) is ``vectors`` ``[n, 1, d]``; hook removed on exit."""

    def replace(_module, _args, output):
        if isinstance(output, tuple):
            return (vectors.to(output[0].dtype), *output[1:])
        return vectors.to(output.dtype)

    handles = on_layers(model, sites.hidden_output, {sites.num_layers(model): replace})
    try:
        yield
    finally:
        remove_hooks(handles)


def head_logits(model: nn.Module, vectors: torch.Tensor, token_id: int = 0) -> torch.Tensor:
    """The task model's logits ``[n, outputs]`` (float64) when its last hidden state is each row of ``vectors``.

    A sequence classifier gives one row of label logits per vector, a masked-LM model its vocabulary logits at the
    one position. ``token_id`` fills the one-token input (its embedding never reaches the head)."""
    device = next(model.parameters()).device
    n = vectors.shape[0]
    inputs = {"input_ids": torch.full((n, 1), int(token_id), dtype=torch.long, device=device),
              "attention_mask": torch.ones(n, 1, dtype=torch.long, device=device)}
    if sites.uses_token_types(model):
        inputs["token_type_ids"] = torch.zeros(n, 1, dtype=torch.long, device=device)
    with torch.inference_mode(), last_hidden_replaced(model, vectors[:, None, :].to(device)):
        logits = model(**inputs).logits
    return (logits[:, 0] if logits.dim() == 3 else logits).double().cpu()


def is_sequence_classifier(model: nn.Module) -> bool:
    """Whether ``model`` is a ``*ForSequenceClassification`` (its head reads the whole sequence, one row of labels)."""
    return type(model).__name__.endswith("ForSequenceClassification")


def masked_lm_head(path: str, architectures: list[str] | None, dtype: torch.dtype = torch.float32
                   ) -> tuple[nn.Module | None, str]:
    """The checkpoint at ``path`` loaded with its masked-LM head (eval mode) and ``""``, or None and the reason."""
    names = list(architectures or [])
    if not any(a.endswith(MLM_SUFFIXES) for a in names):
        return None, (f"the base checkpoint has no masked-LM head (its config names {', '.join(names) or 'no '}"
                      f"{' architecture' if names else 'architecture'})")
    from transformers import AutoModelForMaskedLM

    from bertology.models.loading import quiet_transformers

    with quiet_transformers():
        model, info = AutoModelForMaskedLM.from_pretrained(path, attn_implementation="eager", dtype=dtype,
                                                           output_loading_info=True)
    prefix = getattr(model, "base_model_prefix", "")
    missing = sorted(k for k in info.get("missing_keys") or [] if not k.startswith(prefix + "."))
    if missing:  # a head transformers initialised at random would read noise
        return None, f"the base checkpoint's masked-LM head is incomplete (missing {', '.join(missing[:3])})"
    return model.eval(), ""
