"""The detector pipeline: which answer tokens does the context not support? (data -> features -> train -> evaluate -> export -> card)."""
