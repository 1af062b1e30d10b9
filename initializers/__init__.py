"""Dataset and model initializers for Kubeflow Trainer v2, and launcher shims for its nodes."""

__version__ = "0.1.0"
