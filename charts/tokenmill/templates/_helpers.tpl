{{- define "tokenmill.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- printf "%s-operator" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s-operator" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "tokenmill.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "tokenmill.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tokenmill.serviceAccountName" -}}
{{- default (include "tokenmill.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "tokenmill.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* What the operator does to the objects it reconciles; shared by the Role and ClusterRole. */}}
{{- define "tokenmill.rules" -}}
- apiGroups: [tokenmill.io]
  resources: [inferenceservices]
  verbs: [get, list, watch, patch]
- apiGroups: [tokenmill.io]
  resources: [inferenceservices/status]
  verbs: [get, patch]
# Children's owner references set blockOwnerDeletion, which the API server's
# OwnerReferencesPermissionEnforcement admission (on by default in OpenShift) allows only to
# those who may update the owner's finalizers.
- apiGroups: [tokenmill.io]
  resources: [inferenceservices/finalizers]
  verbs: [update]
# delete: only the endpoint picker's Deployment and Service, when spec.routing goes (an
# InferenceService's own go with it, by garbage collection).
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [services]
  verbs: [get, list, watch, create, patch, delete]
# spec.routing.inferencePool: the pool, the Gateway's route, and the endpoint picker's identity
# and namespaced permissions. The API server lets the operator grant the picker only what it
# holds itself: hence list and watch on inferencepools and read on inferenceobjectives, which
# the operator never calls.
- apiGroups: [""]
  resources: [serviceaccounts]
  verbs: [get, create, patch, delete]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [get, create, patch, delete]
- apiGroups: [inference.networking.k8s.io]
  resources: [inferencepools]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [inference.networking.x-k8s.io]
  resources: [inferenceobjectives]
  verbs: [get, list, watch]
- apiGroups: [gateway.networking.k8s.io]
  resources: [httproutes]
  verbs: [get, create, patch, delete]
# autoscaling.mode keda: the ScaledObject on the InferenceService's scale subresource.
- apiGroups: [keda.sh]
  resources: [scaledobjects]
  verbs: [get, create, patch, delete]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, list, watch, create, patch, delete]
# Events: the operator's own; and the kubelet's FailedMount about engine pods, read while a
# pod waits for its volumes.
- apiGroups: [""]
  resources: [events]
  verbs: [create, list]
# Engine pods: their state goes into the status (why not ready); the built-in autoscaler reads
# which are ready and their IPs. Pods are never written.
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch]
{{- if .Values.peering.enabled }}
- apiGroups: [kopf.dev]
  resources: [kopfpeerings]
  verbs: [get, list, watch, patch]
{{- end }}
{{- end -}}
