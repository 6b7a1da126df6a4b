"""What every stage of the GPU suite is given: where it runs, on which model, and where its raw
JSON goes.

A real run uses Llama-3.1-8B's shapes with random bf16 weights, made on the GPU (the vocabulary
a word-level tokenizer of Llama 3's size), and the stages' full workloads. A dry run uses a tiny
random Llama in float32 on the CPU and cut-down workloads; it writes the same JSON shape.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

FULL_SHAPE = "llama-3.1-8b"
# A tiny Llama of the same architecture, for dry runs.
TINY_SHAPE = ("LlamaConfig", dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=2048))
DEFAULT_MODEL_DIR = "/tmp/tokenmill-gpu-suite-model"


@dataclasses.dataclass
class SuiteContext:
    stage: str
    out_dir: Path
    prefix: str
    dry_run: bool
    model_dir: Path
    show_progress: bool = True

    @property
    def device(self) -> str:
        return "cpu" if self.dry_run else "cuda"

    @property
    def dtype(self) -> str:
        return "float32" if self.dry_run else "bfloat16"

    def model(self) -> str:
        """The benchmark checkpoint, made on first use (random weights: only shapes matter)."""
        from tokenmill.engine.bench import random_model

        if not (self.model_dir / "config.json").exists():
            shape = TINY_SHAPE if self.dry_run else FULL_SHAPE
            status(f"making a random-weight {'tiny Llama' if self.dry_run else shape} "
                   f"in {self.model_dir}")
            random_model.make_model(shape, str(self.model_dir), self.dtype,
                                    max_shard_size=None if self.dry_run else "5GB",
                                    tokenizer="word-level", device=self.device)
        return str(self.model_dir)

    def write(self, name: str, result: dict[str, Any]) -> Path:
        """Write one raw JSON file, <prefix>-<name>.json, with the machine and revision."""
        import torch

        from tokenmill.engine.bench import report
        from tokenmill.engine.kernels import launch_configs

        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / f"{self.prefix}-{name}.json"
        payload = {
            "suite": "gpu-acceptance",
            "stage": self.stage,
            "name": name,
            "dry_run": self.dry_run,
            "command": report.command_line(),
            "machine": report.machine_info(self.device),
            "git": report.git_revision(),
            "kernel_launch_configs": launch_configs.source(torch.device(self.device)),
            "result": result,
        }
        path.write_text(json.dumps(payload, indent=1, default=_jsonable) + "\n")
        status(f"wrote {path}")
        return path


def default_prefix(dry_run: bool) -> str:
    """gpu-<GPU model> (gpu-h100, gpu-h200), or gpu-dry-run."""
    if dry_run:
        return "gpu-dry-run"
    import torch

    name = torch.cuda.get_device_name().lower() if torch.cuda.is_available() else "none"
    for model in ("h100", "h200", "b200", "a100", "l40s", "l4"):
        if model in name:
            return f"gpu-{model}"
    return "gpu-" + "".join(c if c.isalnum() else "-" for c in name).strip("-")


def status(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return str(value)
