"""One package per training pipeline, each with the same stages (see models/README.md):
data.py -> train.py -> (evaluate.py) -> export.py -> card.py.

sentinel/      the prompt classifier, plus its lexical prefilter (prefilter.py)
explainer/     the NLI cross-encoder; with models/verifier/train.yaml, the grounding verifier
detector/      the token classifier (features.py: its serving-identical inputs)
hallucination/ the span-labelled hallucination sets the detector and verifier train on and the
               real-output suite reads (the detector's data stage, shared)
"""
