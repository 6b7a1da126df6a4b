"""The operator's own Prometheus metrics, served on --metrics-port.

Counters only: how often reconcile passes run and fail, what the autoscaler decided, and how
often an engine's /metrics could not be read. They say whether the operator keeps up; the
replica counts themselves are in each InferenceService's status.
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Counter, start_http_server

REGISTRY = CollectorRegistry()

RECONCILES = Counter("tokenmill_operator_reconciles", "Reconcile passes of InferenceServices.",
                     ["trigger"], registry=REGISTRY)
RECONCILE_ERRORS = Counter("tokenmill_operator_reconcile_errors",
                           "Reconcile passes that failed on a Kubernetes API error.",
                           ["trigger"], registry=REGISTRY)
DECISIONS = Counter("tokenmill_operator_autoscaler_decisions",
                    "Built-in autoscaler decisions, by reason (ScaledUp, ScaledDown, Steady, ...).",
                    ["reason"], registry=REGISTRY)
SCRAPE_FAILURES = Counter("tokenmill_operator_autoscaler_scrape_failures",
                          "Ready engine pods whose /metrics could not be read.",
                          registry=REGISTRY)

for trigger in ("spec", "child"):
    RECONCILES.labels(trigger)
    RECONCILE_ERRORS.labels(trigger)


def serve(port: int, addr: str = "0.0.0.0") -> None:
    """Serve /metrics on a background thread; a taken port costs the metrics, not the operator."""
    try:
        start_http_server(port, addr=addr, registry=REGISTRY)
    except OSError as e:
        logging.getLogger(__name__).warning(f"metrics not served: port {port}: {e.strerror}")
