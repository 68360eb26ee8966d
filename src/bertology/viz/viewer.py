"""Interactive attention viewer: head view, model view and base/tuned/diff, as one offline HTML file.

In the spirit of bertviz, but self-contained: the page inlines its own vanilla JS and CSS (no CDN, no
``eval``), so it runs from ``file://``, inside the report (CSP ``script-src 'unsafe-inline'``) and in
notebooks (``_repr_html_``).

The data is a plain JSON-serialisable dict (a *view*) so the pipeline can store it as
``views/*.json`` and the report can embed it later::

    {
      "format": "bertology-attention-view", "version": 1,
      "text": str, "text_pair": str | None,
      "tokens": [str, ...],                 # convert_ids_to_tokens, [CLS]/[SEP] included
      "segments": [0 | 1, ...],             # sentence A / B of each token
      "special": [bool, ...],               # special tokens ([CLS], [SEP], <s> ...)
      "n_layers": N, "n_heads": H, "layers": [1, ..., N],
      "models": [{"name": "base", "model": "minilm"}, ...],   # one or two
      "attention": {"base": [[[[w, ...]]]], ...},           # [layer-1][head][query][key]
      "decimals": 4,
    }

``attention[name][l - 1]`` is attention layer ``l`` (DESIGN §3: layers 1..N, heads 0-based, labels
``L{layer}H{head}``). Weights are rounded to 4 decimals, so each stored number costs about 6-7 bytes of
JSON: a view weighs roughly ``models × N × H × n² × 7`` bytes for ``n`` tokens (MiniLM, 6 × 12 heads,
a 12-token sentence: ~70 kB per model; 128 tokens: ~8 MB per model). The diff (second − first) is
computed in the browser and by :meth:`AttentionView.diff`.
"""
from __future__ import annotations

import html
import json
import logging
import os
import re
import uuid
from collections.abc import Sequence
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertology.errors import BertologyError
from bertology.models import sites
from bertology.models.hooks import capture
from bertology.models.loading import LoadedModel, load_model
from bertology.results import atomic_write_text

logger = logging.getLogger(__name__)

FORMAT = "bertology-attention-view"
VERSION = 1
DECIMALS = 4
#: The report's Content-Security-Policy; the standalone page uses the same one.
CSP = (
    "default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
    "base-uri 'none'; form-action 'none'"
)
_ID = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
_SCRIPT_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
_SCRIPT_ESCAPE_RE = re.compile("[<>&\u2028\u2029]")


# ------------------------------------------------------------------------------------------ compute
def _encode(tokenizer, text: str, text_pair: str | None) -> dict[str, list[int]]:
    enc = tokenizer(text, text_pair, truncation=False, return_special_tokens_mask=True)
    return {k: list(v) for k, v in enc.items()}


def _segments(enc: dict[str, list[int]], paired: bool) -> list[int]:
    """Sentence A (0) or B (1) of each token.

    ``token_type_ids`` when the tokenizer marks the pair with them (BERT); otherwise (RoBERTa has none)
    sentence B starts at the first ordinary token after a special token that follows sentence A, and
    special tokens belong to the sentence before them.
    """
    n = len(enc["input_ids"])
    if not paired:
        return [0] * n
    types = enc.get("token_type_ids")
    if types and any(types):
        return [int(t) for t in types]
    special = enc.get("special_tokens_mask") or [0] * n
    out, seg, seen_a, crossed = [], 0, False, False
    for s in special:
        if s:
            crossed = crossed or seen_a
        else:
            seen_a = True
            if crossed:
                seg = 1
        out.append(seg)
    return out


def _attention(loaded: LoadedModel, enc: dict[str, list[int]]) -> np.ndarray:
    """Attention probabilities of one forward pass, ``[layers, heads, seq, seq]`` in float64."""
    encoder = loaded.encoder
    device = next(encoder.parameters()).device
    tensors = {k: torch.tensor([v]) for k, v in enc.items() if k in ("input_ids", "token_type_ids", "attention_mask")}
    tensors.setdefault("token_type_ids", torch.zeros_like(tensors["input_ids"]))
    tensors.setdefault("attention_mask", torch.ones_like(tensors["input_ids"]))
    inputs = sites.model_inputs(encoder, tensors, device)
    with torch.inference_mode(), capture(encoder, hidden_states=False) as captured:
        encoder(**inputs)
    maps = [a[0].float().cpu() for a in captured.attentions[1:]]
    return torch.stack(maps).double().numpy()


def compute_view(
    models: LoadedModel | Sequence[LoadedModel],
    text: str,
    text_pair: str | None = None,
    *,
    names: Sequence[str] = ("base", "tuned"),
    max_length: int = 128,
) -> dict[str, Any]:
    """Attention of one or two models on one sentence (or pair), as a JSON-ready *view* dict.

    With two models the second is compared with the first (diff = second − first); they must tokenise
    the text identically and have the same number of layers and heads. Texts longer than
    ``max_length`` tokens ([CLS]/[SEP] included) are refused rather than truncated.
    """
    loaded = [models] if isinstance(models, LoadedModel) else list(models)
    if not 1 <= len(loaded) <= 2:
        raise BertologyError(f"The viewer shows one model or compares two; got {len(loaded)}.")
    names = tuple(str(n) for n in names)[: len(loaded)]
    if len(names) != len(loaded) or len(set(names)) != len(names) or "diff" in names or "" in names:
        raise BertologyError(f"Give one distinct, non-empty name per model (not 'diff'); got {names!r}.")
    if not isinstance(text, str) or not text.strip():
        raise BertologyError("The text to view is empty.")
    if text_pair is not None and not text_pair.strip():
        raise BertologyError("The second text of the pair is empty.")

    encs = [_encode(m.tokenizer, text, text_pair) for m in loaded]
    tokens = [m.tokenizer.convert_ids_to_tokens(e["input_ids"]) for m, e in zip(loaded, encs)]
    if len(loaded) == 2 and tokens[0] != tokens[1]:
        raise BertologyError(
            f"The models tokenise the text differently ({names[0]}: {len(tokens[0])} tokens, "
            f"{names[1]}: {len(tokens[1])} tokens, first difference at "
            f"{_first_difference(tokens[0], tokens[1])}); compare models that share a tokenizer."
        )
    n = len(tokens[0])
    if n > max_length:
        raise BertologyError(
            f"The text is {n} tokens long ([CLS]/[SEP] included), more than the maximum of {max_length}; "
            "shorten it or raise --max-length."
        )
    for m in loaded:
        limit = getattr(m.model.config, "max_position_embeddings", None)
        if limit is not None and n > limit:
            raise BertologyError(f"The text is {n} tokens long; model {m.name} accepts at most {limit}.")

    maps = [_attention(m, e) for m, e in zip(loaded, encs)]
    if len(maps) == 2 and maps[0].shape != maps[1].shape:
        (l0, h0), (l1, h1) = maps[0].shape[:2], maps[1].shape[:2]
        raise BertologyError(
            f"The models differ in shape ({names[0]}: {l0} layers x {h0} heads, {names[1]}: {l1} x {h1}); "
            "the viewer compares models with the same architecture."
        )
    if not all(np.isfinite(a).all() for a in maps):
        raise BertologyError("A model produced non-finite attention weights (NaN/inf); check its weights.")
    n_layers, n_heads = maps[0].shape[:2]
    enc0 = encs[0]
    view = {
        "format": FORMAT,
        "version": VERSION,
        "text": text,
        "text_pair": text_pair,
        "tokens": [str(t) for t in tokens[0]],
        "segments": _segments(enc0, text_pair is not None),
        "special": [bool(s) for s in enc0.get("special_tokens_mask", [0] * n)],
        "n_layers": int(n_layers),
        "n_heads": int(n_heads),
        "layers": list(range(1, n_layers + 1)),
        "models": [{"name": name, "model": m.name} for name, m in zip(names, loaded)],
        "attention": {name: np.round(a, DECIMALS).tolist() for name, a in zip(names, maps)},
        "decimals": DECIMALS,
    }
    return view


def _first_difference(a: list[str], b: list[str]) -> str:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"position {i}: {x!r} vs {y!r}"
    return f"position {min(len(a), len(b))} (one is longer)"


# ------------------------------------------------------------------------------------------- render
def json_for_script(obj: Any) -> str:
    """JSON that is safe inside ``<script>``: ``<``, ``>``, ``&``, U+2028/9 become ``\\uXXXX`` escapes.

    A token such as ``</script>`` therefore cannot close the script element, and ``JSON.parse`` still
    returns the original strings.
    """
    text = json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return _SCRIPT_ESCAPE_RE.sub(lambda m: _SCRIPT_ESCAPES[m.group(0)], text)


@lru_cache(maxsize=None)
def _asset(name: str) -> str:
    return resources.files("bertology.viz").joinpath("viewer_assets", name).read_text(encoding="utf-8")


def _check_view(view: dict) -> None:
    if not isinstance(view, dict) or view.get("format") != FORMAT:
        raise BertologyError("Not an attention view (expected a dict from compute_view).")


def render_fragment(view: dict, element_id: str) -> str:
    """An embeddable HTML fragment: container div, scoped CSS, the data as JSON, and the inline script.

    Several fragments can share a page as long as their ``element_id`` differ: the script defines
    ``window.BertologyViewer`` once and each fragment mounts itself on its own container.
    """
    _check_view(view)
    if not _ID.match(element_id):
        raise ValueError(f"element_id must match {_ID.pattern} (letters, digits, _ and -); got {element_id!r}")
    return (
        f'<div class="bv" id="{element_id}" data-bertology-view="{VERSION}">'
        '<p class="bv-fallback">The attention viewer needs JavaScript.</p></div>\n'
        f"<style>{_asset('viewer.css')}</style>\n"
        f'<script type="application/json" id="{element_id}-data">{json_for_script(view)}</script>\n'
        f"<script>\n{_asset('viewer.js')}\nwindow.BertologyViewer.mount({json.dumps(element_id)});\n</script>\n"
    )


_PAGE_CSS = """
body { margin: 0; color: #1c1e21; background: #fff;
  font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, "Liberation Sans", sans-serif; }
.bv-page { max-width: 1320px; margin: 0 auto; padding: 22px 28px 36px; }
.bv-page h1 { margin: 0 0 4px; font-size: 22px; font-weight: 650; overflow-wrap: anywhere; }
.bv-page .bv-text { margin: 0 0 14px; color: #5d6470; font-size: 14px; overflow-wrap: anywhere; }
.bv-page .bv-text b { color: #1c1e21; font-weight: 600; }
.bv-page footer { margin-top: 14px; color: #8a919c; font-size: 12.5px; }
"""


def render_page(view: dict, title: str | None = None) -> str:
    """A complete standalone HTML page around one fragment; works opened from disk (no CDN)."""
    _check_view(view)
    names = [m["name"] for m in view["models"]]
    if title is None:
        title = "Attention: " + " vs ".join(m["model"] for m in view["models"])
    esc = html.escape
    lines = [f"<b>A</b> {esc(view['text'])}"]
    if view.get("text_pair") is not None:
        lines.append(f"<b>B</b> {esc(view['text_pair'])}")
    diff = f" Diff = {esc(names[1])} − {esc(names[0])}." if len(names) == 2 else ""
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">\n'
        '<meta name="generator" content="bertology">\n<link rel="icon" href="data:,">\n'
        f"<title>{esc(title)}</title>\n<style>{_PAGE_CSS}</style>\n</head>\n<body>\n<main class=\"bv-page\">\n"
        f"<h1>{esc(title)}</h1>\n<p class=\"bv-text\">{'<br>'.join(lines)}</p>\n"
        f"{render_fragment(view, 'bertology-view')}"
        f"<footer>Layers 1…{view['n_layers']}, heads 0…{view['n_heads'] - 1} (labels L{{layer}}H{{head}}); "
        f"weights rounded to {view.get('decimals', DECIMALS)} decimals.{diff}</footer>\n"
        "</main>\n</body>\n</html>\n"
    )


# -------------------------------------------------------------------------------------------- object
class AttentionView:
    """A computed view: renders as a page, an embeddable fragment, or inline in a notebook."""

    def __init__(self, data: dict[str, Any]) -> None:
        _check_view(data)
        self.data = data

    @classmethod
    def from_models(
        cls,
        models: LoadedModel | Sequence[LoadedModel],
        text: str,
        text_pair: str | None = None,
        **kwargs: Any,
    ) -> AttentionView:
        """Compute the view of loaded model(s); keyword arguments go to :func:`compute_view`."""
        return cls(compute_view(models, text, text_pair, **kwargs))

    @classmethod
    def load(cls, path: str | os.PathLike) -> AttentionView:
        """Read a view saved as JSON (e.g. a run's ``views/*.json``)."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise BertologyError(f"Cannot read attention view {path}: {err}") from err
        return cls(data)

    @property
    def names(self) -> list[str]:
        return [m["name"] for m in self.data["models"]]

    @property
    def tokens(self) -> list[str]:
        return list(self.data["tokens"])

    def attention(self, name: str | None = None) -> np.ndarray:
        """Weights of one model (default: the first) as ``[layers, heads, query, key]``."""
        return np.asarray(self.data["attention"][name or self.names[0]], dtype=np.float64)

    def diff(self) -> np.ndarray:
        """Second model minus first, ``[layers, heads, query, key]`` (what diff mode shows)."""
        if len(self.names) != 2:
            raise BertologyError("This view holds one model; diff needs two.")
        return self.attention(self.names[1]) - self.attention(self.names[0])

    def to_json(self) -> str:
        return json.dumps(self.data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))

    def html(self, title: str | None = None) -> str:
        """The standalone page."""
        return render_page(self.data, title)

    def fragment(self, element_id: str | None = None) -> str:
        """An embeddable fragment (a fresh unique element id unless one is given)."""
        return render_fragment(self.data, element_id or f"bertology-view-{uuid.uuid4().hex[:12]}")

    def save(self, path: str | os.PathLike) -> Path:
        """Write atomically: ``.json`` saves the data, anything else the standalone HTML page."""
        path = Path(path)
        atomic_write_text(path, self.to_json() if path.suffix.lower() == ".json" else self.html())
        return path

    def _repr_html_(self) -> str:
        return self.fragment()


def view(
    model: str | os.PathLike | LoadedModel,
    text: str,
    text_pair: str | None = None,
    compare: str | os.PathLike | LoadedModel | None = None,
    *,
    max_length: int = 128,
) -> AttentionView:
    """Load ``model`` (and ``compare``) by hub id, folder or ``minilm``, and view their attention.

    With ``compare`` the first model is shown as "base", the second as "tuned", and diff mode shows
    tuned − base.
    """
    def get(m: str | os.PathLike | LoadedModel) -> LoadedModel:
        return m if isinstance(m, LoadedModel) else load_model(m)

    models = [get(model)] + ([get(compare)] if compare is not None else [])
    return AttentionView(compute_view(models, text, text_pair, max_length=max_length))
