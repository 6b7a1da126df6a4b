"""The tokenmill Kubernetes operator: InferenceService reconciliation (kopf)."""
