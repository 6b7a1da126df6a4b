"""hf://ORG/NAME[@REVISION] through the hub's own client: its cache layout
(models--ORG--NAME/{blobs,snapshots,refs}), HF_TOKEN for gated and private models,
HF_ENDPOINT for a mirror, HF_HUB_OFFLINE=1 to use a populated cache with no network. The
client writes each file as a `.incomplete` blob, resumes it, and locks it per blob, so two
processes downloading one model share the work safely."""

from __future__ import annotations

import os

from tokenmill.engine.models.fetch.cache import check_free_space
from tokenmill.engine.models.fetch.errors import ModelFetchError
from tokenmill.engine.models.fetch.patterns import unwanted
from tokenmill.engine.models.fetch.progress import hub_progress_class
from tokenmill.engine.models.fetch.uri import HubModel
from tokenmill.engine.models.weight_files import TORCH_WEIGHTS, skipped_weight_files

# What the engine loads: config, tokenizer, chat template and safetensors weights (PyTorch's
# pickled ones where a model has no others: skipped_weight_files passes over the rest).
ALLOW_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.tiktoken", "*.txt",
                  "*.jinja", TORCH_WEIGHTS]


def fetch_hub(model: HubModel, download_dir: str | None,
              ignore_patterns: tuple[str, ...] = ()) -> str:
    """The local snapshot directory of the model, downloaded first if the cache lacks it;
    files matching `ignore_patterns` are left out, unless the repository is a LoRA adapter."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import DryRunError

    cache = download_dir or constants.HF_HUB_CACHE
    options = dict(repo_id=model.repo_id, revision=model.revision, cache_dir=cache,
                   allow_patterns=ALLOW_PATTERNS, tqdm_class=hub_progress_class(model.uri))
    try:
        try:
            plan = snapshot_download(**options, dry_run=True)
        except DryRunError:
            pass  # offline or unreachable: the real call finds the cache or says why
        else:
            names = [f.filename for f in plan]
            # Mistral's second copy of the weights, PyTorch's pickled one, the user's patterns
            skipped = skipped_weight_files(names) + unwanted(names, ignore_patterns)
            if skipped:
                options["ignore_patterns"] = skipped
            needed = sum(f.file_size or 0 for f in plan
                         if f.will_download and f.filename not in skipped)
            check_free_space(cache, needed, model.uri)
        return snapshot_download(**options)
    except ModelFetchError:
        raise
    except Exception as exc:
        raise _error(model, cache, exc) from exc


def _error(model: HubModel, cache: str, exc: Exception) -> ModelFetchError:
    """The hub client's exception as one line naming the cause."""
    from huggingface_hub import errors

    revision = model.revision or "main"
    if isinstance(exc, errors.GatedRepoError):
        cause = (f"{model.repo_id} is gated: accept its terms on the hub, then set HF_TOKEN "
                 "to a token of that account")
    elif isinstance(exc, errors.RepositoryNotFoundError):
        cause = (f"repository {model.repo_id} not found on the hub (a private one needs "
                 "HF_TOKEN)")
    elif isinstance(exc, errors.RevisionNotFoundError):
        cause = f"revision {revision!r} not found in {model.repo_id}"
    elif isinstance(exc, errors.LocalEntryNotFoundError):
        how = ("HF_HUB_OFFLINE is set" if os.environ.get("HF_HUB_OFFLINE", "0") not in
               ("", "0", "false") else "the hub cannot be reached")
        cause = f"revision {revision!r} is not in the cache {cache} and {how}"
    elif isinstance(exc, errors.HfHubHTTPError) and exc.response is not None:
        cause = f"the hub answered HTTP {exc.response.status_code}"
    else:
        cause = f"{type(exc).__name__}: {exc}"
    return ModelFetchError(model.uri, cause)
