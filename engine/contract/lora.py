"""LoRA adapters as options name them: `--lora-modules` entries, checked without torch (the
operator checks `spec.adapters` with the same rules).

An entry is vLLM's `NAME=PATH` or its JSON form `{"name": NAME, "path": PATH}`. PATH is a
PEFT adapter directory (adapter_config.json + adapter_model.safetensors) or anything a model
source accepts (hf://ORG/NAME[@REVISION], s3://BUCKET/PREFIX). NAME is what a request's
`model` field selects, so it follows the same rules as a served model name.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

# What a request may put in `model` and a Kubernetes label value may hold (the operator labels
# by adapter): letters, digits, '.', '_', '-', starting and ending alphanumeric.
NAME_PATTERN = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")
MAX_LORA_RANK = 512  # the largest --max-lora-rank (vLLM's largest supported rank)
# How an engine that cannot load a --lora-modules adapter ends its start-up (its last log
# line, where the error is a quoted logfmt value): the operator finds the adapter and the
# reason in the container's termination message.
STARTUP_FAILURE = re.compile(
    r"lora_modules: LoRA adapter '(?P<name>[^']+)': (?P<reason>.+?)\"?$")


class LoRAModuleError(ValueError):
    """What is wrong with an adapter entry, in the entry's own terms."""


@dataclass(frozen=True)
class LoRAModule:
    name: str
    path: str

    @classmethod
    def parse(cls, entry: str) -> LoRAModule:
        """From `NAME=PATH` or `{"name": NAME, "path": PATH}`; LoRAModuleError if invalid."""
        text = entry.strip()
        if text.startswith("{"):
            try:
                data = json.loads(text)
            except json.JSONDecodeError as e:
                raise LoRAModuleError(f"{entry!r} is not JSON ({e.msg})") from None
            if not isinstance(data, dict) or set(data) - {"name", "path", "base_model_name"}:
                raise LoRAModuleError(f"{entry!r}: the JSON form takes \"name\" and \"path\"")
            name, path = data.get("name"), data.get("path")
        else:
            name, sep, path = text.partition("=")
            if not sep:
                raise LoRAModuleError(f"{entry!r} is not NAME=PATH")
        if not isinstance(name, str) or not isinstance(path, str) or not path:
            raise LoRAModuleError(f"{entry!r} needs a name and a path")
        check_name(name)
        return cls(name, path)


def check_name(name: str) -> None:
    """LoRAModuleError unless `name` can be a request's model name and a label value."""
    if not NAME_PATTERN.match(name):
        raise LoRAModuleError(
            f"adapter name {name!r} must be 1-63 letters, digits, '.', '_' or '-', starting and "
            "ending with a letter or digit")


def parse_modules(entries: tuple[str, ...] | list[str]) -> list[LoRAModule]:
    """Every entry parsed; LoRAModuleError on a bad one or a name given twice."""
    modules = [LoRAModule.parse(e) for e in entries]
    seen: set[str] = set()
    for module in modules:
        if module.name in seen:
            raise LoRAModuleError(f"adapter name {module.name!r} is given twice")
        seen.add(module.name)
    return modules
