"""Answer accuracy: one normalisation and one set of metrics for evaluation, training rewards and re-scoring.

Papers in this field report EM, F1 and "accuracy" computed in slightly different ways, which makes their
numbers hard to compare. Everything in this project (``agentic-rag eval``, ``agentic-rag score``, the
trainer's accuracy rewards) calls the functions below, so a number means the same thing everywhere.

**Normalisation** (:func:`normalize_answer`, the SQuAD v1.1 evaluation script's rule, applied to prediction
and gold alike, in this order):

1. lowercase;
2. remove ASCII punctuation (Python's ``string.punctuation``; the characters are deleted, not replaced by
   spaces, so ``"U.S."`` becomes ``"us"`` and ``"Jean-Luc"`` becomes ``"jeanluc"``);
3. remove the articles ``a``, ``an``, ``the`` as whole words;
4. collapse runs of whitespace to one space and strip the ends.

**Metrics.** Each takes ``(prediction, golds)`` where ``golds`` is one gold answer or a list of acceptable
ones (aliases), and returns the best score over the golds as a float in [0, 1]. A ``None`` prediction (no
answer was given) scores 0. No gold at all is a caller error and raises ``ValueError``.

* :func:`exact_match` (EM): normalised prediction == normalised gold.
* :func:`f1_score`: token-level F1 between the normalised prediction and gold, tokens split on whitespace
  (SQuAD); additionally every CJK character is its own token, so Chinese answers get a meaningful F1 (this
  changes nothing for text without CJK characters). As in HotpotQA's official evaluation script
  (``hotpot_evaluate_v1.py``), when the normalised prediction or the normalised gold is ``yes``, ``no`` or
  ``noanswer`` and the two differ, the F1 is 0: "yes it is" against "yes" scores 0, not 0.5.
* :func:`cover_exact_match` (cover-EM, R1-Searcher's ACC_R, FlashRAG's ``acc``): the normalised gold is a
  substring of the normalised prediction. A gold that normalises to the empty string only covers an empty
  prediction. Meant for evaluation, to compare with published numbers; as a training reward it pays
  "nothing" for the gold "no" and answers that list several candidates ("Paris or Lyon"), which a policy
  learns to exploit (the config check warns).
* :func:`cover_exact_match_tokens` (``cover_em_tokens``): cover-EM on tokens, for training. The prediction
  covers a gold when all of these hold (tokens as for F1):

  1. the gold's tokens occur in the prediction's tokens as one contiguous run ("no" is not in "nothing");
  2. the prediction has at most ``max_extra_tokens`` (default 3) tokens more than the gold
     ("it was Nidal Malik Hasan" passes, a sentence around the answer does not);
  3. the prediction holds no more list separators than the gold, counted in the text before normalisation:
     ``,`` (except between digits, a thousands separator), ``;``, ``/``, ``|``, ``、``, ``，``, ``；`` and the
     words ``or``, ``and``, ``nor`` ("Paris or Lyon" and "Paris, France" do not cover "Paris"; "Washington,
     D.C." covers itself);
  4. when the normalised prediction or gold is ``yes``, ``no`` or ``noanswer`` (HotpotQA's special answers),
     the two are equal ("yes it is" does not cover "yes").

  A gold that normalises to the empty string only covers an empty prediction, as for cover-EM.
* :func:`choice_accuracy`: for multiple-choice questions (MedQA): the option letter read from the
  prediction by :func:`extract_choice` equals the gold letter.

**Reading an option letter** (:func:`extract_choice`), first rule that applies wins; only letters that are
options count (``A``-``D`` when no options are given):

1. the whole prediction is a letter (either case), optionally bracketed or followed by ``.`` / ``:`` /
   ``)``: ``"B"``, ``"(b)"``, ``"B."``;
2. it starts with a letter marker: ``"(B) ..."``, ``"[B] ..."``, ``"B. ..."``, ``"B) ..."``, ``"B: ..."``;
3. it states a letter: ``"the answer is B"``, ``"Answer: (C)"``, ``"option D"``, ``"choice A"`` (the last
   such statement wins; the letter must be upper case, so the article in "the answer is a fever" is not
   read as option A);
4. its normalised text equals the normalised text of exactly one option;
5. the normalised text of exactly one option occurs in it.

Otherwise there is no letter (``None``) and the prediction scores 0.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Mapping, Sequence

__all__ = ["choice_accuracy", "cover_exact_match", "cover_exact_match_tokens", "exact_match", "extract_choice",
           "f1_score", "gold_choice", "normalize_answer"]

_PUNCTUATION = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
# CJK unified ideographs (+ extension A), kana, hangul: one token per character in F1
_CJK = re.compile(r"([\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff])")
DEFAULT_LETTERS = ("A", "B", "C", "D")
# HotpotQA's answers that only an exact match scores (hotpot_evaluate_v1.py)
SPECIAL_ANSWERS = frozenset({"yes", "no", "noanswer"})
COVER_MAX_EXTRA_TOKENS = 3
# what separates the items of a list, in text before normalisation (a comma between digits is a thousands
# separator)
_LIST_SEPARATORS = re.compile(r"(?<!\d),|,(?!\d)|[;/|、，；]|\b(?:or|and|nor)\b", re.IGNORECASE)


def normalize_answer(text: str | None) -> str:
    """SQuAD normalisation: lowercase, drop punctuation, drop articles, collapse whitespace."""
    if text is None:
        return ""
    text = str(text).lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _golds(golds: str | Sequence[str]) -> list[str]:
    if isinstance(golds, str):
        return [golds]
    out = [str(g) for g in golds if g is not None]
    if not out:
        raise ValueError("no gold answer to compare with")
    return out


def exact_match(prediction: str | None, golds: str | Sequence[str]) -> float:
    """1.0 when the normalised prediction equals a normalised gold, else 0.0."""
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in _golds(golds)))


def _tokens(normalized: str) -> list[str]:
    return _CJK.sub(r" \1 ", normalized).split()


def _f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)
    common = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred_tokens), common / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str | None, golds: str | Sequence[str]) -> float:
    """Best token-level F1 of the normalised prediction against each normalised gold; 0 against a gold where
    one side is yes/no/noanswer and the two differ (HotpotQA's rule)."""
    pred = normalize_answer(prediction)
    best = 0.0
    for g in _golds(golds):
        gold = normalize_answer(g)
        if (pred in SPECIAL_ANSWERS or gold in SPECIAL_ANSWERS) and pred != gold:
            continue
        best = max(best, _f1(_tokens(pred), _tokens(gold)))
    return best


def cover_exact_match(prediction: str | None, golds: str | Sequence[str]) -> float:
    """1.0 when a normalised gold is contained in the normalised prediction (R1-Searcher's ACC_R)."""
    pred = normalize_answer(prediction)
    for g in _golds(golds):
        gold = normalize_answer(g)
        if (gold and gold in pred) or (not gold and not pred):
            return 1.0
    return 0.0


def cover_exact_match_tokens(prediction: str | None, golds: str | Sequence[str], *,
                             max_extra_tokens: int = COVER_MAX_EXTRA_TOKENS) -> float:
    """1.0 when the prediction covers a gold token by token: a contiguous run, at most ``max_extra_tokens``
    more tokens, no more list separators than the gold, yes/no/noanswer only exactly (module docstring)."""
    if max_extra_tokens < 0:
        raise ValueError(f"max_extra_tokens must be >= 0, got {max_extra_tokens}")
    pred = normalize_answer(prediction)
    pred_tokens = _tokens(pred)
    pred_separators = len(_LIST_SEPARATORS.findall(prediction or ""))
    for g in _golds(golds):
        gold = normalize_answer(g)
        gold_tokens = _tokens(gold)
        if not gold_tokens:
            if not pred_tokens:
                return 1.0
            continue
        if pred in SPECIAL_ANSWERS or gold in SPECIAL_ANSWERS:
            if pred == gold:
                return 1.0
            continue
        if len(pred_tokens) - len(gold_tokens) > max_extra_tokens:
            continue
        if pred_separators > len(_LIST_SEPARATORS.findall(g)):
            continue
        n = len(gold_tokens)
        if any(pred_tokens[i:i + n] == gold_tokens for i in range(len(pred_tokens) - n + 1)):
            return 1.0
    return 0.0


# ------------------------------------------------------------------------------------------ multiple choice

_LETTER_ONLY = r"^\s*[(\[]?\s*([A-Z])\s*[)\]]?\s*[.:)]?\s*$"
_LEADING = r"^\s*(?:[(\[]\s*([A-Z])\s*[)\]]|([A-Z])\s*[.:)])(?:\s|$)"
_STATED = r"(?i:\b(?:answer|option|choice)\b)\s*(?i:is|:|=)?\s*(?i:option\s+)?[(\[]?\s*([A-Z])\b\s*[)\]]?(?![A-Za-z])"


def _letters(options: Mapping[str, str] | None) -> tuple[str, ...]:
    return tuple(str(k).strip().upper() for k in options) if options else DEFAULT_LETTERS


def extract_choice(prediction: str | None, options: Mapping[str, str] | None = None) -> str | None:
    """The option letter a prediction picks (see the module docstring for the rules), or None."""
    if prediction is None:
        return None
    text = str(prediction)
    letters = _letters(options)
    m = re.match(_LETTER_ONLY, text.upper())  # a lone letter may be lower case: "b"
    if m and m.group(1) in letters:
        return m.group(1)
    m = re.match(_LEADING, text)
    if m and (m.group(1) or m.group(2)) in letters:
        return m.group(1) or m.group(2)
    stated = [x for x in re.findall(_STATED, text) if x in letters]
    if stated:
        return stated[-1]
    if options:
        pred = normalize_answer(text)
        texts = {str(k).strip().upper(): normalize_answer(v) for k, v in options.items()}
        equal = [k for k, v in texts.items() if v and v == pred]
        if len(equal) == 1:
            return equal[0]
        inside = [k for k, v in texts.items() if v and v in pred]
        if len(inside) == 1:
            return inside[0]
    return None


def gold_choice(golds: str | Sequence[str], options: Mapping[str, str] | None = None) -> str:
    """The gold option letter: the first gold that is an option letter, else the option whose text equals a
    gold. Raises ValueError when neither exists (a data error, not a wrong answer)."""
    golds = _golds(golds)
    letters = _letters(options)
    for g in golds:
        if g.strip().upper() in letters and len(g.strip()) == 1:
            return g.strip().upper()
    if options:
        for g in golds:
            for k, v in options.items():
                if normalize_answer(v) and normalize_answer(v) == normalize_answer(g):
                    return str(k).strip().upper()
    raise ValueError(f"no gold option letter among {golds!r} (options {list(letters)})")


def choice_accuracy(prediction: str | None, golds: str | Sequence[str],
                    options: Mapping[str, str] | None = None) -> float:
    """1.0 when the letter read from the prediction is the gold letter (golds: the letter and/or the text)."""
    return float(extract_choice(prediction, options) == gold_choice(golds, options))
