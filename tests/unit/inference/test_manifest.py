import json
import shutil
from pathlib import Path

import pytest

from extproc.inference.manifest import MANIFEST_FILE, ManifestError, load_manifest, manifest_from_dict
from extproc.inference.models import OnnxModel
from extproc.inference.runtime import RuntimeOptions

CPU = RuntimeOptions(provider="cpu")
BASE = {"task": "token-classification", "labels": ["supported", "hallucinated"], "max_length": 128,
        "input_names": ["input_ids", "attention_mask"]}


def _copy(src: Path, dst: Path, **changes) -> Path:
    shutil.copytree(src, dst)
    data = json.loads((dst / MANIFEST_FILE).read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    (dst / MANIFEST_FILE).write_text(json.dumps(data))
    return dst


def test_minimal_hand_written_manifest_gets_documented_defaults():
    m = manifest_from_dict(BASE)
    assert m.positive_label == "hallucinated" and m.positive_index == 1
    assert m.template["second"] == "{answer}" and "{context}" in m.template["first"]
    assert m.context_overlap == 32 and m.output_name == "logits"


@pytest.mark.parametrize(
    "change, message",
    [
        ({"task": "ner"}, "task"),
        ({"labels": ["only"]}, "labels"),
        ({"labels": ["a", "b"]}, "positive_label"),
        ({"labels": ["a", "b"], "positive_label": "c"}, "'c' is not in labels"),
        ({"max_length": 4}, "max_length"),
        ({"input_names": ["attention_mask"]}, "input_ids"),
        ({"input_names": ["input_ids", "pixel_values"]}, "input_names"),
        ({"template": {"second": "Answer: {answer}"}}, "template.second"),
        ({"template": {"first": "{question}"}}, "{context} exactly once"),
        ({"template": {"first": "{context} {dogs}"}}, "unknown placeholder"),
        ({"context_overlap": 100}, "context_overlap"),
        ({"colour": "red"}, "unknown field"),
        ({"format_version": 9}, "format_version"),
    ],
)
def test_invalid_manifests_name_the_field(change, message):
    with pytest.raises(ManifestError, match=message):
        manifest_from_dict({**BASE, **change})


def test_missing_required_fields_are_listed():
    with pytest.raises(ManifestError, match=r"missing required field\(s\) \['labels', 'max_length'\]"):
        manifest_from_dict({"task": "nli", "input_names": ["input_ids"]})


def test_nli_needs_the_three_labels():
    with pytest.raises(ManifestError, match="contradiction"):
        manifest_from_dict({**BASE, "task": "nli", "labels": ["entailment", "neutral"]})


def test_missing_files_are_named(tmp_path, tiny_models):
    broken = shutil.copytree(tiny_models["bert-token"], tmp_path / "m")
    (broken / "tokenizer.json").unlink()
    with pytest.raises(ManifestError, match=r"missing \['tokenizer.json'\]"):
        load_manifest(broken)
    with pytest.raises(ManifestError, match="does not exist"):
        load_manifest(tmp_path / "nowhere")


def test_input_names_are_checked_against_the_graph(tmp_path, tiny_models):
    # ModernBERT's graph has no token_type_ids: a manifest that claims it must not load.
    d = _copy(tiny_models["modernbert-token"], tmp_path / "m", input_names=["input_ids", "attention_mask", "token_type_ids"])
    with pytest.raises(ManifestError, match="takes \\['attention_mask', 'input_ids'\\]"):
        OnnxModel(d, "detector", CPU)


def test_label_count_is_checked_against_the_output(tmp_path, tiny_models):
    d = _copy(tiny_models["bert-token"], tmp_path / "m", labels=["a", "b", "hallucinated"])
    with pytest.raises(ManifestError, match="last dim 3"):
        OnnxModel(d, "detector", CPU)


def test_role_must_match_task(tiny_models):
    with pytest.raises(ManifestError, match="detector needs task 'token-classification'"):
        OnnxModel(tiny_models["bert-seq"], "detector", CPU)


def test_corrupt_onnx_file_is_reported(tmp_path, tiny_models):
    d = _copy(tiny_models["bert-seq"], tmp_path / "m")
    (d / "model.onnx").write_bytes(b"not a model")
    with pytest.raises(ManifestError, match="onnxruntime could not load it"):
        OnnxModel(d, "sentinel", CPU)
