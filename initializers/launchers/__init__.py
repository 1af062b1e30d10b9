"""Launcher shims for trainer nodes: ``kf-torchrun`` and ``kf-mpirun``.

Each shim turns the Kubeflow Trainer contract (``PET_*`` env for torch; hostfile, ``OMPI_MCA_*``
env and SSH keys for MPI) into a correct launch: it validates the settings, waits (bounded) for the
initializers' assets and for its peers, prints the topology, then ``exec``s the real launcher so
its exit code and signals are the job's own. Shared pieces live in small modules: ``shim`` (the
command line both share), ``polling`` (bounded waits), ``assets``, ``netwait``, ``gpus``; the
CPU count is :mod:`initializers.cpus`, the environment :mod:`initializers.environment`.
"""
