"""How model inputs are written from context, question, answer and prompt.

Training scripts import these functions so a model is served with exactly the
text layout it was trained on. Each model directory records its template in
the manifest (`template`), so a user-supplied model (e.g. LettuceDetect) can
declare its own layout without code changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

# LettuceDetect (KRLabsOrg/lettucedect-*-modernbert-en-v1): its English QA prompt
# (lettucedetect/prompts/qa_prompt_en.txt), passages written "passage N: text" and
# joined with a newline, then the tokenizer pair (prompt, answer). Use it in a
# hand-written manifest for those models (see docs/inference.md).
LETTUCEDETECT_TEMPLATE: dict[str, str] = {
    "first": (
        "Briefly answer the following question:\n{question}\n"
        "Bear in mind that your response should be strictly based on the following "
        "{num_passages} passages:\n{context}\n"
        "In case the passages do not contain the necessary information to answer the question, "
        'please reply with: "Unable to answer based on given passages."\noutput:'
    ),
    "second": "{answer}",
    "passage": "passage {index}: {text}",
    "passage_separator": "\n",
    "no_question": "",
}


@dataclass(frozen=True, slots=True)
class RenderedFirst:
    """The first segment of a detector pair and where its context sits in it."""

    text: str
    context_start: int  # character range of the rendered passages inside `text`
    context_end: int


def render_passages(template: Mapping[str, str], context: Sequence[str]) -> str:
    """Join grounding passages with the template's passage format and separator."""
    fmt = template.get("passage", "{text}")
    sep = template.get("passage_separator", "\n\n")
    return sep.join(
        fmt.replace("{index}", str(i + 1)).replace("{text}", p) for i, p in enumerate(context) if p
    )


def _fill(fmt: str, values: Mapping[str, str]) -> str:
    """str.format without choking on braces inside user text (values are inserted verbatim)."""
    out = fmt
    for key, value in values.items():
        out = out.replace("{" + key + "}", value)
    return out


def render_detector_first(
    template: Mapping[str, str], context: Sequence[str], question: str | None
) -> RenderedFirst:
    """First segment = template['first'] with passages + question filled in.

    The context is inserted last so its character range is known exactly; that
    range is what the windowing code slides over.
    """
    first = template["first"]
    q = question if question else template.get("no_question", "")
    n = str(sum(1 for p in context if p))
    head, tail = first.split("{context}", 1)
    head = _fill(head, {"question": q, "num_passages": n})
    tail = _fill(tail, {"question": q, "num_passages": n})
    passages = render_passages(template, context)
    return RenderedFirst(head + passages + tail, len(head), len(head) + len(passages))


def render_prompt(template: Mapping[str, str], prompt: str) -> str:
    """Sentinel input: the template's `first` with {prompt} filled in."""
    return _fill(template["first"], {"prompt": prompt})


def sentinel_prompt(last_user: str, system: str | None = None, include_system: bool = False) -> str:
    """The text the sentinel classifies (config: truthlens.sentinel_include_system_prompt)."""
    if include_system and system:
        return f"{system}\n\n{last_user}"
    return last_user


def sentinel_text(prompt: str, system: str | None = None) -> str:
    """Training-side alias: the sentinel input with the system prompt included when given."""
    return sentinel_prompt(prompt, system, include_system=system is not None)


def nli_pair(premise: str, hypothesis: str) -> tuple[str, str]:
    """Explainer input: (grounding context, sentence holding the span). Serving windows long premises."""
    return premise, hypothesis
