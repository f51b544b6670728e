"""Training and export scripts for the bundled models (never imported by the serving path)."""
