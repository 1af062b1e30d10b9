"""Training stand-in for kf-torchrun tests: a gloo all_reduce plus a read of the model folder.

Usage: torch_allreduce.py OUT_DIR MODEL_FILE [ARGS...]; each rank writes OUT_DIR/rank-N.json.
"""

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

out_dir, model_file, *rest = sys.argv[1:]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
result = {
    "rank": rank,
    "world_size": world,
    "local_rank": int(os.environ["LOCAL_RANK"]),
    "sum": total.item(),
    "model": Path(model_file).read_text() if model_file != "-" else None,
    "args": rest,
    "uid": os.getuid(),
}
Path(out_dir, f"rank-{rank}.json").write_text(json.dumps(result))
dist.destroy_process_group()
