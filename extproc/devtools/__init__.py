"""Dev-only tools: the demo upstream LLM and the Envoy config rendering for `truthlens dev`.

The serving path never imports this package (tests/unit/test_layers.py checks it).
"""
