"""``model-initializer``: fetch a model into /workspace/model (or --output).

Defaults follow the Kubeflow model initializer: configs, tokenizers and safetensors weights;
other weight formats only when the source has no safetensors.
"""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

from initializers.config import AssetDefaults
from initializers.entrypoint import run_initializer

DEFAULTS = AssetDefaults(
    kind="model",
    output=Path("/workspace/model"),
    allow_patterns=(
        "*.json",
        "*.safetensors",
        "*.model",
        "*.txt",
        "*.gguf",
        "*.tiktoken",
        "tokenizer*",
        "*.jinja",
    ),
    ignore_patterns=("*.msgpack", "*.h5", "*.bin", "*.pt", "*.pth"),
    fallback_weights=("*.bin", "*.pt", "*.pth"),
)


def main(argv: list[str] | None = None) -> NoReturn:
    run_initializer(DEFAULTS, argv)


if __name__ == "__main__":
    main()
