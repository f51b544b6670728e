"""Tiny random BERT / ModernBERT / MPNet checkpoints exported into TruthLens model directories.

Built locally with transformers + tokenizers (no downloads) and exported with
`extproc.inference.export.export_model`, so tests exercise the real export and
the real serving runtime. Weights are random: these models check plumbing
(shapes, offsets, windowing, batching), not accuracy.

Use the session-scoped fixture `tiny_models` (registered in tests/conftest.py):

    def test_x(tiny_models):
        engine_dir = tiny_models["bert-token"]      # a pathlib.Path

Keys: bert-token, bert-seq, bert-nli, modernbert-token, modernbert-seq, mpnet-token (the quality tier's
architecture: no token_type_ids, relative position buckets).
"""

from __future__ import annotations

from pathlib import Path

import pytest

WORDS = (
    "the a an is was are were of in on at to for by with from and or not no yes it this that "
    "paris france capital city country population million tower eiffel built year river water "
    "boils degrees celsius sea level what where when who how which question answer context "
    "passage model token text doctor medicine dose patient symptom treatment company revenue "
    "report percent growth 1889 1925 2024 100 90 67 69 one two three four five six seven eight nine ten"
).split()
MAX_LENGTH = 128  # manifest max_length: small on purpose, long inputs must take the windowing path
POSITIONS = 512  # checkpoint positions: hand-written manifests may raise max_length up to this
NLI_LABELS = ["entailment", "neutral", "contradiction"]


def _corpus() -> list[str]:
    return [" ".join(WORDS[i:] + WORDS[:i]) + " . , ? ! ' \" : ; - ( )" for i in range(0, len(WORDS), 7)]


def _bert_vocab_dir(hf_dir: Path) -> None:
    """vocab.txt only: exercises export's build-tokenizer.json-from-the-checkpoint path."""
    from tokenizers import BertWordPieceTokenizer

    tok = BertWordPieceTokenizer(lowercase=True)
    tok.train_from_iterator(_corpus(), vocab_size=400, min_frequency=1, show_progress=False)
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    (hf_dir / "vocab.txt").write_text("\n".join(t for t, _ in vocab) + "\n", encoding="utf-8")


def _modernbert_tokenizer(hf_dir: Path) -> int:
    """Byte-level BPE with ModernBERT's [CLS] A [SEP] B [SEP] post-processor (no token types)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    specials = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(), trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    tok.save(str(hf_dir / "tokenizer.json"))
    return tok.get_vocab_size()


def build_checkpoint(kind: str, head: str, hf_dir: Path, num_labels: int = 2, seed: int = 0) -> Path:
    """Save a tiny random checkpoint (kind: bert | modernbert | mpnet; head: token | seq)."""
    import torch
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        BertForTokenClassification,
        ModernBertConfig,
        ModernBertForSequenceClassification,
        ModernBertForTokenClassification,
        MPNetConfig,
        MPNetForSequenceClassification,
        MPNetForTokenClassification,
    )

    torch.manual_seed(seed)
    hf_dir.mkdir(parents=True, exist_ok=True)
    common = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, num_labels=num_labels)
    if kind == "bert":
        _bert_vocab_dir(hf_dir)
        vocab = len((hf_dir / "vocab.txt").read_text(encoding="utf-8").splitlines())
        config = BertConfig(vocab_size=vocab, max_position_embeddings=POSITIONS, **common)
        model = (BertForTokenClassification if head == "token" else BertForSequenceClassification)(config)
    elif kind == "modernbert":
        vocab = _modernbert_tokenizer(hf_dir)
        config = ModernBertConfig(
            vocab_size=vocab, max_position_embeddings=POSITIONS, pad_token_id=0, cls_token_id=1,
            sep_token_id=2, bos_token_id=1, eos_token_id=2, global_attn_every_n_layers=2, local_attention=32, **common,
        )
        model = (ModernBertForTokenClassification if head == "token" else ModernBertForSequenceClassification)(config)
    elif kind == "mpnet":
        # all-mpnet-base-v2 ships a word-piece tokenizer.json (the file export copies); here: BERT's special tokens
        from tokenizers import BertWordPieceTokenizer

        _bert_vocab_dir(hf_dir)
        BertWordPieceTokenizer(str(hf_dir / "vocab.txt"), lowercase=True).save(str(hf_dir / "tokenizer.json"))
        vocab = len((hf_dir / "vocab.txt").read_text(encoding="utf-8").splitlines())
        config = MPNetConfig(vocab_size=vocab, max_position_embeddings=POSITIONS + 2, **common)
        model = (MPNetForTokenClassification if head == "token" else MPNetForSequenceClassification)(config)
    else:
        raise ValueError(kind)
    if num_labels == 3:
        model.config.id2label = dict(enumerate(NLI_LABELS))
        model.config.label2id = {v: k for k, v in model.config.id2label.items()}
    model.save_pretrained(str(hf_dir))
    return hf_dir


SPECS = {
    "bert-token": ("bert", "token", "token-classification", 2),
    "bert-seq": ("bert", "seq", "sequence-classification", 2),
    "bert-nli": ("bert", "seq", "nli", 3),
    "modernbert-token": ("modernbert", "token", "token-classification", 2),
    "modernbert-seq": ("modernbert", "seq", "sequence-classification", 2),
    "mpnet-token": ("mpnet", "token", "token-classification", 2),
}


def build_model_dir(key: str, root: Path, **export_kwargs) -> tuple[Path, dict]:
    """Checkpoint + export for one SPECS key; returns (model_dir, export report)."""
    from extproc.inference.export import export_model

    kind, head, task, n = SPECS[key]
    hf = build_checkpoint(kind, head, root / f"{key}-hf", num_labels=n)
    out = root / key
    report = export_model(hf, task, out, max_length=MAX_LENGTH, context_overlap=16,
                          provenance={"purpose": "unit tests: tiny random weights"}, **export_kwargs)
    return out, report


class TinyModels(dict):
    """Lazily built model dirs, cached for the test session; `.reports[key]` holds export reports."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root
        self.reports: dict[str, dict] = {}

    def __missing__(self, key: str) -> Path:
        path, report = build_model_dir(key, self.root)
        self[key] = path
        self.reports[key] = report
        return path


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    return TinyModels(tmp_path_factory.mktemp("tiny_models"))
