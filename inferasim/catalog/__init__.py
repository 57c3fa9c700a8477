"""Catalog: models, GPUs, engines."""
