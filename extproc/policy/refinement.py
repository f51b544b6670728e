"""When a standard-mode rewrite may replace the original answer: a small, explainable rule set.

A small LLM asked to "rewrite using only the context" often makes the answer worse: it refuses
("It is currently not possible to determine..."), talks about the task ("I made a change to the
original context..."), leaves template debris ("[Rewite]"), or wanders off the question. The
detector may even score such text low (a refusal claims nothing), so a lower score alone is not
enough. A rewrite replaces the answer only when

1. `rewrite_problem` finds none of the problems below, and
2. it was checked and scores strictly lower than the best answer so far (`better`).

Otherwise the best answer so far stays. Pure functions over strings and scores: the gateway
(`extproc/gateway/mitigation.py`) asks, counts and reports (`x-truthlens-refined`,
`x-truthlens-refine-rejected`, `truthlens_refinements_total`).

The problems, as the reasons reported:

    empty       no text
    refusal     declines to answer ("not possible to determine", "I cannot answer", "the context
                does not contain...", "I don't know")
    meta_text   talks about the task instead of answering ("the provided context", "the original
                answer", "I made a change", "Here is the corrected answer", "As an AI")
    artefact    bracketed or template debris: "[Rewite]", "[Answer]", "<|im_end|>", "</s>"
                (numeric citations such as "[1]", markdown links and "a[i]" are fine)
    off_topic   shares no content word with the question nor with the original answer

A phrase that the original answer already contained does not count against the rewrite (it is
the LLM's own style, not a symptom of the rewrite).
"""

from __future__ import annotations

import re

ACCEPTED = "accepted"
NOT_BETTER = "not_better"  # acceptable text, but its score is not lower than the best answer's
UPSTREAM_ERROR = "upstream_error"  # the re-ask failed (HTTP error, timeout, unusable reply)

_REFUSAL = re.compile(
    r"\b(?:"
    r"(?:not|n't|im)\s*possible\s+to\s+(?:determine|say|know|answer|tell|provide)"
    r"|(?:cannot|can\s*not|can't|unable\s+to|not\s+able\s+to)\s+(?:be\s+)?"
    r"(?:determine|determined|answer|answered|provide|say|tell|know|known|confirm|find|help)"
    r"|(?:does|do|did)\s*(?:not|n't)\s+(?:contain|provide|mention|include|specify|say|state|give)\s+"
    r"(?:any\s+|enough\s+|the\s+|this\s+|that\s+|such\s+)?(?:information|details|data|answer)"
    r"|(?:no|not\s+enough|insufficient)\s+(?:information|details|data)\s+(?:is\s+|was\s+)?"
    r"(?:available|provided|given|about|on|to|in|regarding)"
    r"|i\s+(?:do\s+not|don't)\s+know"
    r"|i(?:\s+am|'m)?\s+(?:sorry|apologi[sz]e)"
    r")",
    re.IGNORECASE,
)
_META = re.compile(
    r"(?:"
    r"\b(?:the|this|that)\s+(?:context|passages?)\b(?!\s+of\b)"
    r"|\b(?:provided|given|above|following)\s+(?:context|passages?|documents?|texts?|information)\b"
    r"|\b(?:original|previous|initial|above)\s+(?:answer|response|context)s?\b"
    r"|\bI(?:\s+have|'ve)?\s+(?:made\s+(?:a\s+|some\s+)?changes?|changed|corrected|rewritten|rewrote|revised|"
    r"updated|removed|edited)\b"
    r"|\b(?:here\s+is|here's)\s+(?:the|a|my|your)\s+(?:corrected|revised|rewritten|updated|new)\b"
    r"|\b(?:corrected|revised|rewritten|updated)\s+(?:answer|response|version)\b"
    r"|\bas\s+an\s+(?:ai|language\s+model)\b"
    r")",
    re.IGNORECASE,
)
# "[letters...]" not inside a word ("a[i]") nor a markdown link ("[text](url)"); chat-template tokens
_ARTEFACT = re.compile(r"(?<![\w\])])\[[^\]\n]{0,40}[A-Za-z][^\]\n]{0,40}\](?!\()|<\|[^|>\n]{1,40}\|>|</?s>")
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_STOPWORDS = frozenset(
    "a about above after again against all also am an and any are as at be because been before being below "
    "between both but by can could did do does doing down during each few for from further had has have having "
    "he her here hers him his how i if in into is it its itself just me more most my no nor not now of off on "
    "once only or other our ours out over own same she should so some such than that the their theirs them then "
    "there these they this those through to too under until up very was we were what when where which while who "
    "whom why will with would you your yours tell please give explain describe answer question".split()
)


def content_words(text: str | None) -> set[str]:
    """Lower-cased words that carry content: not stopwords, 3+ characters or a number; crude plural folding."""
    out = set()
    for word in _WORD.findall((text or "").lower()):
        if word in _STOPWORDS or (len(word) < 3 and not word.isdigit()):
            continue
        out.add(word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word)
    return out


def _new_match(pattern: re.Pattern[str], rewrite: str, original: str) -> bool:
    """The rewrite matches `pattern` with a phrase the original answer did not already contain."""
    seen = {m.group(0).lower() for m in pattern.finditer(original)}
    return any(m.group(0).lower() not in seen for m in pattern.finditer(rewrite))


def rewrite_problem(question: str | None, original: str, rewrite: str | None) -> str | None:
    """Why `rewrite` must not replace `original` (a reason above), or None if it is an acceptable answer."""
    if rewrite is None or not rewrite.strip():
        return "empty"
    rewrite, original = rewrite.replace("\u2019", "'"), original.replace("\u2019", "'")
    if _new_match(_REFUSAL, rewrite, original):
        return "refusal"
    if _new_match(_META, rewrite, original):
        return "meta_text"
    if _new_match(_ARTEFACT, rewrite, original):
        return "artefact"
    words = content_words(rewrite)
    anchors = content_words(question) | content_words(original)
    if anchors and not words & anchors:
        return "off_topic"
    return None


def better(rewrite_score: float, best_score: float) -> bool:
    """A checked rewrite replaces the best answer so far only when it scores strictly lower."""
    return rewrite_score < best_score
