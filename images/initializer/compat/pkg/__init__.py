"""Compatibility with the module paths of Kubeflow Trainer's own initializer images."""
