"""The inferasim Kubernetes operator: a thin kopf adapter over the `inferasim` library."""
