"""Inference layer: ONNX sessions, tokenizers, windowing, batching, span merging. Knows nothing of Envoy."""
