"""Concept erasure (LEACE, Belrose et al. 2023): remove a word property from a layer and ask who still reads it.

Elazar et al. 2021 turned probing around: a probe says a property is *there*; erasing it from the representation
and watching the model's own task says whether it is *used*. LEACE is the least-squares erasure with a guarantee:
after it, no linear classifier predicts the property better than a constant (the class-conditional means of the
erased features all equal the overall mean). We use the ``concept-erasure`` package's fitter (the authors' code)
rather than a hand-written one; two of its defaults are changed, and why:

* ``constrain_cov_trace=False``: when the projection would grow the features' total variance, the package mixes
  in the orthogonal projection, which keeps hidden-state norms tame but breaks the guarantee; we keep the
  guarantee, and the check beside every erasure (a fresh probe falls to the majority rate) would show its loss;
* ``svd_tol=1e-6`` (the package's 0.01 drops directions whose whitened cross-covariance with the labels is below
  0.01, which leaves rare labels partly readable); statistics are kept in float64.

:func:`fit_eraser` fits one eraser on word vectors and their labels; :func:`erased_probe` is the check (a fresh
probe of the same kind on erased features); :func:`erasing` applies an eraser to every position of one hidden
state inside a forward pass (layer 0 = the embeddings' output, as ``output_hidden_states`` counts), restored on exit.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn

from bertology.errors import BertologyError

#: Singular values of the whitened cross-covariance kept by the eraser (see the module docstring).
SVD_TOL = 1e-6


def fit_eraser(x: np.ndarray, labels: np.ndarray, n_labels: int):
    """LEACE eraser of ``labels`` (ids ``0..n_labels-1``) from the rows of ``x`` (``[n, hidden]``), in float64."""
    try:
        from concept_erasure import LeaceFitter
    except ImportError as err:  # a core dependency; only a broken install lacks it
        raise BertologyError("Erasure needs the concept-erasure package: pip install concept-erasure") from err
    if len(x) < 2 or n_labels < 2:
        raise BertologyError(f"Erasure needs at least two words and two labels (got {len(x)} words, {n_labels} labels).")
    xt = torch.as_tensor(np.asarray(x, dtype=np.float64))
    z = torch.nn.functional.one_hot(torch.as_tensor(np.asarray(labels, dtype=np.int64)), n_labels).to(torch.float64)
    fitter = LeaceFitter(xt.shape[1], n_labels, dtype=torch.float64, constrain_cov_trace=False, svd_tol=SVD_TOL)
    return fitter.update(xt, z).eraser


def erase(eraser, x: np.ndarray) -> np.ndarray:
    """``x`` with the concept erased (float64 arithmetic, returned in ``x``'s dtype)."""
    return eraser(torch.as_tensor(np.asarray(x, dtype=np.float64))).numpy().astype(np.asarray(x).dtype, copy=False)


def erased_probe(x_train: np.ndarray, x_test: np.ndarray, train_labels: np.ndarray, test_labels: np.ndarray,
                 n_labels: int, fit_probe: Callable[[np.ndarray, np.ndarray], object]) -> tuple[np.ndarray, object]:
    """The check that erasure worked: per test word, whether a fresh probe (``fit_probe(x, y)`` returns it fitted)
    trained on the *erased* training features is right; and the eraser (fitted on the training words only)."""
    eraser = fit_eraser(x_train, train_labels, n_labels)
    erased_train, erased_test = flat_rounding(erase(eraser, x_train), erase(eraser, x_test))
    probe = fit_probe(erased_train, train_labels)
    return probe.predict(erased_test) == test_labels, eraser


#: A column whose spread after erasure is below this share of the largest column's is rounding, not signal.
ROUNDING_SHARE = 1e-6


def flat_rounding(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Set to their training mean the columns the eraser left with only rounding noise (spread below
    :data:`ROUNDING_SHARE` of the largest).

    Why: a feature that is constant before erasure (MiniLM's last layer has one) comes out with a spread of
    ~1e-16; a probe that standardises its features scales that rounding up to unit variance, and the rounding
    depends on the erased directions, so the probe reads the label back out of it (on EWT: .24 against a
    majority rate of .165). A constant column carries nothing a linear map could use, so flattening it changes
    no linear probe's best score; it only keeps standardisation from inventing signal."""
    spread = train.std(axis=0)
    flat = spread <= ROUNDING_SHARE * float(spread.max(initial=0.0))
    if not flat.any():
        return train, test
    mean = train[:, flat].mean(axis=0)
    train, test = train.copy(), test.copy()
    train[:, flat], test[:, flat] = mean, mean
    return train, test


def _moved(eraser, device: torch.device):
    """``eraser`` with its float64 tensors on ``device`` (the package's own eraser, so its formula is the one used)."""
    from concept_erasure import LeaceEraser

    bias = None if eraser.bias is None else eraser.bias.to(device, torch.float64)
    return LeaceEraser(eraser.proj_left.to(device, torch.float64), eraser.proj_right.to(device, torch.float64), bias)


def _replace_first(output, value: torch.Tensor):
    """``output`` with its hidden states (the tensor, or a tuple's first item) replaced by ``value``."""
    return (value, *output[1:]) if isinstance(output, tuple) else value


@contextmanager
def erasing(model: nn.Module, layer: int, eraser) -> Iterator[None]:
    """Apply ``eraser`` to hidden state ``layer`` of ``model`` at every position (special tokens and padding too:
    the eraser is affine, and padded positions are masked out of attention anyway) inside the block.

    Layer 0 is the input of the first block (the embeddings' output); layer l >= 1 the output of
    :func:`bertology.models.sites.hidden_output` — the same tensors the word features were read from."""
    from bertology.models import hooks, sites

    placed: dict = {}  # the eraser moved once to each device it meets (fitted on the CPU)

    def apply(h: torch.Tensor) -> torch.Tensor:
        if h.device not in placed:
            placed[h.device] = _moved(eraser, h.device)
        return placed[h.device](h.to(torch.float64)).to(h.dtype)

    n = sites.num_layers(model)
    if not 0 <= layer <= n:
        raise BertologyError(f"No hidden state {layer} to erase in a model with {n} layers (0 = embeddings).")
    if layer == 0:
        def pre(_m, args, kwargs):
            if "hidden_states" in kwargs:
                kwargs["hidden_states"] = apply(kwargs["hidden_states"])
                return args, kwargs
            return (apply(args[0]), *args[1:]), kwargs

        handles = hooks.on_layers(model, sites.block, {1: pre}, pre=True, with_kwargs=True)
    else:
        handles = hooks.on_layers(model, sites.hidden_output,
                                  {layer: lambda _m, _i, out: _replace_first(out, apply(hooks._first(out)))})
    try:
        yield
    finally:
        hooks.remove_hooks(handles)

