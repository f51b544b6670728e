"""Protocol layer: Envoy ext_proc messages (envoy), OpenAI chat-completions JSON (openai),
incremental SSE (sse) and content encodings (encoding). Pure and model-free; each module's
docstring lists its public API."""
