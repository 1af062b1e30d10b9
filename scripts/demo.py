"""``make demo``: the initializers for real, offline, on this machine.

Starts a local S3 server (moto) and a local Hugging Face Hub (tests/servers/hub.py) on
127.0.0.1, publishes a small generated model and dataset, then runs both initializers exactly
as Kubeflow Trainer would (env only) into ./workspace — twice, to show that the second run
finds everything in place.
"""

from __future__ import annotations

import json
import logging
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import boto3
from moto.server import ThreadedMotoServer

from tests.servers.hub import HubServer

WORKSPACE = Path("workspace").resolve()
DEMO_KEY, DEMO_SECRET = "AKIADEMO", "demo-secret"


def generated_model() -> dict[str, bytes]:
    # The same bytes every time, so a second `make demo` finds the workspace complete too.
    shard = random.Random(0).randbytes(8 << 20)
    return {
        "config.json": json.dumps({"model_type": "llama", "hidden_size": 64}).encode(),
        "generation_config.json": b"{}",
        "tokenizer.json": json.dumps({"version": "1.0", "model": {"vocab": {}}}).encode(),
        "tokenizer_config.json": b"{}",
        "model-00001-of-00002.safetensors": shard,
        "model-00002-of-00002.safetensors": shard[::-1],
        "model.safetensors.index.json": b'{"weight_map": {}}',
        "pytorch_model.bin": b"legacy weights: skipped by the model defaults",
    }


def generated_dataset() -> dict[str, bytes]:
    rows = [{"instruction": f"Add {i} and {i}.", "output": str(2 * i)} for i in range(200)]
    lines = [json.dumps(row).encode() + b"\n" for row in rows]
    return {
        "train/part-000.jsonl": b"".join(lines[:150]),
        "test/part-000.jsonl": b"".join(lines[150:]),
        "README.md": b"# demo dataset\n",
    }


def run(kind: str, env: dict[str, str]) -> None:
    shown = " ".join(f"{k}={v}" for k, v in env.items() if k in ("STORAGE_URI", "OUTPUT_PATH"))
    print(f"\n$ {shown} {kind}-initializer", flush=True)
    full_env = {**os.environ, **env, "PROGRESS_INTERVAL": "1"}
    code = subprocess.call([sys.executable, "-m", f"initializers.{kind}"], env=full_env)
    if code:
        sys.exit(code)


def main() -> None:
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    s3_server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    s3_server.start()
    host, port = s3_server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=DEMO_KEY,
        aws_secret_access_key=DEMO_SECRET,
    )
    s3.create_bucket(Bucket="models")
    for name, body in generated_model().items():
        s3.put_object(Bucket="models", Key=f"tiny-llama/{name}", Body=body)

    with HubServer() as hub, tempfile.TemporaryDirectory() as hf_home:
        hub.add_repo("demo-org/tiny-alpaca", generated_dataset(), repo_type="dataset")
        print(f"local S3 at {endpoint}, local Hub at {hub.endpoint}; writing to {WORKSPACE}")
        model_env = {
            "STORAGE_URI": "s3://models/tiny-llama",
            "ENDPOINT": endpoint,
            "ACCESS_KEY_ID": DEMO_KEY,
            "SECRET_ACCESS_KEY": DEMO_SECRET,
            "OUTPUT_PATH": str(WORKSPACE / "model"),
        }
        dataset_env = {
            "STORAGE_URI": "hf://datasets/demo-org/tiny-alpaca",
            "HF_ENDPOINT": hub.endpoint,
            "HF_HOME": hf_home,
            "OUTPUT_PATH": str(WORKSPACE / "dataset"),
        }
        for _ in range(2):  # the second round shows the idempotent rerun
            run("model", model_env)
            run("dataset", dataset_env)
    s3_server.stop()

    print(f"\n{WORKSPACE}:")
    for path in sorted(WORKSPACE.rglob("*")):
        if path.is_file():
            print(f"  {path.relative_to(WORKSPACE)}  ({path.stat().st_size:,} bytes)")


if __name__ == "__main__":
    main()
