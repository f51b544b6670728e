"""The explainer pipeline: 3-way NLI, and the grounding verifier with models/verifier/train.yaml (data -> train -> evaluate -> export -> card)."""
