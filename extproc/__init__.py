"""TruthLens: a hallucination firewall for LLM traffic, served as an Envoy ext_proc sidecar."""

__version__ = "0.1.0"
