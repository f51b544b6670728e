"""Training, export and model cards of the bundled models (never imported by the serving path).

Code: `models/shared.py` and `models/pipelines/<pipeline>/`; data written for this project: `models/data/`;
the shipped model directories (`models/sentinel`, `models/detector`, ...): artifacts only. See models/README.md.
"""
