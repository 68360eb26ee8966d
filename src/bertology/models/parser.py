"""A biaffine dependency parser on a Hugging Face encoder (Dozat & Manning 2017, on BERT's last layer).

:class:`BiaffineParser` wraps the real encoder (so every hook, adapter and surgery of bertology still
finds its blocks: :attr:`BiaffineParser.base_model` is the encoder and :attr:`BiaffineParser.config`
its config) and adds the parser's head: four MLPs reduce each token's last-layer vector to a
dependent and a head representation for arcs and for labels, a biaffine scorer gives every
(dependent, head) pair an arc score, a second one gives every pair a score per label.

The head scores *token* pairs: position 0 (``[CLS]``) stands for the root, and a word is read from its
first piece. Which tokens are words' first pieces is not the model's business: the parsing task
(:mod:`bertology.tasks.parsing`) places each word's gold head and label on its first piece and masks
the other columns. The forward returns one tensor ``logits [B, T, T, 1 + L]``: ``[..., 0]`` the arc
score of dependent ``i`` taking head ``j``, ``[..., 1:]`` the label scores of that arc.

Saved as an ordinary Hugging Face encoder folder (``config.json``, ``model.safetensors``, the tokenizer)
plus :data:`HEAD_WEIGHTS` (the head, safetensors) and :data:`HEAD_CONFIG` (label set and sizes): the
folder loads as a plain encoder anywhere, and as the parser in :func:`bertology.models.loading.load_model`.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from bertology.errors import BertologyError

HEAD_WEIGHTS = "parser_head.safetensors"
HEAD_CONFIG = "parser_config.json"


@dataclass(frozen=True)
class ParserConfig:
    """The parser head's settings: the dependency labels (index = label id) and the layer sizes.

    Dozat & Manning (2017) use 500-unit arc MLPs, 100-unit label MLPs, leaky ReLU (slope 0.1) and
    dropout 0.33; those are the defaults.
    """

    labels: tuple[str, ...]
    hidden_size: int
    arc_dim: int = 500
    label_dim: int = 100
    dropout: float = 0.33

    def to_dict(self) -> dict:
        d = asdict(self)
        d["labels"] = list(self.labels)
        return {"kind": "biaffine_parser", "version": 1, **d}

    @classmethod
    def from_dict(cls, d: dict) -> "ParserConfig":
        return cls(labels=tuple(d["labels"]), hidden_size=int(d["hidden_size"]), arc_dim=int(d["arc_dim"]),
                   label_dim=int(d["label_dim"]), dropout=float(d["dropout"]))


class MLP(nn.Sequential):
    """Linear -> leaky ReLU (0.1) -> dropout: Dozat & Manning's reduction of a token vector."""

    def __init__(self, d_in: int, d_out: int, dropout: float) -> None:
        super().__init__(nn.Linear(d_in, d_out), nn.LeakyReLU(0.1), nn.Dropout(dropout))


class Biaffine(nn.Module):
    """``s[b, i, j, o] = [x_i; 1]ᵀ U_o [y_j; 1]`` (the 1s only where ``bias_x`` / ``bias_y``).

    With ``bias_x`` the appended 1 of the dependent gives a head-only term (the prior of a word being a
    head), with ``bias_y`` a dependent-only term; both together give the full biaffine label scorer.
    Initialised to zero, as in Dozat & Manning's code.
    """

    def __init__(self, d: int, n_out: int, *, bias_x: bool, bias_y: bool) -> None:
        super().__init__()
        self.bias_x, self.bias_y = bias_x, bias_y
        self.weight = nn.Parameter(torch.zeros(n_out, d + bias_x, d + bias_y))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.bias_x:
            x = torch.cat([x, x.new_ones(*x.shape[:-1], 1)], -1)
        if self.bias_y:
            y = torch.cat([y, y.new_ones(*y.shape[:-1], 1)], -1)
        return torch.einsum("bxi,oij,byj->bxyo", x, self.weight, y)


class ParserHead(nn.Module):
    """The MLPs and biaffine scorers above the encoder's last layer."""

    def __init__(self, cfg: ParserConfig) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.arc_dep, self.arc_head = MLP(h, cfg.arc_dim, cfg.dropout), MLP(h, cfg.arc_dim, cfg.dropout)
        self.label_dep, self.label_head = MLP(h, cfg.label_dim, cfg.dropout), MLP(h, cfg.label_dim, cfg.dropout)
        self.arc = Biaffine(cfg.arc_dim, 1, bias_x=True, bias_y=False)
        self.label = Biaffine(cfg.label_dim, len(cfg.labels), bias_x=True, bias_y=True)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[B, T, T, 1 + L]``: arc score then label scores of dependent ``i`` with head ``j``."""
        arc = self.arc(self.arc_dep(hidden), self.arc_head(hidden))
        label = self.label(self.label_dep(hidden), self.label_head(hidden))
        return torch.cat([arc, label], -1)


@dataclass
class ParserOutput:
    """What the parser's forward returns (``.logits``, like a Hugging Face task model)."""

    logits: torch.Tensor


class BiaffineParser(nn.Module):
    """A Hugging Face encoder plus a :class:`ParserHead` on its last hidden state.

    ``config`` and ``base_model`` are the encoder's, so :mod:`bertology.models.sites` resolves blocks,
    attention and heads exactly as for a ``*ForSequenceClassification`` model.
    """

    def __init__(self, encoder: nn.Module, parser_config: ParserConfig) -> None:
        super().__init__()
        if int(encoder.config.hidden_size) != parser_config.hidden_size:
            raise BertologyError(f"The parser head expects hidden size {parser_config.hidden_size}, "
                                 f"the encoder has {encoder.config.hidden_size}.")
        self.encoder = encoder
        self.parser_config = parser_config
        self.head = ParserHead(parser_config)

    @property
    def config(self):
        return self.encoder.config

    @property
    def base_model(self) -> nn.Module:
        return self.encoder

    @property
    def labels(self) -> tuple[str, ...]:
        return self.parser_config.labels

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> ParserOutput:
        kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            kwargs["token_type_ids"] = token_type_ids
        hidden = self.encoder(**kwargs).last_hidden_state
        return ParserOutput(self.head(hidden))

    def save_pretrained(self, folder: str | Path, safe_serialization: bool = True) -> None:
        """The encoder as a Hugging Face folder, plus the head's weights and config beside it."""
        self.encoder.save_pretrained(folder, safe_serialization=True)
        save_head(self, folder)

    def load_folder_weights(self, folder: str | Path) -> None:
        """Load the encoder and head weights of a folder written by :meth:`save_pretrained` (resuming a checkpoint)."""
        from safetensors.torch import load_file

        folder = Path(folder)
        enc_state: dict = {}
        for f in sorted(folder.glob("*.safetensors")):
            if f.name != HEAD_WEIGHTS:
                enc_state.update(load_file(str(f)))
        missing, unexpected = self.encoder.load_state_dict(enc_state, strict=False)
        tied = set(getattr(self.encoder, "_tied_weights_keys", None) or [])
        missing = [k for k in missing if k not in tied]
        if missing or unexpected:
            raise BertologyError(f"Checkpoint {folder} does not fit the parser's encoder (missing {missing[:3]}, "
                                 f"unexpected {unexpected[:3]}); pass --overwrite to start again.")
        load_head(self, folder)


def save_head(parser: BiaffineParser, folder: str | Path) -> None:
    """The parser's head (:data:`HEAD_WEIGHTS`) and its config (:data:`HEAD_CONFIG`) into ``folder``: beside the
    encoder of a full parser folder, or beside the encoder's PEFT adapter (``finetune --method lora``)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    save_file({k: v.detach().contiguous().cpu() for k, v in parser.head.state_dict().items()}, str(folder / HEAD_WEIGHTS))
    (folder / HEAD_CONFIG).write_text(json.dumps(parser.parser_config.to_dict(), indent=2))


def load_head(parser: BiaffineParser, folder: str | Path) -> None:
    """The head weights :func:`save_head` wrote into ``folder``, into ``parser``'s head (resuming a checkpoint)."""
    from safetensors.torch import load_file

    parser.head.load_state_dict(load_file(str(Path(folder) / HEAD_WEIGHTS)))


def is_parser_folder(folder: str | Path) -> bool:
    """Whether a model folder holds a saved parser head beside its encoder."""
    folder = Path(folder)
    return (folder / HEAD_CONFIG).is_file() and (folder / HEAD_WEIGHTS).is_file()


def read_parser_config(folder: str | Path) -> ParserConfig:
    """The head config of a parser folder; one clear error when it is unreadable."""
    path = Path(folder) / HEAD_CONFIG
    try:
        return ParserConfig.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise BertologyError(f"{path} is not a parser head config ({err}); re-save the parser.") from None


def attach_saved_head(encoder: nn.Module, folder: str | Path) -> BiaffineParser:
    """The parser of a folder: ``encoder`` (already loaded from it) plus the head saved beside it, in eval mode."""
    from safetensors.torch import load_file

    parser = BiaffineParser(encoder, read_parser_config(folder))
    try:
        parser.head.load_state_dict(load_file(str(Path(folder) / HEAD_WEIGHTS)))
    except (RuntimeError, OSError) as err:
        raise BertologyError(f"{Path(folder) / HEAD_WEIGHTS} does not fit its {HEAD_CONFIG} ({err}).") from None
    return parser.eval()
