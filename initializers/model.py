"""``model-initializer``: fetch a model into /workspace/model (or --output).

Defaults follow the Kubeflow model initializer: configs, tokenizers and safetensors weights;
other weight formats only when the source has no safetensors.
"""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

from initializers.config import AssetDefaults
from initializers.environment import prepare_native_allocator

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
    prepare_native_allocator()  # before the CLI's imports load the native client, which reads it
    from initializers.cli import main_for

    main_for(DEFAULTS, argv)


if __name__ == "__main__":
    main()
