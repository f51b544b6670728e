"""The model directory contract: `model.onnx` + `tokenizer.json` + `truthlens.json`.

The manifest says how to feed the graph (task, labels, input names, template,
max length) so serving needs no Hugging Face config and no torch. It is
written by `truthlens export` or by hand for an already-exported ONNX model
(see docs/inference.md). Loading checks every field and names what is wrong.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

MANIFEST_FILE = "truthlens.json"
MODEL_FILE = "model.onnx"
TOKENIZER_FILE = "tokenizer.json"
FORMAT_VERSION = 1

TASKS = ("sequence-classification", "token-classification", "nli")
KNOWN_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
NLI_LABELS = ("entailment", "neutral", "contradiction")

# Placeholders each template part may use, per task.
TEMPLATE_FIELDS: dict[str, dict[str, tuple[str, ...]]] = {
    "token-classification": {
        "first": ("context", "question", "num_passages"),
        "second": ("answer",),
    },
    "sequence-classification": {"first": ("prompt",), "second": ()},
    "nli": {"first": ("premise",), "second": ("hypothesis",)},
}

DEFAULT_TEMPLATES: dict[str, dict[str, str]] = {
    "token-classification": {
        "first": "{context}\n\nQuestion: {question}",
        "second": "{answer}",
        "passage": "{text}",
        "passage_separator": "\n\n",
        "no_question": "",
    },
    "sequence-classification": {"first": "{prompt}", "second": ""},
    "nli": {"first": "{premise}", "second": "{hypothesis}"},
}

DEFAULT_POSITIVE = {"token-classification": "hallucinated", "sequence-classification": "needs_check"}


class ManifestError(ValueError):
    """The model directory is missing something or disagrees with itself."""


@dataclass(frozen=True)
class Manifest:
    task: str
    labels: tuple[str, ...]
    max_length: int
    input_names: tuple[str, ...]
    template: dict[str, str]
    name: str = ""
    positive_label: str | None = None  # token/sequence tasks: the label whose probability is reported
    output_name: str = "logits"
    context_overlap: int = 64  # tokens shared by neighbouring context windows (default min(64, max_length // 4))
    pad_token_id: int | None = None  # None: taken from tokenizer.json
    provenance: dict[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION

    @property
    def positive_index(self) -> int:
        """Column of the probability the runtime reports (token/sequence tasks)."""
        assert self.positive_label is not None
        return self.labels.index(self.positive_label)

    def label_index(self, label: str) -> int:
        return self.labels.index(label)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["labels"] = list(self.labels)
        data["input_names"] = list(self.input_names)
        return data

    def write(self, directory: str | Path) -> Path:
        path = Path(directory) / MANIFEST_FILE
        path.write_text(json.dumps(self.to_json(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        return path


def _fail(where: str, problem: str) -> ManifestError:
    return ManifestError(f"{where}: {problem}")


def _check_template(task: str, template: Any, where: str) -> dict[str, str]:
    if not isinstance(template, dict) or not all(isinstance(v, str) for v in template.values()):
        raise _fail(f"{where}.template", "must be a mapping of strings")
    merged = {**DEFAULT_TEMPLATES[task], **template}
    allowed = TEMPLATE_FIELDS[task]
    import string

    for part in ("first", "second"):
        names = {f for _, f, _, _ in string.Formatter().parse(merged[part]) if f is not None}
        unknown = names - set(allowed[part])
        if unknown:
            raise _fail(f"{where}.template.{part}", f"unknown placeholder(s) {sorted(unknown)}; allowed {list(allowed[part])}")
    if task == "token-classification":
        if merged["second"] != "{answer}":
            raise _fail(f"{where}.template.second", "must be exactly '{answer}' (offsets map into the answer)")
        if merged["first"].count("{context}") != 1:
            raise _fail(f"{where}.template.first", "must contain {context} exactly once (it is what gets windowed)")
        if "{text}" not in merged["passage"]:
            raise _fail(f"{where}.template.passage", "must contain {text}")
    if task == "nli" and (merged["first"] != "{premise}" or merged["second"] != "{hypothesis}"):
        raise _fail(f"{where}.template", "nli templates must be first='{premise}', second='{hypothesis}'")
    if task == "sequence-classification" and merged["first"].count("{prompt}") != 1:
        raise _fail(f"{where}.template.first", "must contain {prompt} exactly once")
    return merged


def manifest_from_dict(data: Any, where: str = MANIFEST_FILE) -> Manifest:
    """Validate a parsed manifest; every error names the offending field."""
    if not isinstance(data, dict):
        raise _fail(where, "must be a JSON object")
    missing = [k for k in ("task", "labels", "max_length", "input_names") if k not in data]
    if missing:
        raise _fail(where, f"missing required field(s) {missing}")
    known = set(Manifest.__dataclass_fields__)
    extra = sorted(set(data) - known)
    if extra:
        raise _fail(where, f"unknown field(s) {extra}; known: {sorted(known)}")
    task = data["task"]
    if task not in TASKS:
        raise _fail(f"{where}.task", f"{task!r} is not one of {list(TASKS)}")
    labels = data["labels"]
    if not isinstance(labels, list) or len(labels) < 2 or not all(isinstance(x, str) and x for x in labels):
        raise _fail(f"{where}.labels", "must be a list of at least two label names, index = output column")
    if len(set(labels)) != len(labels):
        raise _fail(f"{where}.labels", "label names must be unique")
    labels = [x.lower() for x in labels]
    positive = data.get("positive_label")
    if task == "nli":
        absent = [x for x in NLI_LABELS if x not in labels]
        if absent:
            raise _fail(f"{where}.labels", f"nli models need labels {list(NLI_LABELS)}; missing {absent}")
        positive = None
    else:
        positive = (positive or (DEFAULT_POSITIVE[task] if DEFAULT_POSITIVE[task] in labels else None))
        if positive is None:
            raise _fail(f"{where}.positive_label", f"required: which of {labels} is the reported probability")
        positive = str(positive).lower()
        if positive not in labels:
            raise _fail(f"{where}.positive_label", f"{positive!r} is not in labels {labels}")
    max_length = data["max_length"]
    if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 16:
        raise _fail(f"{where}.max_length", "must be an integer >= 16")
    names = data["input_names"]
    if not isinstance(names, list) or not names or not all(n in KNOWN_INPUTS for n in names):
        raise _fail(f"{where}.input_names", f"must be a non-empty list drawn from {list(KNOWN_INPUTS)}")
    if "input_ids" not in names:
        raise _fail(f"{where}.input_names", "must include input_ids")
    overlap = data.get("context_overlap", min(64, max_length // 4))
    if not isinstance(overlap, int) or overlap < 0 or overlap >= max_length // 2:
        raise _fail(f"{where}.context_overlap", f"must be an integer in [0, {max_length // 2})")
    pad = data.get("pad_token_id")
    if pad is not None and (not isinstance(pad, int) or pad < 0):
        raise _fail(f"{where}.pad_token_id", "must be a non-negative integer or null")
    provenance = data.get("provenance", {})
    if not isinstance(provenance, dict):
        raise _fail(f"{where}.provenance", "must be an object")
    version = data.get("format_version", FORMAT_VERSION)
    if version != FORMAT_VERSION:
        raise _fail(f"{where}.format_version", f"{version!r} not supported (expected {FORMAT_VERSION})")
    return Manifest(
        task=task,
        labels=tuple(labels),
        max_length=max_length,
        input_names=tuple(names),
        template=_check_template(task, data.get("template", {}), where),
        name=str(data.get("name", "")),
        positive_label=positive,
        output_name=str(data.get("output_name", "logits")),
        context_overlap=overlap,
        pad_token_id=pad,
        provenance=provenance,
    )


def load_manifest(directory: str | Path) -> Manifest:
    """Read and validate `truthlens.json`; also checks the sibling files exist."""
    root = Path(directory)
    if not root.is_dir():
        raise ManifestError(f"{root}: model directory does not exist")
    absent = [f for f in (MODEL_FILE, TOKENIZER_FILE, MANIFEST_FILE) if not (root / f).is_file()]
    if absent:
        raise ManifestError(f"{root}: missing {absent} (a model directory holds {MODEL_FILE}, {TOKENIZER_FILE}, {MANIFEST_FILE})")
    path = root / MANIFEST_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{path}: not valid JSON ({exc})") from exc
    manifest = manifest_from_dict(data, where=str(path))
    if not manifest.name:
        manifest = replace(manifest, name=root.name)
    return manifest
