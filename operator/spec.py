"""The InferenceService spec and status as pydantic models.

These models are the single source of the CRD's OpenAPI schema (see crd.py) and parse the spec
the operator reconciles, so the schema the API server enforces and the one the operator reads
can never disagree. Cross-field rules are CEL (`x-kubernetes-validations`) so `kubectl apply`
rejects a bad spec with a readable message; `check()` repeats the rules the engine would
enforce, for clusters (and emulators) that do not run CEL.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from tokenmill.engine.contract.config import DEFAULT_MODEL, SUPPORTED, TENSOR_PARALLEL_SIZES
from tokenmill.engine.contract.lora import MAX_LORA_RANK, NAME_PATTERN, LoRAModuleError, check_name
from tokenmill.engine.contract.speculative import (
    DEFAULT_PROMPT_LOOKUP_MAX,
    DEFAULT_PROMPT_LOOKUP_MIN,
    MAX_PROMPT_LOOKUP,
    MAX_SPECULATIVE_TOKENS,
    METHODS,
)

from .model_shapes import KNOWN_MODELS, tp_problem, tp_rules
from .pod_layout import ADAPTER_VOLUME_PATTERN, OWN_LABELS, OWN_MOUNTS, OWN_VOLUMES

GROUP = "tokenmill.io"
VERSION = "v1alpha1"
KIND = "InferenceService"
PLURAL = "inferenceservices"

# model.uri: a built-in model name, or one of these forms (what a user writes: the patterns a
# URI of that form must all match; RE2, which CEL uses, has no lookahead, so a length bound is
# a pattern of its own). A bare name that is not built in is refused, since the engine would
# look for it as a directory in the pod. The patterns also go into CEL string literals: no
# backslashes.
# hf://: the hub's repo id rules (huggingface_hub validate_repo_id): ORG and NAME of letters,
# digits, '-', '_', '.', starting and ending with a letter, digit or '_', no '--' or '..', at
# most 96 characters each; a revision is a branch, tag, commit or refs/pr/N.
_HUB_PART = "[A-Za-z0-9_]+(([-.]|-[.]|[.]-)[A-Za-z0-9_]+)*"
# s3://: S3's bucket naming rules: 3 to 63 lowercase letters, digits, '.', '-', labels between
# dots starting and ending with a letter or digit (so no '..'); the prefix is any key prefix.
_BUCKET_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
MODEL_URI_FORMS = {
    "a path in the image (/models/NAME)": ("/.+",),
    "pvc://CLAIM/PATH": ("pvc://[a-z0-9]([-a-z0-9.]*[a-z0-9])?/.*",),
    "hf://ORG/NAME[@REVISION] (ORG and NAME: up to 96 letters, digits, '-', '_', '.')": (
        f"hf://{_HUB_PART}/{_HUB_PART}(@[A-Za-z0-9_][-A-Za-z0-9_./]*)?",
        "hf://[^/@]{1,96}/[^/@]{1,96}(@.{1,255})?"),
    "s3://BUCKET/PREFIX (BUCKET: 3 to 63 lowercase letters, digits, '.', '-')": (
        f"s3://{_BUCKET_LABEL}([.]{_BUCKET_LABEL})*(/.*)?",
        "s3://[^/]{3,63}(/.*)?"),
}
REMOTE_SCHEMES = ("hf://", "s3://")  # fetched by an init container into the model cache
# The forms the pod reads without a download: what a draft model may be (the init container
# fetches spec.model alone).
LOCAL_URI_FORMS = {form: patterns for form, patterns in MODEL_URI_FORMS.items()
                   if not form.startswith(REMOTE_SCHEMES)}
BUILTIN_MODELS = tuple(KNOWN_MODELS)
MODEL_URI_MESSAGE = (f"model.uri must be a built-in model name ({', '.join(BUILTIN_MODELS)}), "
                     f"{', '.join(list(MODEL_URI_FORMS)[:-1])} or {list(MODEL_URI_FORMS)[-1]}")


def _full(pattern: str) -> str:
    return f"^({pattern})$"


def model_uri_ok(uri: str, forms: dict[str, tuple[str, ...]] = MODEL_URI_FORMS,
                 builtins: tuple[str, ...] = BUILTIN_MODELS) -> bool:
    """Whether a model URI has one of the accepted forms (the CEL rule, for the operator)."""
    return uri in builtins or any(
        all(re.match(_full(p), uri) for p in patterns) for patterns in forms.values())


def _model_uri_rule(forms: dict[str, tuple[str, ...]] = MODEL_URI_FORMS,
                    builtins: tuple[str, ...] = BUILTIN_MODELS) -> str:
    matches = [" && ".join(f"self.matches('{_full(p)}')" for p in patterns)
               for patterns in forms.values()]
    named = [f"self in [{', '.join(repr(n) for n in builtins)}]"] if builtins else []
    return " || ".join([*named, *(f"({match})" for match in matches)])


QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"
# Kubernetes' name and key formats (k8s.io/apimachinery/pkg/util/validation).
DNS_LABEL_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"  # the object's name: it names the Service
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
# label and annotation keys: [dns-subdomain/]name; `[.]`, not `\.`: the pattern also goes into
# a CEL string literal, where `\.` is not a valid escape.
QUALIFIED_NAME_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?" + _NAME + "$")
LABEL_VALUE_PATTERN = r"^(" + _NAME + ")?$"
# An extended resource is always domain-qualified (vendor.com/gpu).
RESOURCE_NAME_PATTERN = (
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+/" + _NAME + "$")
ENV_NAME_PATTERN = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"
# registry/repository[:tag][@digest], no whitespace: what the kubelet can pull.
IMAGE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/@-]*$"
PARENT_SEGMENT = r"(^|/)[.][.](/|$)"  # `..` in a model path would leave the mounted volume
# A Secret's data key (IsConfigMapKey): letters, digits, '-', '_', '.'; not '.', '..' or '..x'.
SECRET_KEY_PATTERN = r"^[.]?[-_a-zA-Z0-9][-._a-zA-Z0-9]*$"
API_KEY_ENV = "TOKENMILL_API_KEY"  # what `tokenmill serve` reads when --api-key is not given
API_KEY_SECRET_KEY = "api-key"
# Bounds on lists, maps and strings keep the CEL rules' cost estimates under the API server's
# budget (a rule over an unbounded list is refused when the CRD is created).
MAX_MAP_ENTRIES = 64
MAX_LIST_ITEMS = 128
MAX_URI_LENGTH = 1024
# A qualified name: a DNS subdomain prefix (253), '/', a name (63).
MAX_QUALIFIED_NAME = 253 + 1 + 63
# podAnnotations land in the pod template's annotations, which the API server caps at 256 KiB in
# total: 64 keys and values of this size, with the operator's prometheus.io annotations, fit.
MAX_POD_ANNOTATION_VALUE = 3 * 1024


def _cel(rule: str, message: str) -> dict[str, str]:
    return {"rule": rule, "message": message}


def _list_map(key: str) -> dict[str, Any]:
    """A list keyed by one field of its items: the API server refuses a key given twice,
    naming the entry, and a server-side apply merges the list by key."""
    return {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": [key]}


def kubernetes_type(definition: str, *rules: dict[str, str]) -> WithJsonSchema:
    """A field typed by a Kubernetes API definition (io.k8s.api.core.v1.Toleration, ...): the
    CRD generator inlines the definition's schema, so the API server checks it at apply; `rules`
    are CEL rules of ours on each value."""
    extra = {"x-kubernetes-validations": list(rules)} if rules else {}
    return WithJsonSchema({"type": "object", "x-tokenmill-kubernetes-type": definition, **extra})


Toleration = Annotated[dict[str, Any], kubernetes_type("io.k8s.api.core.v1.Toleration")]
Affinity = Annotated[dict[str, Any], kubernetes_type("io.k8s.api.core.v1.Affinity")]
EnvVarSource = Annotated[dict[str, Any], kubernetes_type("io.k8s.api.core.v1.EnvVarSource")]
PodSecurityContext = Annotated[
    dict[str, Any], kubernetes_type("io.k8s.api.core.v1.PodSecurityContext")]
SecurityContext = Annotated[dict[str, Any], kubernetes_type("io.k8s.api.core.v1.SecurityContext")]
TopologySpreadConstraint = Annotated[
    dict[str, Any], kubernetes_type("io.k8s.api.core.v1.TopologySpreadConstraint")]

# spec.volumes and spec.volumeMounts: the user's own, beside the operator's (pod_layout.py).
MAX_VOLUMES = 32
OWN_VOLUME_MESSAGE = (f"volumes[].name must not be one of the operator's own volumes "
                      f"({', '.join(OWN_VOLUMES)}, adapters-N)")
OWN_MOUNT_MESSAGE = (f"volumeMounts[].mountPath must not be {', '.join(OWN_MOUNTS)} or beneath "
                     "them: the operator mounts the model, its download and the adapters there")
MOUNTED_VOLUME_MESSAGE = "volumeMounts[].name must be the name of one of spec.volumes"
OWN_LABEL_MESSAGE = (f"podLabels must not set the operator's own labels ({', '.join(OWN_LABELS)})"
                     ": the Service, the PodDisruptionBudget and the autoscaler select the "
                     "engine pods by them")


def _quoted(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{v}'" for v in values) + "]"


Volume = Annotated[dict[str, Any], kubernetes_type(
    "io.k8s.api.core.v1.Volume",
    _cel(f"!(self.name in {_quoted(OWN_VOLUMES)}) && "
         f"!self.name.matches('{ADAPTER_VOLUME_PATTERN}')", OWN_VOLUME_MESSAGE))]
VolumeMount = Annotated[dict[str, Any], kubernetes_type(
    "io.k8s.api.core.v1.VolumeMount",
    _cel(" && ".join(f"self.mountPath != '{p}' && !self.mountPath.startsWith('{p}/')"
                     for p in OWN_MOUNTS), OWN_MOUNT_MESSAGE))]


def one_of(values: tuple[Any, ...], message: str) -> Any:
    """A field taking one of `values`: Literal for the operator's parse, and in the CRD a CEL
    rule on the field instead of an enum, so one bad value is one message saying what is
    allowed (an enum error blocks every CEL rule of the object and adds a second message,
    'some validation rules were not checked', on current API servers; older ones print the
    enum's and the rules' messages)."""
    listed = ", ".join(f"'{v}'" if isinstance(v, str) else str(v) for v in values)
    kind = "integer" if all(isinstance(v, int) for v in values) else "string"
    return Annotated[Literal[values], WithJsonSchema({  # type: ignore[valid-type]
        "type": kind, "x-kubernetes-validations": [_cel(f"self in [{listed}]", message)]})]


def _listed(values: tuple[Any, ...]) -> str:
    words = [str(v) for v in values]
    return ", ".join(words[:-1]) + f" or {words[-1]}" if len(words) > 1 else words[0]


def _supported(option: str) -> Any:
    """The values of an engine option this engine build runs (engine config SUPPORTED); an
    unset engine option is spelled auto."""
    values = tuple("auto" if v is None else v for v in SUPPORTED[option])
    field = to_camel(option)
    return one_of(values, f"engine.{field} must be {_listed(values)}: this tokenmill version "
                          "supports only these; the engine does not implement other values yet")


# A Kubernetes quantity, an integer or a string as in a Pod (`cpu: 2`, `memory: 32Gi`); the
# API server validates an int-or-string node as type [integer, string].
Quantity = Annotated[
    Annotated[StrictInt, Field(ge=0)] | Annotated[str, Field(pattern=QUANTITY_PATTERN)],
    WithJsonSchema({"x-kubernetes-int-or-string": True, "pattern": QUANTITY_PATTERN,
                    "minimum": 0})]


def _keys_rule(pattern: str, what: str) -> dict[str, str]:
    return _cel(f"self.all(k, size(k) <= {MAX_QUALIFIED_NAME} && k.matches('{pattern}'))",
                f"every {what} must be a Kubernetes qualified name ([prefix/]name, name at most "
                "63 characters of letters, digits, '-', '_', '.', starting and ending with a "
                "letter or digit, prefix a DNS subdomain of at most 253)")


class _Spec(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


def _validations(*rules: dict[str, str]) -> ConfigDict:
    return ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid",
        json_schema_extra={"x-kubernetes-validations": list(rules)},
    )


class ModelCacheSpec(_Spec):
    """Where a hf:// or s3:// model is downloaded: by default an emptyDir per pod (each pod
    downloads it); with pvc, a claim every replica and restart shares (downloaded once)."""

    pvc: str | None = Field(
        None, pattern=DNS_SUBDOMAIN_PATTERN, max_length=253,
        description="A PersistentVolumeClaim in the InferenceService's namespace, ReadWriteMany "
                    "with more than one replica; the download writes it, the engine reads it.")


class SecretRef(_Spec):
    """A Secret in the InferenceService's namespace, by name."""

    name: str = Field(pattern=DNS_SUBDOMAIN_PATTERN, max_length=253,
                      description="The Secret's name.")


_REMOTE_ONLY = ("model.cache and model.credentialsSecretRef apply only to downloads: a hf:// or "
                "s3:// model.uri or adapter uri")


def _remote(field: str) -> str:
    """CEL: the string `field` names a store the init container downloads from."""
    return "(" + " || ".join(f"{field}.startsWith('{s}')" for s in REMOTE_SCHEMES) + ")"


class ModelSpec(_Spec):
    """Which model to serve and under which name."""

    model_config = _validations(
        _cel(f"!has(self.uri) || !self.uri.matches('{PARENT_SEGMENT}')",
             "model.uri must not contain '..' path segments"))

    uri: str = Field(
        DEFAULT_MODEL, max_length=MAX_URI_LENGTH,
        description="A path inside the image (/models/x), pvc://CLAIM/PATH (mounted read-only), "
                    "hf://ORG/NAME[@REVISION] or s3://BUCKET/PREFIX (downloaded by an init "
                    f"container), or a built-in model name ({', '.join(BUILTIN_MODELS)}).",
        json_schema_extra={"x-kubernetes-validations": [
            _cel(_model_uri_rule(), MODEL_URI_MESSAGE)]},
    )
    served_name: str | None = Field(
        None, min_length=1, max_length=256,
        description="Model name clients send in OpenAI requests; default: the "
                    "InferenceService's name.",
    )
    cache: ModelCacheSpec | None = Field(
        None, description=ModelCacheSpec.__doc__)
    credentials_secret_ref: SecretRef | None = Field(
        None, description="A Secret whose keys become environment variables of the download "
                          "only (HF_TOKEN; AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, "
                          "AWS_SESSION_TOKEN, AWS_REGION, AWS_ENDPOINT_URL); the kubelet "
                          "reads it, the operator never does.")

    @field_validator("uri")
    @classmethod
    def _no_parent_segments(cls, uri: str) -> str:
        if not model_uri_ok(uri):
            raise ValueError(MODEL_URI_MESSAGE)
        if re.search(PARENT_SEGMENT, uri):
            raise ValueError("must not contain '..' path segments")
        return uri

    @property
    def remote(self) -> bool:
        """Whether the model is downloaded (hf://, s3://) before the engine starts."""
        return self.uri.startswith(REMOTE_SCHEMES)


# spec.adapters: LoRA adapters over the served model, from the same sources as the model (no
# built-in names: none is an adapter).
ADAPTERS = "spec.adapters"
MAX_ADAPTERS = 32  # each is a download, a --lora-modules entry and host memory in every pod
MAX_LORAS = MAX_ADAPTERS  # adapters in one batch: device slots, at most one per adapter
ADAPTER_URI_MESSAGE = (
    f"an adapter's uri must be {', '.join(list(MODEL_URI_FORMS)[:-1])} or "
    f"{list(MODEL_URI_FORMS)[-1]} (no built-in names)")
ADAPTER_PARENT_MESSAGE = "an adapter's uri must not contain '..' path segments"
ADAPTER_NAME_RULE = ("letters, digits, '.', '_' or '-', 1 to 63, starting and ending with a "
                     "letter or digit")
SERVED_NAME_MESSAGE = (
    f"{ADAPTERS}[].name must differ from the served model name (spec.model.servedName, else "
    "metadata.name): a request's model field selects one of them")
LORA_OPTIONS_MESSAGE = ("engine.maxLoras, engine.maxLoraRank and engine.maxCpuLoras apply only "
                        "with spec.adapters")
CPU_LORAS_MESSAGE = ("engine.maxCpuLoras must be at least engine.maxLoras (default: the number "
                     "of adapters)")


class AdapterSpec(_Spec):
    """A LoRA adapter served over the model: requests select it by name in `model`."""

    name: Annotated[str, WithJsonSchema(
        {"type": "string", "pattern": NAME_PATTERN.pattern, "maxLength": 63})] = Field(
        description=f"What a request's model field selects: {ADAPTER_NAME_RULE}; not the "
                    "served model's name.")
    uri: str = Field(
        max_length=MAX_URI_LENGTH,
        description="A path inside the image, pvc://CLAIM/PATH (mounted read-only), "
                    "hf://ORG/NAME[@REVISION] or s3://BUCKET/PREFIX (downloaded by the init "
                    "container with the model, into its cache, with its credentials).",
        json_schema_extra={"x-kubernetes-validations": [
            _cel(_model_uri_rule(MODEL_URI_FORMS, ()), ADAPTER_URI_MESSAGE),
            _cel(f"!self.matches('{PARENT_SEGMENT}')", ADAPTER_PARENT_MESSAGE)]})

    @field_validator("name")
    @classmethod
    def _lora_name(cls, name: str) -> str:
        try:
            check_name(name)  # the engine's own rule for --lora-modules names
        except LoRAModuleError as e:
            raise ValueError(str(e)) from None
        return name

    @field_validator("uri")
    @classmethod
    def _source(cls, uri: str) -> str:
        if not model_uri_ok(uri, MODEL_URI_FORMS, ()):
            raise ValueError(ADAPTER_URI_MESSAGE)
        if re.search(PARENT_SEGMENT, uri):
            raise ValueError(ADAPTER_PARENT_MESSAGE)
        return uri

    @property
    def remote(self) -> bool:
        """Whether the init container downloads it (hf://, s3://)."""
        return self.uri.startswith(REMOTE_SCHEMES)


def served_name_rule() -> dict[str, str]:
    """CEL at the object's root, the one node that sees metadata.name (the served name unless
    spec.model.servedName is set): no adapter may take the served model's name."""
    served = ("(has(self.spec.model) && has(self.spec.model.servedName) ? "
              "self.spec.model.servedName : self.metadata.name)")
    return _cel(f"!has(self.spec) || !has(self.spec.adapters) || "
                f"!self.spec.adapters.exists(a, a.name == {served})", SERVED_NAME_MESSAGE)


SPECULATIVE = "spec.engine.speculative"
DRAFT_MODEL_MESSAGE = (
    f"{SPECULATIVE}.model must be a built-in model name ({', '.join(BUILTIN_MODELS)}), "
    f"{', '.join(list(LOCAL_URI_FORMS)[:-1])} or {list(LOCAL_URI_FORMS)[-1]}: the operator "
    "downloads spec.model.uri alone, so a hf:// or s3:// draft model goes into the image or "
    "onto a claim")
DRAFT_PARENT_MESSAGE = f"{SPECULATIVE}.model must not contain '..' path segments"
LOOKUP_MESSAGE = (f"{SPECULATIVE}.promptLookupMin must not be greater than "
                  f"{SPECULATIVE}.promptLookupMax ({DEFAULT_PROMPT_LOOKUP_MAX} when not set)")
DRAFT_NEEDS_MODEL = f"{SPECULATIVE}.model is required with method draft: the draft model"
NGRAM_TAKES_NO_MODEL = (f"{SPECULATIVE}.model is only for method draft; method ngram proposes "
                        "from the sequence itself")


class SpeculativeSpec(_Spec):
    """Speculative decoding (the engine's --speculative-config): each step proposes up to
    numSpeculativeTokens tokens per sequence, by prompt lookup (ngram) or with a small draft
    model (draft), and verifies them in one forward pass, so greedy output is unchanged."""

    model_config = _validations(
        _cel(f"!has(self.promptLookupMin) || self.promptLookupMin <= "
             f"(has(self.promptLookupMax) ? self.promptLookupMax : {DEFAULT_PROMPT_LOOKUP_MAX})",
             LOOKUP_MESSAGE),
        _cel("self.method != 'draft' || has(self.model)", DRAFT_NEEDS_MODEL),
        # Written so that a method outside the set is its own rule's one message.
        _cel("!has(self.model) || self.method != 'ngram'", NGRAM_TAKES_NO_MODEL),
    )

    method: one_of(  # type: ignore[valid-type]
        METHODS, f"{SPECULATIVE}.method must be {_listed(METHODS)}") = Field(
        description="ngram: propose the tokens that followed the latest earlier occurrence of "
                    "the sequence's last tokens (prompt lookup, no second model); draft: "
                    "propose with the draft model in model.")
    model: str | None = Field(
        None, max_length=MAX_URI_LENGTH,
        description="method draft: the draft model, a path inside the image, pvc://CLAIM/PATH "
                    "(mounted read-only) or a built-in model name; it must share the served "
                    "model's tokenizer.",
        json_schema_extra={"x-kubernetes-validations": [
            _cel(_model_uri_rule(LOCAL_URI_FORMS), DRAFT_MODEL_MESSAGE),
            _cel(f"!self.matches('{PARENT_SEGMENT}')", DRAFT_PARENT_MESSAGE)]})
    num_speculative_tokens: StrictInt = Field(
        ge=1, le=MAX_SPECULATIVE_TOKENS,
        description="Tokens proposed per sequence and step.")
    prompt_lookup_max: StrictInt | None = Field(
        None, ge=1, le=MAX_PROMPT_LOOKUP,
        description=f"method ngram: the longest suffix of the sequence looked up in it; "
                    f"default {DEFAULT_PROMPT_LOOKUP_MAX}.")
    prompt_lookup_min: StrictInt | None = Field(
        None, ge=1, le=MAX_PROMPT_LOOKUP,
        description=f"method ngram: the shortest suffix looked up, at most promptLookupMax; "
                    f"default {DEFAULT_PROMPT_LOOKUP_MIN}.")
    disable_by_batch_size: StrictInt | None = Field(
        None, ge=1,
        description="Speculation pauses while at least this many sequences run (a batch that "
                    "large gains less than verifying costs); default: never.")

    @field_validator("model")
    @classmethod
    def _local_model(cls, uri: str | None) -> str | None:
        if uri is not None and not model_uri_ok(uri, LOCAL_URI_FORMS):
            raise ValueError(DRAFT_MODEL_MESSAGE)
        if uri is not None and re.search(PARENT_SEGMENT, uri):
            raise ValueError(DRAFT_PARENT_MESSAGE)
        return uri

    @model_validator(mode="after")
    def _consistent(self) -> SpeculativeSpec:
        high = self.prompt_lookup_max or DEFAULT_PROMPT_LOOKUP_MAX
        if self.prompt_lookup_min is not None and self.prompt_lookup_min > high:
            raise ValueError(LOOKUP_MESSAGE)
        if self.method == "draft" and self.model is None:
            raise ValueError(DRAFT_NEEDS_MODEL)
        if self.method == "ngram" and self.model is not None:
            raise ValueError(NGRAM_TAKES_NO_MODEL)
        return self


class EngineSpec(_Spec):
    """Engine options; each becomes the `tokenmill serve` flag of the same (vLLM) name."""

    model_config = _validations(
        _cel("!has(self.maxNumSeqs) || !has(self.maxNumBatchedTokens) || "
             "self.maxNumBatchedTokens >= self.maxNumSeqs",
             "maxNumBatchedTokens must be at least maxNumSeqs (every running sequence needs "
             "one token per step)"),
    )

    tensor_parallel_size: one_of(  # type: ignore[valid-type]
        TENSOR_PARALLEL_SIZES,
        f"engine.tensorParallelSize must be {_listed(TENSOR_PARALLEL_SIZES)}") = Field(
        1, description="GPUs of one node that one replica shards the model over; must divide "
                       "the model's attention heads and intermediate size, and its KV heads "
                       "or be a multiple of them.")
    quantization: _supported("quantization") = Field(  # type: ignore[valid-type]
        "auto", description="Weight quantization: auto (the checkpoint's own where the engine "
                            "runs it: a GGUF file's 4- and 8-bit tensors on CPU pods; else "
                            "none), none, int8, fp8, or gguf (CPU pods, one rank).")
    kv_cache_dtype: _supported("kv_cache_dtype") = Field(  # type: ignore[valid-type]
        "auto", description="KV-cache dtype; auto is the model's dtype."
    )
    prefix_caching: bool = Field(True, description="Reuse the KV cache of shared prompt prefixes.")
    max_model_len: int | None = Field(None, ge=1, description="Longest sequence in tokens.")
    max_num_seqs: int | None = Field(None, ge=1, description="Most sequences in one batch.")
    max_num_batched_tokens: int | None = Field(
        None, ge=1, description="Token budget of one engine step."
    )
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="Fraction of GPU memory the engine may use."
    )
    kv_offloading_size: float = Field(
        0, ge=0, description="GiB of host memory for a second KV-cache tier under the prefix "
                             "cache (0: off); added to the pod's memory request (and limit).")
    speculative: SpeculativeSpec | None = Field(None, description=SpeculativeSpec.__doc__)
    max_loras: StrictInt | None = Field(
        None, ge=1, le=MAX_LORAS,
        description="Adapters in one batch (device slots for their weights); default: the "
                    "number of spec.adapters.")
    max_lora_rank: StrictInt | None = Field(
        None, ge=1, le=MAX_LORA_RANK,
        description="Largest adapter rank served (the engine sizes its slots by it); default "
                    "the engine's, 16. An adapter of a higher rank fails to load.")
    max_cpu_loras: StrictInt | None = Field(
        None, ge=1, le=MAX_LORAS,
        description="Adapters kept in host memory, at least maxLoras; default: maxLoras.")
    extra_args: list[Annotated[str, Field(max_length=MAX_URI_LENGTH)]] = Field(
        default_factory=list, max_length=MAX_LIST_ITEMS,
        description="More `tokenmill serve` flags, e.g. [\"--block-size\", \"32\"]; only engine "
                    "options are accepted, and their values are checked as the engine would.",
    )


AUTOSCALING = "spec.autoscaling"
AUTOSCALING_MODES = ("builtin", "external", "keda")
SCALE_TO_ZERO_MODES = ("external", "keda")  # whoever scales sees demand before a pod does
MIN_REPLICAS_MESSAGE = (
    f"{AUTOSCALING}.minReplicas must be at least 1 in mode builtin (a replica's queue is what it "
    "scales on); scale to zero needs mode keda or external")
KEDA_NEEDS_SETTINGS = (f"{AUTOSCALING}.keda is required with mode keda: KEDA's Prometheus "
                       "server (serverAddress)")
# The HPA KEDA makes takes the delay as its scale-down stabilization window, which Kubernetes
# caps at an hour (a larger one: KEDA's ScaledObject is accepted, its HPA never is).
MAX_HPA_WINDOW_SECONDS = 3600
KEDA_DELAY_MESSAGE = (f"{AUTOSCALING}.scaleDownDelaySeconds must be at most "
                      f"{MAX_HPA_WINDOW_SECONDS} in mode keda: it is the HPA's scale-down "
                      "stabilization window, which Kubernetes caps at one hour")
KEDA_SETTINGS_ONLY = (f"{AUTOSCALING}.keda applies only to mode keda; mode builtin and external "
                      "leave spec.replicas to the built-in autoscaler or to yours, and a "
                      "ScaledObject beside either would fight it over spec.replicas")
# A URL KEDA's Prometheus scaler can query: http(s)://host[:port][/path], no whitespace.
SERVER_ADDRESS_PATTERN = r"^https?://[^\s/]+(/\S*)?$"


class KedaSpec(_Spec):
    """How KEDA reads the engines' queue depth (mode keda): the Prometheus server that scrapes
    the engine pods, and how often KEDA asks it."""

    server_address: str = Field(
        pattern=SERVER_ADDRESS_PATTERN, max_length=MAX_URI_LENGTH,
        description="The Prometheus server KEDA queries, e.g. "
                    "http://prometheus-operated.monitoring.svc:9090; it must scrape the engine "
                    "pods (they carry prometheus.io/* annotations).")
    query: str | None = Field(
        None, min_length=1, max_length=MAX_URI_LENGTH,
        description="The PromQL query of the demand KEDA divides by targetQueueDepth; default: "
                    "the waiting requests of this service's engines (by namespace and "
                    "model_name), plus the endpoint picker's flow-control queue when "
                    "routing.inferencePool is on.")
    polling_interval_seconds: StrictInt = Field(
        15, ge=1, le=3600, description="How often KEDA runs the query (pollingInterval).")


class AutoscalingSpec(_Spec):
    """Replica bounds and the queue-depth target. Mode builtin: the operator scales on the
    engines' queues. Mode keda: the operator writes a KEDA ScaledObject that scales the
    InferenceService through its scale subresource. Mode external: another autoscaler owns
    spec.replicas and the operator never changes it. Exactly one of them scales."""

    model_config = _validations(
        _cel("!has(self.minReplicas) || !has(self.maxReplicas) || "
             "self.minReplicas <= self.maxReplicas",
             "autoscaling.minReplicas must not be greater than autoscaling.maxReplicas"),
        _cel(f"(has(self.mode) && self.mode in {list(SCALE_TO_ZERO_MODES)}) || "
             "!has(self.minReplicas) || self.minReplicas >= 1", MIN_REPLICAS_MESSAGE),
        _cel("!has(self.mode) || self.mode != 'keda' || has(self.keda)", KEDA_NEEDS_SETTINGS),
        _cel("!has(self.keda) || (has(self.mode) && self.mode == 'keda')", KEDA_SETTINGS_ONLY),
        _cel("!has(self.mode) || self.mode != 'keda' || !has(self.scaleDownDelaySeconds) || "
             f"self.scaleDownDelaySeconds <= {MAX_HPA_WINDOW_SECONDS}", KEDA_DELAY_MESSAGE),
    )

    mode: one_of(  # type: ignore[valid-type]
        AUTOSCALING_MODES, f"autoscaling.mode must be {_listed(AUTOSCALING_MODES)}") = Field(
        "builtin", description="Who scales replicas: builtin, the operator on the engines' "
                               "queues; keda, a KEDA ScaledObject the operator writes; external, "
                               "your KEDA or HPA through the scale subresource.")
    min_replicas: int = Field(1, ge=0, description="Fewest replicas; 0 only in mode keda or "
                                                   "external.")
    max_replicas: int = Field(4, ge=1, description="Most replicas.")
    target_queue_depth: int = Field(
        4, ge=1, description="Waiting requests per replica (beyond a full running batch) the "
                             "built-in autoscaler aims for; in mode keda, KEDA's threshold.",
    )
    scale_down_delay_seconds: int = Field(
        300, ge=0, description="How long the load must call for fewer replicas before they are "
                               "removed (mode keda: the HPA's scale-down stabilization window "
                               "and KEDA's cooldownPeriod).",
    )
    keda: KedaSpec | None = Field(None, description=KedaSpec.__doc__)

    @model_validator(mode="after")
    def _one_scaler(self) -> AutoscalingSpec:
        if self.mode == "keda" and self.keda is None:
            raise ValueError(KEDA_NEEDS_SETTINGS)
        if self.mode != "keda" and self.keda is not None:
            raise ValueError(KEDA_SETTINGS_ONLY)
        if self.mode == "keda" and self.scale_down_delay_seconds > MAX_HPA_WINDOW_SECONDS:
            raise ValueError(KEDA_DELAY_MESSAGE)
        return self


ROUTING = "spec.routing.inferencePool"
# The endpoint picker of the Gateway API inference extension's v1.0.0 release (the one that
# made InferencePool inference.networking.k8s.io/v1).
DEFAULT_EPP_IMAGE = "registry.k8s.io/gateway-api-inference-extension/epp:v1.0.0"
MAX_EPP_REPLICAS = 8
GATEWAY_NAME_PATTERN = DNS_SUBDOMAIN_PATTERN
NAMESPACE_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
# Gateway API's Duration (GEP-2257): 1 to 4 parts of up to 5 digits and a unit.
GATEWAY_DURATION_PATTERN = r"^([0-9]{1,5}(h|m|s|ms)){1,4}$"


class EndpointPickerSpec(_Spec):
    """The endpoint picker (EPP) the InferencePool points at: it picks the engine pod of each
    request by prefix-cache affinity, queue depth and KV-cache use, read from the engines'
    /metrics under vLLM's names."""

    image: str = Field(DEFAULT_EPP_IMAGE, pattern=IMAGE_PATTERN, max_length=1024,
                       description="The endpoint picker's image.")
    replicas: StrictInt = Field(
        1, ge=1, le=MAX_EPP_REPLICAS,
        description="Endpoint picker replicas; each keeps its own prefix-cache index.")
    failure_mode: one_of(  # type: ignore[valid-type]
        ("FailClose", "FailOpen"),
        f"{ROUTING}.endpointPicker.failureMode must be FailClose or FailOpen") = Field(
        "FailClose", description="What the gateway does while the picker does not answer: "
                                 "FailClose refuses the request, FailOpen sends it to a pod of "
                                 "its own choosing.")
    flow_control: bool = Field(
        False, description="Turn on the picker's flow control (feature gate flowControl): it "
                           "holds requests while the pool is saturated or has no pod, which is "
                           "what lets mode keda scale from zero through the gateway.")


class GatewayRef(_Spec):
    """A Gateway (gateway.networking.k8s.io/v1) an HTTPRoute attaches the pool to."""

    name: str = Field(pattern=GATEWAY_NAME_PATTERN, min_length=1, max_length=253,
                      description="The Gateway's name.")
    namespace: str | None = Field(
        None, pattern=NAMESPACE_PATTERN, min_length=1, max_length=63,
        description="The Gateway's namespace; default: the InferenceService's. Another "
                    "namespace's Gateway must allow routes from this one (allowedRoutes).")
    match_model_name: bool = Field(
        False, description="Route only the requests whose model (the served name or an "
                           "adapter's) the inference extension's body-based router wrote into "
                           "the X-Gateway-Model-Name header, so several InferenceServices share "
                           "one Gateway; false routes every request (path /) to this pool.")
    request_timeout: str | None = Field(
        None, pattern=GATEWAY_DURATION_PATTERN, max_length=32,
        description="How long the gateway waits for a response (the route's timeouts.request, "
                    "a Gateway API duration such as 10m or 1h30m; 0s: no limit, where the "
                    "gateway supports it); default: the gateway's. With scale from zero keep "
                    "it above the model's load time, or requests held while the first pod "
                    "starts time out.")


class InferencePoolSpec(_Spec):
    """An InferencePool (inference.networking.k8s.io/v1) over the engine pods, its endpoint
    picker, and optionally an HTTPRoute from a Gateway to the pool."""

    enabled: bool = Field(True, description="false removes the pool, the picker and the route.")
    endpoint_picker: EndpointPickerSpec = Field(
        default_factory=EndpointPickerSpec, json_schema_extra={"default": {}},
        description=EndpointPickerSpec.__doc__)
    gateway: GatewayRef | None = Field(
        None, description="Route the Gateway's traffic to the pool (an HTTPRoute, path /); "
                          "without it, reference the pool from your own routes.")


EPP_SUFFIX = "-epp"  # the endpoint picker's objects: NAME-epp
MAX_ROUTED_NAME = 63 - len(EPP_SUFFIX)  # NAME-epp names a Service: a DNS label
ROUTED_NAME_MESSAGE = (f"metadata.name must be at most {MAX_ROUTED_NAME} characters with "
                       f"{ROUTING}: the endpoint picker's Service is NAME{EPP_SUFFIX}")


def routed_name_rule() -> dict[str, str]:
    """CEL at the object's root (the node that sees metadata.name): with an InferencePool the
    picker's Service is NAME-epp, which must still be a DNS label."""
    return _cel("!has(self.spec) || !has(self.spec.routing) || "
                "!has(self.spec.routing.inferencePool) || "
                "(has(self.spec.routing.inferencePool.enabled) && "
                "!self.spec.routing.inferencePool.enabled) || "
                f"size(self.metadata.name) <= {MAX_ROUTED_NAME}", ROUTED_NAME_MESSAGE)


class RoutingSpec(_Spec):
    """How traffic reaches the engines besides the ClusterIP Service."""

    inference_pool: InferencePoolSpec | None = Field(
        None, description=InferencePoolSpec.__doc__)


class ResourcesSpec(_Spec):
    """Compute resources of one replica."""

    gpus: int | None = Field(
        None, ge=0, description="GPUs per replica, at least tensorParallelSize; default: "
                                "tensorParallelSize. 0 runs on CPU."
    )
    gpu_resource_name: str = Field(
        "nvidia.com/gpu", pattern=RESOURCE_NAME_PATTERN, max_length=253,
        description="Extended resource of a GPU (domain-qualified, e.g. amd.com/gpu).")
    cpu: Quantity | None = Field(None, description="CPU request, e.g. 4 or 500m.")
    memory: Quantity | None = Field(None, description="Memory request and limit, e.g. 32Gi.")


class EnvVar(_Spec):
    """A container environment variable (Kubernetes EnvVar): a value or a valueFrom."""

    model_config = _validations(_cel(
        "!(has(self.value) && has(self.valueFrom))",
        "env: set value or valueFrom, not both"))

    name: str = Field(pattern=ENV_NAME_PATTERN, min_length=1, max_length=253,
                      description="The variable's name.")
    value: str | None = Field(None, description="The variable's value.")
    value_from: EnvVarSource | None = Field(
        None, description="Where the kubelet reads the value: a Secret or ConfigMap key, a "
                          "field of the pod, a resource of the container.")

    @model_validator(mode="after")
    def _value_or_value_from(self) -> EnvVar:
        if self.value is not None and self.value_from is not None:
            raise ValueError("set value or valueFrom, not both")
        return self


class SecretKeyRef(_Spec):
    """One key of a Secret in the InferenceService's namespace (a Kubernetes
    SecretKeySelector): the kubelet reads it, so neither the operator nor the spec sees the
    value."""

    name: str = Field(pattern=DNS_SUBDOMAIN_PATTERN, max_length=253,
                      description="The Secret's name.")
    key: str = Field(API_KEY_SECRET_KEY, pattern=SECRET_KEY_PATTERN, max_length=253,
                     description="The key within the Secret.")


class AuthSpec(_Spec):
    """Who may call the endpoint: with apiKeySecretRef every OpenAI route asks for
    `Authorization: Bearer KEY`; /health and /metrics stay open for probes and scrapers."""

    api_key_secret_ref: SecretKeyRef | None = Field(
        None, description=f"The Secret key holding the API key; the engine gets it as "
                          f"{API_KEY_ENV} through valueFrom.secretKeyRef.")


LabelValue = Annotated[str, Field(pattern=LABEL_VALUE_PATTERN, max_length=63)]
PodAnnotationValue = Annotated[str, Field(max_length=MAX_POD_ANNOTATION_VALUE)]


class InferenceServiceSpec(_Spec):
    """An OpenAI-compatible endpoint serving one model with tokenmill."""

    model_config = _validations(
        _cel("!has(self.resources) || !has(self.resources.gpus) || "
             "self.resources.gpus >= (has(self.engine) && has(self.engine.tensorParallelSize) "
             "? self.engine.tensorParallelSize : 1) || (self.resources.gpus == 0 && "
             "(!has(self.engine) || !has(self.engine.tensorParallelSize) || "
             "self.engine.tensorParallelSize == 1))",
             "resources.gpus must be at least engine.tensorParallelSize (or 0 to run on CPU "
             "with tensorParallelSize 1)"),
        *tp_rules(),
        _cel(f"!has(self.auth) || !has(self.auth.apiKeySecretRef) || !has(self.env) || "
             f"!self.env.exists(e, e.name == '{API_KEY_ENV}')",
             f"env: {API_KEY_ENV} is set by auth.apiKeySecretRef; set one of them"),
        _cel("!has(self.model) || (!has(self.model.cache) && !has(self.model.credentialsSecretRef))"
             f" || (has(self.model.uri) && {_remote('self.model.uri')}) || (has(self.adapters) "
             f"&& self.adapters.exists(a, {_remote('a.uri')}))", _REMOTE_ONLY),
        _cel("!has(self.engine) || (!has(self.engine.maxLoras) && !has(self.engine.maxLoraRank) "
             "&& !has(self.engine.maxCpuLoras)) || (has(self.adapters) && size(self.adapters) > 0)",
             LORA_OPTIONS_MESSAGE),
        _cel("!has(self.volumeMounts) || self.volumeMounts.all(m, has(self.volumes) && "
             "self.volumes.exists(v, v.name == m.name))", MOUNTED_VOLUME_MESSAGE),
        _cel("!has(self.engine) || !has(self.engine.maxCpuLoras) || self.engine.maxCpuLoras >= "
             "(has(self.engine.maxLoras) ? self.engine.maxLoras : (has(self.adapters) && "
             "size(self.adapters) > 0 ? size(self.adapters) : 1))", CPU_LORAS_MESSAGE),
    )

    model: ModelSpec = Field(default_factory=ModelSpec, json_schema_extra={"default": {}},
                             description=ModelSpec.__doc__)
    adapters: list[AdapterSpec] = Field(
        default_factory=list, max_length=MAX_ADAPTERS,
        description="LoRA adapters served over the model (the engine's --lora-modules); a "
                    "request selects one by its name in model. Names are unique.",
        json_schema_extra=_list_map("name"))
    engine: EngineSpec = Field(default_factory=EngineSpec, json_schema_extra={"default": {}},
                               description=EngineSpec.__doc__)
    replicas: int = Field(
        1, ge=0, description="Replicas; with autoscaling the autoscaler writes this field."
    )
    autoscaling: AutoscalingSpec | None = Field(
        None, description="Replica bounds and the queue-depth target; without it spec.replicas "
                          "is used as written.")
    routing: RoutingSpec | None = Field(None, description=RoutingSpec.__doc__)
    resources: ResourcesSpec = Field(
        default_factory=ResourcesSpec, json_schema_extra={"default": {}},
        description=ResourcesSpec.__doc__)
    image: str | None = Field(None, pattern=IMAGE_PATTERN, max_length=1024,
                              description="Engine image; default: the operator's.")
    image_pull_policy: one_of(  # type: ignore[valid-type]
        ("Always", "IfNotPresent", "Never"),
        "imagePullPolicy must be Always, IfNotPresent or Never") | None = Field(
        None, description="When the kubelet pulls the image; default: Kubernetes' (Always for "
                          ":latest, else IfNotPresent).")
    auth: AuthSpec | None = Field(None, description="Who may call the endpoint; default: "
                                                    "everyone who reaches the Service.")
    env: list[EnvVar] = Field(default_factory=list, max_length=MAX_LIST_ITEMS,
                              description="Environment variables of the engine container.")
    node_selector: dict[str, LabelValue] = Field(
        default_factory=dict, max_length=MAX_MAP_ENTRIES,
        description="Node labels an engine pod's node must carry.",
        json_schema_extra={"x-kubernetes-validations": [
            _keys_rule(QUALIFIED_NAME_PATTERN, "nodeSelector key")]})
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=MAX_LIST_ITEMS,
        description="Taints the engine pods tolerate (Kubernetes Toleration).")
    affinity: Affinity | None = Field(
        None, description="Where the engine pods may run (Kubernetes Affinity).")
    service_account_name: str | None = Field(
        None, pattern=DNS_SUBDOMAIN_PATTERN, max_length=253,
        description="ServiceAccount of the engine pods; it must exist in the namespace.")
    pod_annotations: dict[str, PodAnnotationValue] = Field(
        default_factory=dict, max_length=MAX_MAP_ENTRIES,
        description="Annotations of the engine pods, besides the operator's own.",
        json_schema_extra={"x-kubernetes-validations": [
            _keys_rule(QUALIFIED_NAME_PATTERN, "podAnnotations key")]})
    pod_labels: dict[str, LabelValue] = Field(
        default_factory=dict, max_length=MAX_MAP_ENTRIES,
        description="Labels of the engine pods, besides the operator's own (which they may not "
                    "set).",
        json_schema_extra={"x-kubernetes-validations": [
            _keys_rule(QUALIFIED_NAME_PATTERN, "podLabels key"),
            _cel(f"self.all(k, !(k in {_quoted(OWN_LABELS)}))", OWN_LABEL_MESSAGE)]})
    image_pull_secrets: list[SecretRef] = Field(
        default_factory=list, max_length=MAX_MAP_ENTRIES,
        description="Secrets (kubernetes.io/dockerconfigjson) in the namespace that the kubelet "
                    "pulls the engine's image with, and the endpoint picker's.",
        json_schema_extra=_list_map("name"))
    priority_class_name: str | None = Field(
        None, pattern=DNS_SUBDOMAIN_PATTERN, max_length=253,
        description="PriorityClass of the engine pods; it must exist in the cluster.")
    runtime_class_name: str | None = Field(
        None, pattern=DNS_SUBDOMAIN_PATTERN, max_length=253,
        description="RuntimeClass of the engine pods (e.g. nvidia, where the GPU container "
                    "runtime is not the nodes' default); it must exist in the cluster.")
    topology_spread_constraints: list[TopologySpreadConstraint] = Field(
        default_factory=list, max_length=MAX_LIST_ITEMS,
        description="How the engine pods spread over zones or nodes (Kubernetes "
                    "TopologySpreadConstraint); they carry the label "
                    "tokenmill.io/inferenceservice: NAME.")
    volumes: list[Volume] = Field(
        default_factory=list, max_length=MAX_VOLUMES,
        description="Volumes of the engine pods besides the operator's (Kubernetes Volume), "
                    "for spec.volumeMounts: a chat template from a ConfigMap, a CA bundle, a "
                    "larger /dev/shm.",
        json_schema_extra=_list_map("name"))
    volume_mounts: list[VolumeMount] = Field(
        default_factory=list, max_length=MAX_VOLUMES,
        description="Where the engine container mounts spec.volumes (Kubernetes VolumeMount); "
                    "one at /tmp or /dev/shm takes the place of the operator's.",
        json_schema_extra=_list_map("mountPath"))
    pod_security_context: PodSecurityContext | None = Field(
        None, description="Overrides fields of the engine pod's securityContext (the default "
                          "passes Pod Security Standards restricted).")
    container_security_context: SecurityContext | None = Field(
        None, description="Overrides fields of the engine container's securityContext.")
    startup_timeout_seconds: int = Field(
        1800, ge=60, le=86400,
        description="How long a replica may take to load its model before the kubelet restarts "
                    "it (the startup probe), after any download.")
    shutdown_timeout_seconds: int = Field(
        30, ge=0, le=3600,
        description="How long a replica drains in-flight requests after SIGTERM.",
    )

    @field_validator("node_selector", "pod_annotations", "pod_labels")
    @classmethod
    def _qualified_keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        bad = [k for k in value
               if len(k) > MAX_QUALIFIED_NAME or not re.match(QUALIFIED_NAME_PATTERN, k)]
        if bad:
            raise ValueError(f"{', '.join(bad)}: not a Kubernetes qualified name ([prefix/]name)")
        return value

    @model_validator(mode="after")
    def _remote_only(self) -> InferenceServiceSpec:
        if (self.model.cache or self.model.credentials_secret_ref) and not self.downloads:
            raise ValueError(_REMOTE_ONLY)
        return self

    @property
    def downloads(self) -> list[str]:
        """The URIs the init container fetches: the model's and the adapters' on hf:// or
        s3://, in the spec's order, each once."""
        uris = [self.model.uri] if self.model.remote else []
        uris += [a.uri for a in self.adapters if a.remote]
        return list(dict.fromkeys(uris))

    @property
    def max_loras(self) -> int:
        """engine.maxLoras, else one slot per adapter (at least one)."""
        return self.engine.max_loras or min(max(len(self.adapters), 1), MAX_LORAS)

    @property
    def inference_pool(self) -> InferencePoolSpec | None:
        """routing.inferencePool when it is on."""
        pool = self.routing.inference_pool if self.routing else None
        return pool if pool is not None and pool.enabled else None

    @property
    def keda(self) -> KedaSpec | None:
        """autoscaling.keda in mode keda."""
        scaling = self.autoscaling
        return scaling.keda if scaling is not None and scaling.mode == "keda" else None

    @property
    def gpus(self) -> int:
        """GPUs per replica: resources.gpus, else one per tensor-parallel rank."""
        gpus = self.resources.gpus
        return self.engine.tensor_parallel_size if gpus is None else gpus

    @property
    def desired_replicas(self) -> int:
        """spec.replicas, kept within the autoscaling bounds when the built-in autoscaler owns it.

        In modes keda and external the scale subresource's writer owns spec.replicas: it is used
        as is."""
        scaling = self.autoscaling
        if scaling is None or scaling.mode != "builtin":
            return self.replicas
        return min(max(self.replicas, scaling.min_replicas), scaling.max_replicas)


class Condition(_Spec):
    """A status condition, Kubernetes style."""

    type: Literal["Ready", "Available", "Progressing", "Degraded", "RoutingReady",
                  "AutoscalingReady"] = Field(
        description="Ready: serving with every replica; Available: at least one replica "
                    "serves; Progressing: a rollout moves; Degraded: a person must act; "
                    "RoutingReady: routing.inferencePool's objects are written (or which API "
                    "the cluster lacks); AutoscalingReady: mode keda's ScaledObject is written "
                    "(or KEDA is missing).")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(description="Why, in one CamelCase word.")
    message: str = Field("", description="Why, for a person.")
    last_transition_time: str | None = Field(
        None, json_schema_extra={"format": "date-time"},
        description="When the status last changed.")
    observed_generation: int | None = Field(
        None, description="The metadata.generation the condition was computed for.")


class AutoscalerStatus(_Spec):
    """The built-in autoscaler's last decision, the metrics behind it, and the state it resumes
    from after an operator restart."""

    desired_replicas: int | None = Field(None, description="Replicas the autoscaler set.")
    recommended_replicas: int | None = Field(
        None, description="What the load called for (before the scale-down delay).")
    reason: str | None = Field(None, description="Why, in one CamelCase word.")
    message: str | None = Field(None, description="Why, for a person.")
    last_scale_time: str | None = Field(None, json_schema_extra={"format": "date-time"},
                                        description="When the autoscaler last scaled.")
    scale_down_pending_since: str | None = Field(
        None, json_schema_extra={"format": "date-time"},
        description="Since when the load has called for fewer replicas.")
    scale_down_to: int | None = Field(
        None, description="The most replicas the load called for since then.")
    waiting_requests: float | None = Field(
        None, description="Requests waiting in the ready replicas' queues, in total.")
    running_requests: float | None = Field(
        None, description="Requests running in the ready replicas' batches, in total.")
    capacity_per_replica: float | None = Field(
        None, description="Requests one replica holds at the target: its largest running batch "
                          "plus targetQueueDepth.")
    ready_pods: int | None = Field(None, description="Ready engine pods.")
    scraped_pods: int | None = Field(None, description="Ready pods whose metrics were read.")


class AdapterStatus(_Spec):
    """Whether the engines serve one adapter of spec.adapters."""

    name: str = Field(description="The adapter's name.")
    state: Literal["Loaded", "Failed", "Pending"] = Field(
        description="Loaded: a ready engine pod reports it loaded; Failed: an engine stopped "
                    "at start-up on it; Pending: neither yet.")
    message: str = Field("", description="Why, for a person (the engine's reason when Failed).")


class InferenceServiceStatus(_Spec):
    """What the operator observed; written only by the operator."""

    observed_generation: int | None = Field(
        None, description="The metadata.generation this status describes.")
    replicas: int | None = Field(None, description="Engine pods (the scale subresource's).")
    ready_replicas: int | None = Field(None, description="Engine pods ready to serve.")
    url: str | None = Field(None, description="The OpenAI-compatible endpoint in the cluster.")
    selector: str | None = Field(None, description="Label selector of the pods (for HPA/KEDA).")
    conditions: list[Condition] = Field(
        default_factory=list, description="Ready, Available, Progressing and Degraded.")
    autoscaler: AutoscalerStatus | None = Field(
        None, description="The built-in autoscaler's last decision.")
    adapters: list[AdapterStatus] = Field(
        default_factory=list, description="One entry per adapter of spec.adapters.")


def api_key_ref(spec: InferenceServiceSpec) -> SecretKeyRef | None:
    """The Secret key of the endpoint's API key, if the spec asks for one."""
    return spec.auth.api_key_secret_ref if spec.auth else None


class SpecError(ValueError):
    """A spec the operator cannot deploy; the message says what to fix."""


def parse(spec: dict[str, Any]) -> InferenceServiceSpec:
    """The spec as a model, or SpecError naming every invalid field."""
    try:
        return InferenceServiceSpec.model_validate(spec or {})
    except ValidationError as e:
        problems = []
        for error in e.errors():
            where = "spec" + "".join(f"[{part}]" if isinstance(part, int) else f".{part}"
                                     for part in error["loc"])
            problems.append(f"{where}: {error['msg']}")
        raise SpecError("; ".join(problems)) from None


def _adapters_problem(spec: InferenceServiceSpec, served_name: str | None) -> str | None:
    """The CEL rules on spec.adapters that the schema alone cannot hold, naming the entry."""
    first: dict[str, int] = {}
    for i, adapter in enumerate(spec.adapters):
        where = f"{ADAPTERS}[{i}].name"
        if adapter.name == served_name:
            return f"{where}: {adapter.name!r} is the served model's name; {SERVED_NAME_MESSAGE}"
        if adapter.name in first:
            return (f"{where}: {adapter.name!r} is given twice (also "
                    f"{ADAPTERS}[{first[adapter.name]}].name)")
        first[adapter.name] = i
    engine = spec.engine
    if not spec.adapters and (engine.max_loras or engine.max_lora_rank or engine.max_cpu_loras):
        return f"spec.{LORA_OPTIONS_MESSAGE}"
    if engine.max_cpu_loras is not None and engine.max_cpu_loras < spec.max_loras:
        return (f"spec.engine.maxCpuLoras: {engine.max_cpu_loras} is less than maxLoras "
                f"{spec.max_loras}; spec.{CPU_LORAS_MESSAGE}")
    return None


def _pod_problem(spec: InferenceServiceSpec) -> str | None:
    """The CEL rules on spec.volumes, volumeMounts and podLabels, naming the entry, and the
    API server's own (a volume name or a mount path given twice) for emulators without it."""
    volumes: dict[Any, int] = {}
    for i, volume in enumerate(spec.volumes):
        name, where = volume.get("name"), f"spec.volumes[{i}].name"
        if name in OWN_VOLUMES or re.match(ADAPTER_VOLUME_PATTERN, str(name)):
            return f"{where}: {name!r} is the operator's; spec.{OWN_VOLUME_MESSAGE}"
        if name in volumes:
            return f"{where}: {name!r} is given twice (also spec.volumes[{volumes[name]}].name)"
        volumes[name] = i
    paths: dict[str, int] = {}
    for i, mount in enumerate(spec.volume_mounts):
        path, where = str(mount.get("mountPath", "")), f"spec.volumeMounts[{i}]"
        if any(path == own or path.startswith(own + "/") for own in OWN_MOUNTS):
            return f"{where}.mountPath: {path!r}: spec.{OWN_MOUNT_MESSAGE}"
        if path in paths:
            return (f"{where}.mountPath: {path!r} is given twice (also "
                    f"spec.volumeMounts[{paths[path]}].mountPath)")
        paths[path] = i
        if mount.get("name") not in volumes:
            return f"{where}.name: {mount.get('name')!r}: spec.{MOUNTED_VOLUME_MESSAGE}"
    if own := [key for key in spec.pod_labels if key in OWN_LABELS]:
        return f"spec.podLabels: {', '.join(own)}: spec.{OWN_LABEL_MESSAGE}"
    return None


def check(spec: InferenceServiceSpec, served_name: str | None = None) -> None:
    """SpecError for a spec the engine or the cluster would reject (the CEL rules and more);
    `served_name` is the model name clients send (the object's name unless the spec sets
    one)."""
    if problem := (_adapters_problem(spec, spec.model.served_name or served_name)
                   or _pod_problem(spec)):
        raise SpecError(problem)
    if spec.inference_pool and served_name and len(served_name) > MAX_ROUTED_NAME:
        raise SpecError(f"{ROUTED_NAME_MESSAGE} ({served_name!r} has {len(served_name)})")
    tp = spec.engine.tensor_parallel_size
    if spec.gpus < tp and not (spec.gpus == 0 and tp == 1):
        raise SpecError(f"spec.resources.gpus: {spec.gpus} GPUs cannot hold tensorParallelSize "
                        f"{tp}; use at least {tp} (or 0 to run on CPU with tensorParallelSize 1)")
    if problem := tp_problem(spec.model.uri, tp):
        raise SpecError(problem)
    if api_key_ref(spec) and any(e.name == API_KEY_ENV for e in spec.env):
        raise SpecError(f"spec.env: {API_KEY_ENV} is set by spec.auth.apiKeySecretRef; set one "
                        "of them")
    scaling = spec.autoscaling
    if scaling and scaling.min_replicas > scaling.max_replicas:
        raise SpecError(f"spec.autoscaling: minReplicas {scaling.min_replicas} is greater than "
                        f"maxReplicas {scaling.max_replicas}")
    if scaling and scaling.mode not in SCALE_TO_ZERO_MODES and scaling.min_replicas < 1:
        raise SpecError("spec.autoscaling.minReplicas: 0 needs mode keda or external; the "
                        "built-in autoscaler scales on the replicas' own queues")
