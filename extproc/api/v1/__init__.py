"""Generated from proto/truthlens/v1 by proto/generate.py (grpcio-tools). Do not edit."""
