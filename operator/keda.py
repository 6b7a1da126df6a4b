"""The KEDA ScaledObject of an InferenceService in autoscaling mode keda: KEDA asks Prometheus
for the engines' waiting requests and scales the InferenceService through its scale
subresource (never its Deployment, which the operator keeps at spec.replicas).

KEDA activates from zero when the query is above zero and hands 1..N to the HPA it creates,
which divides the query by the replicas and aims for targetQueueDepth each. With no pod there
is no engine queue: what holds requests meanwhile, and counts them, is the endpoint picker's
flow control (routing.inferencePool.endpointPicker.flowControl), whose queue the default query
adds when the service has a pool.
"""

from __future__ import annotations

from typing import Any

from .manifests import owned_metadata
from .spec import GROUP, KIND, VERSION, InferenceServiceSpec

API = "keda.sh/v1alpha1"
# An HPA scaling policy's period is at most half an hour (autoscaling/v2 validation).
MAX_POLICY_PERIOD_SECONDS = 1800
WAITING = "tokenmill_num_requests_waiting"
# The endpoint picker's count of requests its flow control holds (its own /metrics).
FLOW_CONTROL_QUEUE = "inference_extension_flow_control_queue_size"


def default_query(name: str, namespace: str, spec: InferenceServiceSpec) -> str:
    """The demand: requests waiting in this service's engines, and where a pool fronts them,
    those the picker holds for the pool (each `or vector(0)`, so an absent series, as at zero
    replicas, counts as none rather than emptying the sum)."""
    model = spec.model.served_name or name
    engines = f'sum({WAITING}{{namespace="{namespace}",model_name="{model}"}}) or vector(0)'
    if spec.inference_pool is None:
        return engines
    held = f'sum({FLOW_CONTROL_QUEUE}{{inference_pool="{name}"}}) or vector(0)'
    return f"({engines}) + ({held})"


def scaled_object(name: str, namespace: str, uid: str,
                  spec: InferenceServiceSpec) -> dict[str, Any]:
    """KEDA's ScaledObject: the bounds, the target and the scale-down delay of
    spec.autoscaling, on the InferenceService's scale subresource."""
    scaling, keda = spec.autoscaling, spec.keda
    assert scaling is not None and keda is not None
    delay = scaling.scale_down_delay_seconds
    return {
        "apiVersion": API,
        "kind": "ScaledObject",
        "metadata": owned_metadata(name, namespace, uid, component="autoscaler"),
        "spec": {
            "scaleTargetRef": {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": name},
            "minReplicaCount": scaling.min_replicas,
            "maxReplicaCount": scaling.max_replicas,
            "pollingInterval": keda.polling_interval_seconds,
            "cooldownPeriod": delay,  # the last replica goes (to zero) after this long idle
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": {
                # Up at once to what the queue asks for; down only after the delay, as the
                # built-in autoscaler does (a queue drains as soon as replicas are added).
                "scaleUp": {"stabilizationWindowSeconds": 0,
                            "policies": [{"type": "Percent", "value": 900,
                                          "periodSeconds": min(keda.polling_interval_seconds,
                                                               MAX_POLICY_PERIOD_SECONDS)}]},
                "scaleDown": {"stabilizationWindowSeconds": delay},
            }}},
            "triggers": [{
                "type": "prometheus",
                "name": "queue-depth",
                "metricType": "AverageValue",
                "metadata": {
                    "serverAddress": keda.server_address,
                    "query": keda.query or default_query(name, namespace, spec),
                    "threshold": str(scaling.target_queue_depth),
                    "activationThreshold": "0",
                },
            }],
        },
    }


def children(name: str, namespace: str, uid: str,
             spec: InferenceServiceSpec) -> list[dict[str, Any]]:
    return [scaled_object(name, namespace, uid, spec)] if spec.keda else []


KINDS = ((API, "ScaledObject", ""),)
