"""``kf-torchrun``: a torchrun that reads Kubeflow's PET_* env, waits for assets and master.

In a TrainJob: ``command: [kf-torchrun, --require, /workspace/model, train.py, --lr, "1e-4"]``.
It validates PET_NNODES / PET_NPROC_PER_NODE / PET_NODE_RANK / PET_MASTER_ADDR / PET_MASTER_PORT,
resolves ``auto`` to the GPUs visible (else the CPUs the container may use), waits for the required
assets and (on non-zero ranks) for the master, prints the topology, then execs torchrun.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from initializers.cpus import available_cpus
from initializers.environment import variables
from initializers.errors import UsageError
from initializers.launchers import settings as config
from initializers.launchers.assets import Asset, wait_for_assets
from initializers.launchers.gpus import visible_gpus
from initializers.launchers.netwait import Endpoint, wait_for_endpoints
from initializers.launchers.shim import (
    exec_launcher,
    log,
    new_parser,
    run,
    show_command,
    user_command,
)
from initializers.progress import human_bytes

PROG = "kf-torchrun"
DESCRIPTION = (
    "torchrun for Kubeflow Trainer nodes: reads the PET_* env, waits for complete assets and\n"
    "for the master, prints the topology, then execs torchrun with the user's script."
)
EPILOG = """
torch settings, from the env Kubeflow Trainer sets (with none set, one node runs standalone):
  PET_NNODES, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT (default 29500),
  PET_NPROC_PER_NODE: a number, or auto (the GPUs visible, else the CPUs the container may use,
  cgroup quota included), cpu, gpu

examples:
  kf-torchrun --require /workspace/model --require /workspace/dataset train.py --epochs 3
  kf-torchrun -- --max-restarts=3 train.py     (torchrun options go after --, before the script)
"""


@dataclass(frozen=True)
class Topology:
    """The launch this node takes part in, fully resolved."""

    nnodes: int
    nproc: int
    nproc_reason: str
    node_rank: int
    master_addr: str | None  # None: single node, standalone rendezvous
    master_port: int

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc

    def torchrun_args(self) -> list[str]:
        if self.master_addr is None:
            return ["--standalone", "--nnodes=1", f"--nproc-per-node={self.nproc}"]
        return [
            f"--nnodes={self.nnodes}",
            f"--nproc-per-node={self.nproc}",
            f"--node-rank={self.node_rank}",
            f"--master-addr={self.master_addr}",
            f"--master-port={self.master_port}",
        ]


def resolve_nproc(spec: str, env: Mapping[str, str]) -> tuple[int, str]:
    """Processes per node for PET_NPROC_PER_NODE=spec, and why (for the topology printout)."""
    if spec.isdigit():
        return int(spec), f"PET_NPROC_PER_NODE={spec}"
    gpus = visible_gpus(env)
    if spec == "gpu" or (spec == "auto" and gpus):
        if not gpus:
            raise UsageError("PET_NPROC_PER_NODE=gpu but no GPU is visible to this container")
        return gpus, f"PET_NPROC_PER_NODE={spec}: {gpus} GPU(s) visible"
    cpus = available_cpus()
    reason = "no GPU visible, " if spec == "auto" else ""
    return cpus, f"PET_NPROC_PER_NODE={spec}: {reason}{cpus} usable CPU(s)"


def plan(torch: config.TorchSettings, env: Mapping[str, str]) -> Topology:
    nproc, reason = resolve_nproc(torch.nproc, env)
    master = torch.master_addr if torch.nnodes > 1 else None
    return Topology(torch.nnodes, nproc, reason, torch.node_rank, master, torch.master_port)


def torchrun_command(launcher: str | None) -> list[str]:
    """Absolute argv prefix that starts torchrun in this environment."""
    if launcher:
        found = shutil.which(launcher)
        if not found:
            raise UsageError(f"torchrun {launcher!r} not found; fix --torchrun / KF_TORCHRUN")
        return [found]
    found = shutil.which("torchrun")
    if found:
        return [found]
    if importlib.util.find_spec("torch") is None:
        raise UsageError(
            f"torch is not installed for {sys.executable} and no torchrun is on PATH; "
            "use an image with PyTorch (e.g. images/torch-runtime)"
        )
    return [sys.executable, "-m", "torch.distributed.run"]


def describe(top: Topology, assets: list[Asset]) -> None:
    first = top.node_rank * top.nproc
    log.info("topology")
    if top.master_addr is None:
        log.info("  nodes           1 (single node, standalone rendezvous on this host)")
    else:
        role = "the master" if top.node_rank == 0 else f"node {top.node_rank}"
        log.info("  nodes           %d (this is %s)", top.nnodes, role)
    log.info("  procs per node  %d (%s)", top.nproc, top.nproc_reason)
    last = first + top.nproc - 1
    log.info("  world size      %d (global ranks %d-%d here)", top.world_size, first, last)
    if top.master_addr is not None:
        log.info("  master          %s:%d", top.master_addr, top.master_port)
    for asset in assets:
        log.info(
            "  asset           %s: %d files, %s, from %s",
            asset.path,
            asset.files,
            human_bytes(asset.total_bytes, digits=1),
            asset.source,
        )


def build_parser() -> argparse.ArgumentParser:
    parser = new_parser(PROG, DESCRIPTION, EPILOG)
    parser.add_argument(
        "--torchrun",
        metavar="PATH",
        help="the torchrun to exec (KF_TORCHRUN; default: torchrun on PATH, else "
        "python -m torch.distributed.run)",
    )
    return parser


def _body(argv: list[str] | None) -> int:
    parsed = build_parser().parse_args(argv)
    env = variables()
    command = user_command(parsed, PROG, "script")
    waits = config.wait_settings(parsed, env)
    torch = config.torch_settings(parsed, env)
    top = plan(torch, env)
    argv_out = [*torchrun_command(torch.launcher), *top.torchrun_args(), *command]
    if parsed.dry_run:
        describe(top, [])
        show_command(argv_out, {})
        log.info("dry run: not waiting, not launching")
        return 0
    assets = wait_for_assets(waits.require, waits.timeout)
    if top.master_addr is not None:
        # Rank 0 hosts the store (needs its own name to resolve); the others must reach it.
        master = Endpoint(
            top.master_addr, top.master_port, role="master", resolve_only=top.node_rank == 0
        )
        wait_for_endpoints([master], waits.peer_timeout, what="the torch master")
    describe(top, assets)
    show_command(argv_out, {})
    exec_launcher(argv_out, env)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``kf-torchrun`` console script."""
    return run(PROG, lambda: _body(argv))


if __name__ == "__main__":
    sys.exit(main())
