"""What the operator itself puts into an engine pod: its volumes, mount paths and labels.

manifests.py builds the pod from these; spec.py refuses them as the user's own volume names,
mount paths and pod labels, so a spec cannot collide with the operator's part of the pod.
"""

from __future__ import annotations

SCRATCH = "/tmp"  # the one writable path of the read-only root filesystem
SHM = "/dev/shm"
PVC_MOUNT = "/mnt/models"
CACHE_MOUNT = "/model-cache"  # where the init container downloads hf:// and s3:// models
DRAFT_PVC_MOUNT = "/mnt/draft-model"  # a draft model's claim, where it is not the model's
ADAPTER_PVC_MOUNT = "/mnt/adapters"  # /mnt/adapters/CLAIM: an adapter claim no model uses

SCRATCH_VOLUME = "scratch"
SHM_VOLUME = "dshm"
MODEL_VOLUME = "model"
CACHE_VOLUME = "model-cache"
DRAFT_VOLUME = "draft-model"
ADAPTER_VOLUME = "adapters"  # adapters-0, adapters-1, ...: one per claim only adapters use

# spec.volumes may not take these names, nor adapters-N.
OWN_VOLUMES = (SCRATCH_VOLUME, SHM_VOLUME, MODEL_VOLUME, CACHE_VOLUME, DRAFT_VOLUME)
ADAPTER_VOLUME_PATTERN = rf"^{ADAPTER_VOLUME}-[0-9]+$"
# A volume of the spec's mounted at one of these takes the place of the operator's there (a
# larger or memory-limited scratch, a /dev/shm of the user's size even without tensor
# parallelism).
REPLACEABLE_MOUNTS = (SCRATCH, SHM)
# Where the model, its download and the adapters are read: nothing of the spec's may be
# mounted there or beneath.
OWN_MOUNTS = (PVC_MOUNT, CACHE_MOUNT, DRAFT_PVC_MOUNT, ADAPTER_PVC_MOUNT)

OWNER_LABEL = "tokenmill.io/inferenceservice"
MANAGED_BY = {"app.kubernetes.io/managed-by": "tokenmill-operator"}


def labels(name: str) -> dict[str, str]:
    """The engine pods' labels (and those of every object the operator writes for them)."""
    return {
        "app.kubernetes.io/name": "tokenmill",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/component": "inference",
        **MANAGED_BY,
        OWNER_LABEL: name,
    }


# spec.podLabels may not set these: the Service, the PDB and the pool select the pods by them.
OWN_LABELS = tuple(labels(""))
