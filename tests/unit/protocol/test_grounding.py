"""Grounding documents where RAG apps put them (extproc.protocol.grounding), and parse_chat_request's use of them."""

from __future__ import annotations

import json
import time
import timeit

import pytest

from extproc.config import default_config
from extproc.protocol.grounding import MAX_MARKS, GroundingRules, GroundingSettings
from extproc.protocol.openai import parse_chat_request


def settings(**changes: object) -> GroundingSettings:
    g = default_config().truthlens.grounding  # the schema's defaults: this module has none of its own
    values = dict(system_prompt=g.system_prompt, user_sections=g.user_sections, tool_results=g.tool_results,
                  context_field=g.context_field, section_labels=g.section_labels,
                  question_labels=g.question_labels, tags=g.tags, patterns=g.patterns)
    return GroundingSettings(**{**values, **changes})  # type: ignore[arg-type]


RULES = GroundingRules(settings())
TOWER = "The Eiffel Tower is 330 metres tall. It stands in Paris."


@pytest.mark.parametrize(
    ("text", "documents", "question"),
    [
        # labelled sections
        (f"Context: {TOWER}\nQuestion: How tall is it?", [TOWER], "Question: How tall is it?"),
        (f"Context: {TOWER} Question: How tall is it?", [TOWER], "Question: How tall is it?"),
        (f"Answer from the context. Context: {TOWER} Question: How tall?", [TOWER],
         "Answer from the context.\nQuestion: How tall?"),
        (f"**Sources:**\n{TOWER}\n\nQUESTION: how tall?", [TOWER], "QUESTION: how tall?"),
        (f"## Documents\n{TOWER}\n\n## Question\nHow tall?", [TOWER], "## Question\nHow tall?"),
        (f"Document 1: {TOWER}\nDocument 2: Built in 1889.\nQuery: when?", [TOWER, "Built in 1889."], "Query: when?"),
        (f"Use the following pieces of context to answer:\n{TOWER}\n\nHow tall is it?", [TOWER], "How tall is it?"),
        (f"Documents:\n{TOWER}\n\nSummarize it in one line.", [TOWER], "Summarize it in one line."),
        ("Context information is below.\n-----\n" + TOWER + "\n-----\nGiven the context, answer the query.\n"
         "Query: How tall?\nAnswer: ", [TOWER], "Given the context, answer the query.\nQuery: How tall?\nAnswer:"),
        # XML-like tags
        (f"<documents>{TOWER}</documents>\nHow tall is it?", [TOWER], "How tall is it?"),
        (f'<documents>\n<document index="1">{TOWER}</document>\n<document index="2">Built in 1889.</document>\n'
         "</documents>\nHow tall is it?", [TOWER, "Built in 1889."], "How tall is it?"),
        (f"How tall is it?\n<context>\n{TOWER}\n</context>", [TOWER], "How tall is it?"),
        (f"<document><source>a.pdf</source>\n<document_content>{TOWER}</document_content></document>\nHow tall?",
         [f"<source>a.pdf</source>\n<document_content>{TOWER}</document_content>"], "How tall?"),
        # numbered sources
        (f"[1] {TOWER}\n[2] It was built in 1889.\n\nHow tall is it?", [TOWER, "It was built in 1889."],
         "How tall is it?"),
        (f"Sources:\n[1] {TOWER}\n[2] It was built in 1889.\nQuestion: How tall?", [TOWER, "It was built in 1889."],
         "Question: How tall?"),
        (f"[Doc 1] {TOWER}\n[Doc 2] Built in 1889.\nQ: How tall?", [TOWER, "Built in 1889."], "Q: How tall?"),
        # fenced blocks
        (f"Here is the text:\n```\n{TOWER}\n```\nHow tall is it?", [TOWER], "Here is the text:\nHow tall is it?"),
        (f"```markdown\n{TOWER}\n```\nHow tall?", [TOWER], "How tall?"),
    ],
)
def test_layouts(text: str, documents: list[str], question: str) -> None:
    assert RULES.split(text) == (documents, question)


@pytest.mark.parametrize(
    "text",
    [
        "How tall is the Eiffel Tower?",
        "You are a helpful assistant. Be concise.",
        "What time is it: now or later?",
        "In this context: what does X mean?",  # lower-case mid-line: a phrase, not a label
        "Why does this fail?\n```python\nprint(x)\n```",  # code is not a document
        "Always cite the following sources.",  # a lead-in with nothing after it
        "Compare [1, 2] and [3].",
        "Use <b>bold</b> here",
        "Context:",
        "Question: what is the context of this quote?",
    ],
)
def test_text_without_a_document_layout_is_left_alone(text: str) -> None:
    assert RULES.split(text) == ([], text)


def test_a_system_prompt_keeps_its_last_paragraph() -> None:
    text = f"Use the following context.\nContext:\n{TOWER}\n\nIs it tall?"
    assert RULES.split(text, question=False) == ([f"{TOWER}\n\nIs it tall?"], "Use the following context.")
    assert RULES.split(text) == ([TOWER], "Use the following context.\n\nIs it tall?")


def test_langchain_system_prompt_framing_is_not_a_document() -> None:
    system = ("Use the following pieces of context to answer the user's question.\nIf you don't know the answer, "
              f"just say that you don't know.\n----------------\n{TOWER}")
    assert RULES.split(system, question=False) == ([TOWER], "")


def test_user_patterns_come_first_and_labels_are_configurable() -> None:
    rules = GroundingRules(settings(patterns=(r"(?s)BEGIN DOCS\n(?P<doc>.*?)\nEND DOCS",),
                                    section_labels=("kb",), question_labels=("ask",)))
    assert rules.split(f"BEGIN DOCS\n{TOWER}\nEND DOCS\nHow tall?") == ([TOWER], "How tall?")
    assert rules.split(f"KB: {TOWER}\nAsk: how tall?") == ([TOWER], "Ask: how tall?")
    assert rules.split(f"Context: {TOWER}\nQuestion: how tall?")[0] == []  # not a label any more
    assert GroundingRules(settings(patterns=(r"<<(.*?)>>",))).split("<<a doc>> q?") == (["a doc"], "q?")


def test_a_request_without_documents_stays_cheap() -> None:
    """The common prompt has no marker character: one scan, no regex (see the report for numbers)."""
    text = "How tall is the Eiffel Tower, and when was it built?"
    per_call = min(timeit.repeat(lambda: RULES.split(text), number=2000, repeat=3)) / 2000
    assert per_call < 10e-6  # ~0.2 us measured; generous for a loaded shared machine


# ---- parse_chat_request --------------------------------------------------------------------------


def body(messages: list[dict], **extra: object) -> bytes:
    return json.dumps({"model": "m", "messages": messages, **extra}).encode()


CONVERSATION = [
    {"role": "system", "content": f"You answer from the documents.\n<documents>{TOWER}</documents>"},
    {"role": "user", "content": "Context: Paris is the capital of France.\nQuestion: What is the capital?"},
    {"role": "assistant", "content": "Context: an assistant turn is never grounding. Paris."},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function",
                                                          "function": {"name": "f", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "c", "content": "It opened in 1889."},
    {"role": "user", "content": "[1] The tower has three levels.\n\nHow many levels does it have?"},
]


def test_documents_from_the_whole_conversation_in_order() -> None:
    req = parse_chat_request(body(CONVERSATION, truthlens_context=["From the field."]), grounding=RULES)
    assert req.context == (TOWER, "Paris is the capital of France.", "It opened in 1889.",
                           "The tower has three levels.", "From the field.")
    assert req.question == "How many levels does it have?"
    assert req.system_prompt == "You answer from the documents."
    assert (req.text_documents, req.rag_documents) == (3, 1)


@pytest.mark.parametrize(
    ("off", "missing"),
    [
        ("system_prompt", TOWER),
        ("user_sections", "The tower has three levels."),
        ("tool_results", "It opened in 1889."),
        ("context_field", "From the field."),
    ],
)
def test_each_source_can_be_switched_off(off: str, missing: str) -> None:
    req = parse_chat_request(body(CONVERSATION, truthlens_context=["From the field."]),
                             grounding=GroundingRules(settings(**{off: False})))
    assert missing not in req.context and len(req.context) == (3 if off == "user_sections" else 4)
    assert req.upstream_body is not None and b"truthlens_context" not in req.upstream_body  # removed either way
    if off == "user_sections":
        assert req.question == CONVERSATION[-1]["content"]


def test_without_rules_only_tool_results_and_the_field_count() -> None:
    req = parse_chat_request(body(CONVERSATION))
    assert req.context == ("It opened in 1889.",) and req.text_documents == 0


def test_a_plain_system_prompt_is_not_grounding() -> None:
    req = parse_chat_request(body([{"role": "system", "content": "You are a helpful assistant."},
                                   {"role": "user", "content": "How tall is the Eiffel Tower?"}]), grounding=RULES)
    assert not req.grounded and req.system_prompt == "You are a helpful assistant."
    assert req.question == "How tall is the Eiffel Tower?"


@pytest.mark.parametrize("unit", ["<context>", "<document a", "```python\n", "Context: x\n", "[1] x\n", "</documents>",
                                  "Use the following context:\n", ". Context: x", "Context is below.\n", "-----\n"])
def test_hostile_text_costs_linear_time_and_bounded_work(unit: str) -> None:
    """4 MB of one layout mark repeated (unclosed tags, fences, labels...): linear scans, and past
    MAX_MARKS marks the message is left whole instead of being parsed into hundreds of thousands of parts."""
    text = unit * (4 * 1024 * 1024 // len(unit))
    t0 = time.perf_counter()
    documents, question = RULES.split(text)
    assert time.perf_counter() - t0 < 2.0  # ~0.1 s measured; quadratic would be hours
    assert documents == [] and question == text


def test_many_documents_below_the_mark_limit_are_all_found() -> None:
    text = "".join(f"<document>fact {i}.</document>\n" for i in range(MAX_MARKS // 2 - 1)) + "Which fact?"
    documents, question = RULES.split(text)
    assert len(documents) == MAX_MARKS // 2 - 1 and question == "Which fact?"


def test_nested_and_stray_tags_pair_on_a_stack() -> None:
    assert RULES.split("</document> <documents><document>a</document> <document>b</document></documents> q?") == (
        ["a", "b"], "</document>\nq?")
    assert RULES.split("<context>outer <context>inner</context> tail</context> q?") == (
        ["outer <context>inner</context> tail"], "q?")
    assert RULES.split("<context>never closed q?") == ([], "<context>never closed q?")
