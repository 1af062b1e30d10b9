"""Tests of runtimes/: the ClusterTrainingRuntimes, their kustomization and examples."""
