"""Offline evaluation of the detector: dataset loading, metrics, runner (`truthlens eval`)."""
