"""The cluster's DNS domain, which the in-cluster URL in `status.url` ends with.

Most clusters use `cluster.local`, but the kubelet's `--cluster-domain` may set another, and a
URL under the wrong one resolves nowhere. As Knative finds it: `--cluster-domain` (env
TOKENMILL_CLUSTER_DOMAIN) where given; else the search path the kubelet wrote into this pod's
/etc/resolv.conf (`NAMESPACE.svc.DOMAIN svc.DOMAIN DOMAIN`); else `cluster.local`.
"""

from __future__ import annotations

import functools
import os

DEFAULT = "cluster.local"
RESOLV_CONF = "/etc/resolv.conf"


@functools.cache
def cluster_domain() -> str:
    named = os.environ.get("TOKENMILL_CLUSTER_DOMAIN", "").strip().strip(".")
    if named:
        return named
    try:
        with open(RESOLV_CONF, encoding="utf-8", errors="replace") as f:
            return from_resolv_conf(f.read()) or DEFAULT
    except OSError:
        return DEFAULT


def from_resolv_conf(text: str) -> str | None:
    """The domain after `svc.` in the last `search` line's first such entry (the resolver
    takes the last search line), or None."""
    searches = [line.split()[1:] for line in text.splitlines()
                if line.split()[:1] == ["search"]]
    for entry in searches[-1] if searches else []:
        if entry.startswith("svc.") and len(entry) > len("svc."):
            return entry.removeprefix("svc.").rstrip(".")
    return None
