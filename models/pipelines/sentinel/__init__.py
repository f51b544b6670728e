"""The sentinel pipeline: does this prompt need fact-checking? (data -> train -> evaluate -> export -> card; prefilter)."""
