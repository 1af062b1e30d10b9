"""MPI program for kf-mpirun tests: an mpi4py allreduce plus a read of the model folder.

Usage: mpi_allreduce.py OUT_DIR MODEL_FILE; each rank writes OUT_DIR/rank-N.json, including the
sshd address it was started through (SSH_CONNECTION), which tells the "nodes" apart.
"""

import json
import os
import sys
from pathlib import Path

from mpi4py import MPI

out_dir, model_file = sys.argv[1:3]
comm = MPI.COMM_WORLD
rank = comm.Get_rank()
total = comm.allreduce(rank + 1)
ssh = os.environ.get("SSH_CONNECTION", "").split()
result = {
    "rank": rank,
    "size": comm.Get_size(),
    "sum": total,
    "via_sshd": ssh[2] if len(ssh) == 4 else None,
    "model": Path(model_file).read_text() if model_file != "-" else None,
    "mpi": MPI.Get_library_version().splitlines()[0],
}
Path(out_dir, f"rank-{rank}.json").write_text(json.dumps(result))
