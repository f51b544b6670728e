import pytest

from models.pipelines.explainer.data import NOT_SUPPORTED, context_windows, grounding_pairs


def test_each_sentence_is_labelled_by_the_gold_spans_and_paired_with_its_best_window():
    filler = " ".join(f"word{i}" for i in range(300))
    context = f"{filler} The bridge opened in 1932 over the Harbour. {filler}"
    answer = "The bridge opened in 1932. It was painted bright pink by its architect."
    rec = {"context": context, "answer": answer, "labels": [{"start": 27, "end": len(answer) - 1}]}
    pairs = list(grounding_pairs(rec, max_words=120))
    assert [(h, y) for _, h, y in pairs] == [("The bridge opened in 1932.", 0),
                                            ("It was painted bright pink by its architect.", NOT_SUPPORTED)]
    assert "opened in 1932" in pairs[0][0] and len(pairs[0][0].split()) <= 120  # the window holding the evidence


def test_context_windows_cover_the_context_with_overlap():
    words = [f"w{i}" for i in range(250)]
    windows = context_windows(" ".join(words), max_words=100, overlap=20)
    assert all(len(w.split()) <= 100 for w in windows)
    assert set(" ".join(windows).split()) == set(words)
    assert context_windows("short text", 100) == ["short text"]


def test_grounding_loss_reads_only_p_entailment_for_unsupported_sentences():
    torch = pytest.importorskip("torch")
    from models.pipelines.explainer.train import nli_or_grounding_loss

    logits = torch.tensor([[2.0, 0.0, 0.0], [2.0, 0.0, 0.0], [-2.0, 1.0, -1.0]])
    # NLI row (label 0) and two unsupported rows: the one the model calls entailed costs more
    loss_hi = nli_or_grounding_loss(logits[:2], torch.tensor([0, NOT_SUPPORTED]))
    loss_lo = nli_or_grounding_loss(logits[[0, 2]], torch.tensor([0, NOT_SUPPORTED]))
    assert loss_hi > loss_lo
    # moving mass between neutral and contradiction does not change an unsupported row's loss
    a = nli_or_grounding_loss(torch.tensor([[0.0, 2.0, 0.0]]), torch.tensor([NOT_SUPPORTED]))
    b = nli_or_grounding_loss(torch.tensor([[0.0, 0.0, 2.0]]), torch.tensor([NOT_SUPPORTED]))
    assert a.item() == pytest.approx(b.item())
