"""Grounding documents where RAG apps put them: the layouts a chat message can carry documents in.

Pure text parsing (no config import, no model code). The gateway builds `GroundingSettings` from
`truthlens.grounding` once per process and compiles them into `GroundingRules`; `parse_chat_request`
(extproc.protocol.openai) asks the rules to split each system prompt and user turn into documents and
the text outside them (for the last user turn: the question).

Layouts, tried in this order (a later one never looks inside what an earlier one took):

1. `patterns`: the user's regular expressions; the document is the group named `doc` (else group 1,
   else the whole match); the whole match leaves the question.
2. XML-like tags (`tags`): `<context>…</context>`, `<documents>…</documents>`, `<document index="1">…`.
   A tag whose content is only other listed tags (`<documents><document>…</document>…</documents>`)
   gives one document per child; otherwise its content is one document.
3. Fenced blocks (```` ``` ````) without an info string or with a text-like one (`text`, `txt`,
   `markdown`, `md`, `plain`, `context`, `document`, `documents`, `source`, `sources`): code blocks
   with a language are not documents (an answer explains code, it is not grounded in it).
4. Labelled sections: a line starting with a `section_labels` label and a colon (`Context:`,
   `**Sources:**`, `Document 2:`; case-insensitive; the text may follow on the same line), a markdown
   heading (`## Documents`), a lead-in line naming one after "following" and ending in a colon or
   a full stop (`Use the following pieces of context to answer:`) or ending in "below" (`Context
   information is below.`), or, mid-line after a sentence end, a capitalised label
   (`… question. Context: …`).
   The section runs until a `question_labels` label (`Question:`, `Query:`, at a line start or,
   capitalised, after a space), the next section, a markdown heading, an explicit layout above, or
   the end. Content framed by rule lines (`-----`) ends at the closing rule.
5. Numbered sources: lines starting `[1]`, `[2]`, … (or `[Doc 1]`, `[Source 1]`), from `[1]` (or
   `[0]`) on, alone or inside a labelled section: one document per entry.

A section that runs to the end of the message gives its last paragraph back as the question when
that paragraph ends with `?` or nothing else is left outside the documents. Text without any of
these layouts is not a document (a system prompt "You are a helpful assistant" stays a system
prompt). Documents keep their text as written, stripped of surrounding whitespace; empty ones are
dropped.

Any input costs linear time: tags pair on a stack, fences pair line by line, sections end at the
next limit found by bisection; a message with more than MAX_MARKS layout marks of one kind (tags,
fence lines, labels, entries) is left whole instead of being split into that many parts.
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["GroundingRules", "GroundingSettings", "TEXT_FENCE_INFO"]

TEXT_FENCE_INFO = frozenset({"", "text", "txt", "markdown", "md", "plain", "context", "document", "documents",
                             "source", "sources"})

_RULE_LINE = re.compile(r"^[ \t]*(?:-{3,}|={3,}|_{3,}|\*{3,})[ \t]*$", re.MULTILINE)
_FENCE_LINE = re.compile(r"^[ \t]*```[ \t]*([A-Za-z0-9_+.-]*)([^\n]*)$", re.MULTILINE)
_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")
_NUMBERED_BODY = r"[ \t]*\[(?:(?:doc(?:ument)?|source|passage)[ \t]*)?(\d{1,3})\][ \t]*[:.)-]?[ \t]*"
_NUMBERED_FIRST = re.compile(_NUMBERED_BODY, re.IGNORECASE)
_NUMBERED_NL = re.compile(r"\n" + _NUMBERED_BODY, re.IGNORECASE)
_BLANK_RUNS = re.compile(r"\n[ \t]*(?:\n[ \t]*)+")


@dataclass(frozen=True, slots=True)
class GroundingSettings:
    """Plain values from `truthlens.grounding` (no defaults here: they live in the config schema)."""

    system_prompt: bool  # documents in system/developer messages count
    user_sections: bool  # documents in user turns count (and leave the question)
    tool_results: bool  # role tool / function messages count
    context_field: bool  # the rag_context_field documents count
    section_labels: tuple[str, ...]
    question_labels: tuple[str, ...]
    tags: tuple[str, ...]
    patterns: tuple[str, ...]


def _alternatives(labels: tuple[str, ...]) -> str:
    """Longest first, whitespace inside a label matches any run of spaces."""
    words = sorted({" ".join(label.split()) for label in labels if label.strip()}, key=len, reverse=True)
    return "|".join(r"[ \t]+".join(re.escape(w) for w in label.split(" ")) for label in words)


def _capitalised(labels: tuple[str, ...]) -> tuple[str, ...]:
    out = set()
    for label in labels:
        label = " ".join(label.split())
        if label:
            out |= {label[0].upper() + label[1:], label.upper()}
    return tuple(out)


class GroundingRules:
    """`GroundingSettings` compiled once; `split(text)` is the per-message work."""

    __slots__ = ("settings", "_patterns", "_tags", "_tag_names", "_labels", "_boundaries", "_probes")

    def __init__(self, settings: GroundingSettings) -> None:
        self.settings = settings
        self._patterns = tuple(re.compile(p) for p in settings.patterns)
        tags = sorted({t.lower() for t in settings.tags}, key=len, reverse=True)
        self._tag_names = frozenset(tags)
        # one linear scan for every opening and closing tag (attributes bounded); pairs are matched on a stack
        self._tags = re.compile(r"<(/?)(" + "|".join(re.escape(t) for t in tags) + r")(?:\s[^<>]{0,1000})?>",
                                re.IGNORECASE) if tags else None
        docs = _alternatives(settings.section_labels)
        docs_cap = _alternatives(_capitalised(settings.section_labels))
        questions = _alternatives(settings.question_labels)
        questions_cap = _alternatives(_capitalised(settings.question_labels))
        self._labels: list[_Finder] = []
        if docs:
            self._labels += [
                # `Context:` / `**Sources:**` / `## Documents:` / `Document 2:` at a line start
                _Finder.lines(rf"[ \t]*(?:\#{{1,6}}[ \t]*)?[*_]{{0,2}}(?:{docs})(?:[ \t]+\d{{1,3}})?[*_]{{0,2}}[ \t]*[:：]"
                              rf"[*_]{{0,2}}[ \t]*", re.IGNORECASE, guard=(":", "：")),
                # `## Documents` heading
                _Finder.lines(rf"[ \t]*\#{{1,6}}[ \t]+(?:{docs})[ \t]*(?:\n|\Z)", re.IGNORECASE, guard=("#",)),
                # `Use the following pieces of context:` lead-in line
                _Finder.lines(rf"[^\n]{{0,200}}?\bfollowing(?:[ \t]+[\w'-]+){{0,3}}?[ \t]+(?:{docs})\b[^\n]{{0,200}}?"
                              rf"[:：.][ \t]*(?:\n|\Z)", re.IGNORECASE, lower_guard="following"),
                # `Context information is below.` lead-in line (LlamaIndex's template)
                _Finder.lines(rf"[^\n]{{0,200}}?\b(?:{docs})\b[^\n]{{0,80}}?\bbelow[ \t]*[.:：]?[ \t]*(?:\n|\Z)",
                              re.IGNORECASE, lower_guard="below"),
                # `... question. Context: ...` mid-line, capitalised
                _Finder(re.compile(rf"[.!?][ \t](?:{docs_cap})[ \t]*:[ \t]*"), 2, guard=(":",)),
            ]
        self._boundaries: list[_Finder] = [_Finder.lines(r"[ \t]*\#{1,6}[ \t]", 0, guard=("#",))]
        if questions:
            self._boundaries += [
                _Finder.lines(rf"[ \t]*[*_]{{0,2}}(?:{questions})[*_]{{0,2}}[ \t]*[:：]", re.IGNORECASE,
                              guard=(":", "：")),
                _Finder(re.compile(rf"\s(?:{questions_cap})[ \t]*:"), 1, guard=(":",)),
            ]
        # without one of these (and no user pattern) no layout can be present: a cheap test first
        # every section label starts with one of these words: without one, no label finder can match
        self._probes = tuple(sorted({label.split()[0].lower() for label in settings.section_labels if label.split()}))

    # ---- public -------------------------------------------------------------------------------

    def split(self, text: str, question: bool = True) -> tuple[list[str], str]:
        """(documents in text order, the text outside them with blank runs folded). No layout: ([], text).

        `question`: the text is a user turn, whose unclosed last section may hold the question.
        """
        if (not self._patterns and ":" not in text and "[" not in text and "<" not in text and "#" not in text
                and "```" not in text and "：" not in text and "ollowing" not in text and "elow" not in text
                and "OLLOWING" not in text and "ELOW" not in text):
            return [], text  # the common prompt: no layout can be present (checked without a regex)
        try:
            return self._split(text, question)
        except _TooMany:  # not a prompt anyone writes: left whole rather than parsed at length
            return [], text

    def _split(self, text: str, question: bool) -> tuple[list[str], str]:
        taken = _Taken()  # (start, end, documents) removed from the text, kept sorted
        for pattern in self._patterns:
            for m in _limited(pattern.finditer(text)):
                if m.end() > m.start():
                    taken.add(m.start(), m.end(), [_doc_group(m)])
        if self._tags is not None and "<" in text:
            for start, end, docs in self._tag_regions(text):
                taken.add(start, end, docs)
        if "```" in text:
            for start, end, docs in _fenced_regions(text):
                taken.add(start, end, docs)
        open_end = self._sections(text, taken)
        regions = taken.regions
        if not any(d.strip() for t in regions for d in t[2]):
            return [], text
        rest, docs_out = self._assemble(text, regions)
        if open_end is not None and question:
            docs_out, rest = self._give_back_question(regions, regions.index(open_end), rest)
        return [d for d in (s.strip() for s in docs_out) if d], _fold(rest)

    # ---- layouts ------------------------------------------------------------------------------

    def _tag_regions(self, text: str) -> list[tuple[int, int, list[str]]]:
        """Outermost listed tags: one document per child tag when the content is only such children, else
        the content. Linear: one scan, pairs matched on a stack (an unclosed tag is ignored)."""
        assert self._tags is not None
        out: list[tuple[int, int, list[str]]] = []
        # frame: [name, tag start, content start, children (start, end, content start, content end)]
        stack: list[tuple[str, int, int, list[tuple[int, int, int, int]]]] = []
        for m in _limited(self._tags.finditer(text)):
            name = m.group(2).lower()
            if not m.group(1):
                stack.append((name, m.start(), m.end(), []))
                continue
            at = next((i for i in range(len(stack) - 1, -1, -1) if stack[i][0] == name), None)
            if at is None:
                continue  # a closing tag nothing opened
            _, start, content_start, children = stack[at]
            del stack[at:]  # tags opened inside and never closed are dropped
            if stack:
                stack[-1][3].append((start, m.end(), content_start, m.start()))
                continue
            outside, pos = [], content_start
            for c_start, c_end, _, _ in children:
                outside.append(text[pos:c_start])
                pos = c_end
            outside.append(text[pos:m.start()])
            if children and not "".join(outside).strip():
                out.append((start, m.end(), [text[a:b] for _, _, a, b in children]))
            else:
                out.append((start, m.end(), [text[content_start:m.start()]]))
        return out

    def _sections(self, text: str, taken: _Taken) -> tuple[int, int, list[str]] | None:
        """Labelled sections and numbered sources, appended to `taken`; the one that ran to the end
        of the text, if any."""
        starts: list[tuple[int, int, bool]] = []  # (label start, content start, lead-in sentence)
        low = text.lower()
        labels = self._labels if any(p in low for p in self._probes) else ()
        for finder in labels:
            starts += [(a, b, finder.lead_in) for a, b in finder.find(text, low) if not taken.inside(a)]
        first = next((a for a, _, n in _numbered(text) if n in ("0", "1") and not taken.inside(a)), None)
        if first is not None and not any(s <= first for s, _, _ in starts):
            starts.append((first, first, False))  # a bare numbered list: its own section
        if not starts:
            return None
        starts.sort()
        boundaries = [a for f in self._boundaries for a, _ in f.find(text, low) if not taken.inside(a)]
        limits = sorted([s for s, _, _ in starts] + boundaries + [t[0] for t in taken.regions] + [len(text)])
        blank_from = len(text.rstrip())  # a section ending at or after this runs to the end
        open_end: tuple[int, int, list[str]] | None = None
        for label_start, content_start, lead_in in starts:
            # the first limit after the label that is not before the content
            i = bisect.bisect_left(limits, content_start) if content_start > label_start \
                else bisect.bisect_right(limits, label_start)
            end = limits[i]
            content = text[content_start:end]
            if lead_in:  # `Use the following context. If unsure, say so.\n-----\n<context>`: framing out
                rule = _RULE_LINE.search(content)
                if rule is not None and content[:rule.start()].count("\n") <= 3 and content[rule.end():].strip():
                    content_start += rule.start()
                    content = text[content_start:end]
            end = content_start + _close_rule(content)
            docs = _numbered_documents(text[content_start:end])
            if lead_in and not any(d.strip() for d in docs):
                continue  # a sentence about documents that did not come: it stays in the text
            entry = (label_start, end, docs)
            taken.add(*entry)
            if end >= blank_from:
                open_end = entry
        return open_end

    @staticmethod
    def _give_back_question(taken: list[tuple[int, int, list[str]]], index: int, rest: str) -> tuple[list[str], str]:
        """The section running to the end keeps its last paragraph out when it is the question."""
        docs = taken[index][2]
        documents = [d for t in taken for d in t[2]]
        if not docs:
            return documents, rest
        last = docs[-1].rstrip()
        paragraphs = _PARAGRAPH_BREAK.split(last)
        if len(paragraphs) < 2:
            return documents, rest
        tail = paragraphs[-1].strip()
        if not tail or not (tail.endswith("?") or not rest.strip()):
            return documents, rest
        docs_before = [d for t in taken[:index] for d in t[2]]
        kept = docs[:-1] + [last[:len(last) - len(paragraphs[-1])].rstrip()]
        return docs_before + kept + [d for t in taken[index + 1:] for d in t[2]], f"{rest}\n\n{tail}"

    @staticmethod
    def _assemble(text: str, taken: list[tuple[int, int, list[str]]]) -> tuple[str, list[str]]:
        pieces, documents, pos = [], [], 0
        for start, end, docs in taken:
            if start < pos:  # overlapping regions are refused by _Taken.add: never true
                continue
            pieces.append(text[pos:start])
            documents += docs
            pos = end
        pieces.append(text[pos:])
        return "\n".join(p.strip() for p in pieces if p.strip()), documents


class _Finder:
    """One regex with a cheap guard; `lines` patterns match at line starts only (found by their newline,
    which lets the regex engine skip ahead instead of trying every position)."""

    __slots__ = ("regex", "skip", "first", "guard", "lower_guard", "lead_in")

    def __init__(self, regex: re.Pattern[str], skip: int, *, first: re.Pattern[str] | None = None,
                 guard: tuple[str, ...] = (), lower_guard: str = "") -> None:
        self.regex, self.skip, self.first, self.guard, self.lower_guard = regex, skip, first, guard, lower_guard
        self.lead_in = bool(lower_guard)  # a sentence introducing the documents, not a label

    @classmethod
    def lines(cls, body: str, flags: int | re.RegexFlag, *, guard: tuple[str, ...] = (),
              lower_guard: str = "") -> _Finder:
        return cls(re.compile(r"\n" + body, flags), 1, first=re.compile(body, flags), guard=guard,
                   lower_guard=lower_guard)

    def find(self, text: str, low: str) -> list[tuple[int, int]]:
        """(start, end) of every match."""
        if self.guard and not any(g in text for g in self.guard):
            return []
        if self.lower_guard and self.lower_guard not in low:
            return []
        out = []
        if self.first is not None:
            m = self.first.match(text)
            if m is not None:
                out.append((0, m.end()))
        out += [(m.start() + self.skip, m.end()) for m in _limited(self.regex.finditer(text))]
        return out


def _doc_group(m: re.Match[str]) -> str:
    if "doc" in m.re.groupindex:
        return m.group("doc") or ""
    return (m.group(1) or "") if m.re.groups else m.group(0)


MAX_MARKS = 2000  # layout marks (tags, fence lines, labels, entries) one message may hold before it is left whole


class _TooMany(Exception):
    """More layout marks than MAX_MARKS: the text is left whole (bounded work for any input)."""


def _limited(matches: Iterator[re.Match[str]]) -> Iterator[re.Match[str]]:
    for count, m in enumerate(matches):
        if count >= MAX_MARKS:
            raise _TooMany
        yield m


class _Taken:
    """Disjoint regions (start, end, documents) sorted by start; `add` refuses one that overlaps."""

    __slots__ = ("regions", "_starts")

    def __init__(self) -> None:
        self.regions: list[tuple[int, int, list[str]]] = []
        self._starts: list[int] = []

    def inside(self, pos: int) -> bool:
        i = bisect.bisect_right(self._starts, pos) - 1
        return i >= 0 and pos < self.regions[i][1]

    def add(self, start: int, end: int, docs: list[str]) -> bool:
        i = bisect.bisect_left(self._starts, start)
        if (i > 0 and self.regions[i - 1][1] > start) or (i < len(self._starts) and self._starts[i] < end):
            return False
        self._starts.insert(i, start)
        self.regions.insert(i, (start, end, docs))
        return True


def _fenced_regions(text: str) -> list[tuple[int, int, list[str]]]:
    """Text-like fenced blocks: a fence line opens, the next bare fence line closes (linear, one scan)."""
    out: list[tuple[int, int, list[str]]] = []
    opened: re.Match[str] | None = None
    for m in _limited(_FENCE_LINE.finditer(text)):
        if opened is None:
            opened = m
        elif not m.group(1) and not m.group(2).strip():
            if opened.group(1).lower() in TEXT_FENCE_INFO:
                out.append((opened.start(), m.end(), [text[opened.end() + 1:m.start()]]))
            opened = None
    return out


def _close_rule(content: str) -> int:
    """Content framed by rule lines ends at the closing rule (kept out of the document)."""
    rules = list(itertools.islice(_RULE_LINE.finditer(content), 2))
    if rules and not content[:rules[0].start()].strip() and len(rules) >= 2:
        return rules[1].end()
    return len(content)


def _numbered(text: str) -> list[tuple[int, int, str]]:
    """(start, end, number) of every `[n]` entry at a line start."""
    if "[" not in text:
        return []
    m = _NUMBERED_FIRST.match(text)
    out = [(0, m.end(), m.group(1))] if m is not None else []
    return out + [(m.start() + 1, m.end(), m.group(1)) for m in _limited(_NUMBERED_NL.finditer(text))]


def _numbered_documents(content: str) -> list[str]:
    """One document per `[n]` entry when the content is a numbered list; else the content (rule lines out)."""
    entries = _numbered(content)
    if entries and not _RULE_LINE.sub("", content[:entries[0][0]]).strip():
        bounds = [a for a, _, _ in entries] + [len(content)]
        return [content[end:bounds[i + 1]] for i, (_, end, _) in enumerate(entries)]
    return [_RULE_LINE.sub("", content)]


def _fold(text: str) -> str:
    """Blank runs left where documents were become one blank line; ends stripped."""
    return _BLANK_RUNS.sub("\n\n", text).strip()
