# Shared fixtures. Inference helper's block: tiny exported BERT/ModernBERT model dirs
# (`tiny_models` fixture, see tests/helpers/tiny_models.py).
pytest_plugins = ["tests.helpers.tiny_models"]
