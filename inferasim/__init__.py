"""inferasim: predict LLM serving performance from anchors, simulate traffic, search deployments."""

__version__ = "0.1.0"
