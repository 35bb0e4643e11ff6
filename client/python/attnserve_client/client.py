"""A small typed wrapper over the generated AttentionService stub.

Arrays cross the wire as `Tensor` messages (dtype, shape, raw little-endian bytes):
  numpy float32 <-> DTYPE_F32, numpy float16 <-> DTYPE_F16, and bfloat16, which numpy lacks, as
  uint16 arrays holding the raw bf16 bits (numpy_to_tensor(x, "bf16") also rounds float arrays to
  bf16, to nearest even as PyTorch does). Outputs come back in the dtype of the inputs; bf16
  outputs are widened to float32 (exact) unless the client was made with bf16_as="uint16".

Errors: every RPC failure is raised as AttnServeError carrying the gRPC status code name
("NOT_FOUND", "RESOURCE_EXHAUSTED", ...) and the server's message.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import queue
import secrets
import time
import uuid
from dataclasses import dataclass, field
from typing import (Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple,
                    Union)

import grpc
import grpc.aio
import numpy as np
from google.protobuf.descriptor import FieldDescriptor

from attnserve.v1 import attention_service_pb2 as pb
from attnserve.v1 import attention_service_pb2_grpc as pb_grpc

_MAX_MESSAGE_BYTES = 1 << 30
# forward(): requests up to this size always go unary (every server's limit is larger); above it,
# those that do not fit the server's max_message_bytes (less this headroom) go over ForwardStream.
_ALWAYS_UNARY_FORWARD_BYTES = 16 << 10
_STREAM_HEADROOM_BYTES = 1024

_DTYPES = {"f32": pb.DTYPE_F32, "float32": pb.DTYPE_F32, "f16": pb.DTYPE_F16,
           "float16": pb.DTYPE_F16, "bf16": pb.DTYPE_BF16, "bfloat16": pb.DTYPE_BF16}
# 8-bit KV pages with per-page scales (docs/kv_quantization.md); CPU backend.
_KV_QUANTS = {"none": pb.KV_CACHE_QUANTIZATION_NONE, "fp8": pb.KV_CACHE_QUANTIZATION_FP8_E4M3,
              "fp8_e4m3": pb.KV_CACHE_QUANTIZATION_FP8_E4M3, "int8": pb.KV_CACHE_QUANTIZATION_INT8}


# ---- Tensors ------------------------------------------------------------------------------------

def _float_to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits (uint16), round to nearest even; NaN stays NaN (quiet)."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    bits = values.view(np.uint32)
    # In uint32, in place: only NaNs' bit patterns (overwritten below) can carry past 2^32.
    rounded = (bits >> 16) & 1
    rounded += bits
    rounded += 0x7FFF
    rounded >>= 16
    out = rounded.astype(np.uint16)
    nan = np.isnan(values)
    if nan.any():
        out[nan] = ((bits[nan] >> 16) | 0x40).astype(np.uint16)
    return out


def _bf16_bits_to_float(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def numpy_to_tensor(array: np.ndarray, dtype: Optional[str] = None) -> pb.Tensor:
    """A Tensor message holding `array`.

    dtype None keeps the array's type: float32 -> F32, float16 -> F16, uint16 -> BF16 (raw bits);
    float64 is sent as F32. "f32" / "f16" / "bf16" convert first (bf16: round to nearest even).
    """
    array = np.asarray(array)
    if dtype is None:
        if array.dtype == np.float64:
            array = array.astype(np.float32)
        wire = {np.dtype(np.float32): pb.DTYPE_F32, np.dtype(np.float16): pb.DTYPE_F16,
                np.dtype(np.uint16): pb.DTYPE_BF16}.get(array.dtype.newbyteorder("="))
        if wire is None:
            raise TypeError(f"cannot send a {array.dtype} array: use float32, float16, or uint16 "
                            "bf16 bits")
        data = array.astype(array.dtype.newbyteorder("<"), copy=False)
    else:
        wire = _DTYPES.get(dtype.lower())
        if wire is None:
            raise ValueError(f"dtype '{dtype}': expected f32, f16 or bf16")
        if wire == pb.DTYPE_F32:
            data = array.astype("<f4", copy=False)
        elif wire == pb.DTYPE_F16:
            data = array.astype("<f2", copy=False)
        elif array.dtype == np.uint16:
            data = array.astype("<u2", copy=False)
        else:
            data = _float_to_bf16_bits(array.astype(np.float32)).astype("<u2", copy=False)
    return pb.Tensor(dtype=wire, shape=list(data.shape), data=np.ascontiguousarray(data).tobytes())


def tensor_to_numpy(tensor: pb.Tensor, bf16_as: str = "float32") -> np.ndarray:
    """The array a Tensor message holds; BF16 as float32 (exact) or, bf16_as="uint16", raw bits."""
    shape = tuple(int(d) for d in tensor.shape)
    if tensor.dtype == pb.DTYPE_F32:
        return np.frombuffer(tensor.data, dtype="<f4").astype(np.float32).reshape(shape)
    if tensor.dtype == pb.DTYPE_F16:
        return np.frombuffer(tensor.data, dtype="<f2").astype(np.float16).reshape(shape)
    if tensor.dtype == pb.DTYPE_BF16:
        bits = np.frombuffer(tensor.data, dtype="<u2").astype(np.uint16).reshape(shape)
        return bits if bf16_as == "uint16" else _bf16_bits_to_float(bits)
    raise ValueError(f"tensor has dtype {tensor.dtype}, not F32, F16 or BF16")


# ---- Specs and results --------------------------------------------------------------------------

def _spec_enum(enum: Any) -> Dict[str, int]:
    """A spec enum's names, as the server reads them (proto/codec/spec_codec.h, SpecEnumPrefix):
    each value's name in lower case without the prefix its zero value names (QK_NORM_NONE:
    "QK_NORM_", so QK_NORM_RMS_UNIT_OFFSET is "rms_unit_offset"); an UNSPECIFIED zero is left out."""
    zero = enum.values_by_number[0].name
    prefix = zero[:zero.rfind("_") + 1]
    return {v.name[len(prefix):].lower(): v.number for v in enum.values
            if v.name != prefix + "UNSPECIFIED"}


# The proto LayerSpec's scalar fields (the nested mla and rope_scaling have their own classes) and
# the names of its enum fields.
_SPEC_FIELDS = [f for f in pb.LayerSpec.DESCRIPTOR.fields if f.message_type is None]
_SPEC_ENUMS = {f.name: _spec_enum(f.enum_type) for f in _SPEC_FIELDS if f.enum_type is not None}
_VARIANTS = _SPEC_ENUMS["variant"]
_ROPE_SCALINGS = _spec_enum(pb.RopeScaling.DESCRIPTOR.fields_by_name["type"].enum_type)


def _name_of(table: Mapping[str, int], value: int) -> str:
    return next(name for name, v in table.items() if v == value)


def _enum(table: Mapping[str, int], what: str, name: str) -> int:
    if name.lower() not in table:
        raise ValueError(f"{what} '{name}': expected {', '.join(table)}")
    return table[name.lower()]


@dataclass
class MlaDims:
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int = 0
    rms_norm_eps: float = 1e-6


@dataclass
class RopeScaling:
    """config.json "rope_scaling" (proto RopeScaling); each type reads only its own fields."""

    type: str = "none"  # "none" | "linear" | "dynamic" (refused) | "llama3" | "yarn"
    factor: float = 1.0
    original_max_position_embeddings: int = 0  # llama3, yarn: required
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    mscale: float = 0.0  # yarn; 0 = absent
    mscale_all_dim: float = 0.0  # yarn; 0 = absent
    truncate: bool = True  # yarn (gpt-oss: False)

    _KEYS = {"none": (), "linear": ("factor",), "dynamic": ("factor",),
             "llama3": ("factor", "original_max_position_embeddings", "low_freq_factor",
                        "high_freq_factor"),
             "yarn": ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
                      "mscale", "mscale_all_dim", "truncate")}

    def to_dict(self) -> Dict[str, Any]:
        """The JSON spec-file form: the type's own keys only."""
        return {"type": self.type,
                **{key: getattr(self, key) for key in self._KEYS.get(self.type.lower(), ())}}

    def to_proto(self) -> pb.RopeScaling:
        fields = dataclasses.asdict(self)
        fields["type"] = _enum(_ROPE_SCALINGS, "rope_scaling.type", self.type)
        return pb.RopeScaling(**fields)

    @classmethod
    def from_proto(cls, scaling: pb.RopeScaling) -> "RopeScaling":
        out = cls(type=_name_of(_ROPE_SCALINGS, scaling.type))
        for f in dataclasses.fields(cls):
            value = getattr(scaling, f.name)
            if f.name != "type" and value:  # 0 = absent: keep the default
                setattr(out, f.name, value)
        out.truncate = not scaling.HasField("truncate") or scaling.truncate
        return out


def _with_new_proto_fields(cls: Any) -> Any:
    """Adds each scalar field of the proto LayerSpec that `cls` does not declare, as a keyword
    argument defaulting to the proto's zero (an enum: its zero value's name), which the server reads
    as the field's default: a new spec field needs no change here."""
    declared = {f.name for f in dataclasses.fields(cls)}
    kinds = {FieldDescriptor.CPPTYPE_BOOL: (bool, False), FieldDescriptor.CPPTYPE_FLOAT: (float, 0.0),
             FieldDescriptor.CPPTYPE_DOUBLE: (float, 0.0)}
    added = []
    for f in _SPEC_FIELDS:
        if f.name in declared:
            continue
        if f.enum_type is not None:
            kind, default = str, _name_of(_SPEC_ENUMS[f.name], 0)
        else:
            kind, default = kinds.get(f.cpp_type, (int, 0))
        added.append((f.name, kind, field(default=default)))
    if not added:
        return cls
    return dataclasses.make_dataclass(cls.__name__, added, bases=(cls,),
                                      namespace={"__module__": cls.__module__,
                                                 "__qualname__": cls.__qualname__,
                                                 "__doc__": cls.__doc__})


@_with_new_proto_fields
@dataclass
class LayerSpec:
    """One attention layer: the fields of the proto LayerSpec, with the keys and defaults of the
    JSON spec files and attnctl's spec flags (docs/api.md, "Layer spec JSON files"), so
    LayerSpec.from_dict(json.load(f)) reads a spec file. Defaults: num_kv_heads = num_heads (mha)
    or 1 (mqa), head_dim = d_model // num_heads, RoPE "half" with theta 10000, causal. A proto
    field not declared here is a keyword argument too (_with_new_proto_fields)."""

    variant: str  # "mha" | "mqa" | "gqa" | "mla"
    d_model: int
    num_heads: int
    num_kv_heads: int = 0  # 0: num_heads for mha, 1 for mqa; required for gqa; unused by mla
    head_dim: int = 0  # 0: d_model // num_heads (not for mla)
    qkv_bias: bool = False
    o_bias: bool = False
    rope: str = "half"  # "none" | "half" (Llama) | "interleaved" (DeepSeek-V3, GPT-J)
    rope_theta: float = 10000.0
    rope_scaling: Optional[RopeScaling] = None  # None: no scaling
    causal: bool = True
    sliding_window: int = 0  # tokens; 0 = full attention
    softmax_scale: float = 0.0  # 0 = 1 / sqrt(qk head dim)
    mla: Optional[MlaDims] = None  # required for mla
    # Model-family variations (mha/mqa/gqa only):
    rotary_dim: int = 0  # 0 = RoPE on the whole head; else the leading rotary_dim dims
    # "none" | per head "rms" (Qwen3) | "rms_unit_offset" (Gemma 3) | over all heads
    # "rms_across_heads" (OLMo 2)
    qk_norm: str = "none"
    qk_norm_eps: float = 1e-6
    attn_logit_softcapping: float = 0.0  # 0 = none (Gemma 2: 50)
    attention_sinks: bool = False  # gpt-oss learned per-head sinks
    alibi: str = "none"  # "none" | "bloom" | "mpt": ALiBi slopes (usually with rope="none")
    alibi_bias_max: float = 8.0  # "mpt"'s slope range

    @classmethod
    def from_dict(cls, spec: Mapping[str, Any]) -> "LayerSpec":
        fields = dict(spec)
        if isinstance(fields.get("mla"), Mapping):
            fields["mla"] = MlaDims(**fields["mla"])
        if isinstance(fields.get("rope_scaling"), Mapping):
            fields["rope_scaling"] = RopeScaling(**fields["rope_scaling"])
        return cls(**fields)

    def to_dict(self) -> Dict[str, Any]:
        """The JSON spec-file form, defaults resolved (LayerSpec.from_dict reads it back)."""
        resolved = LayerSpec.from_proto(self.to_proto())
        out = {k: v for k, v in dataclasses.asdict(resolved).items() if v is not None}
        if resolved.rope_scaling is not None:
            out["rope_scaling"] = resolved.rope_scaling.to_dict()
        return out

    def to_proto(self) -> pb.LayerSpec:
        variant = self.variant.lower()
        if variant not in _VARIANTS:
            raise ValueError(f"variant '{self.variant}': expected mha, mqa, gqa or mla")
        fields = {}
        for f in _SPEC_FIELDS:
            value = getattr(self, f.name)
            if f.enum_type is not None:
                value = _enum(_SPEC_ENUMS[f.name], f.name, value)
            fields[f.name] = value
        num_kv_heads = self.num_kv_heads
        if num_kv_heads == 0 and variant == "mha":
            num_kv_heads = self.num_heads
        if num_kv_heads == 0 and variant == "mqa":
            num_kv_heads = 1
        head_dim = self.head_dim
        if head_dim == 0 and variant != "mla" and self.num_heads > 0:
            head_dim = self.d_model // self.num_heads
        fields.update(num_kv_heads=num_kv_heads if variant != "mla" else 0,
                      head_dim=head_dim if variant != "mla" else 0)
        if self.alibi.lower() == "none":  # the server reads the slope range only with ALiBi
            fields["alibi_bias_max"] = 0.0
        out = pb.LayerSpec(**fields)
        if self.mla is not None:
            out.mla.CopyFrom(pb.MlaDims(**dataclasses.asdict(self.mla)))
        if self.rope_scaling is not None:
            out.rope_scaling.CopyFrom(self.rope_scaling.to_proto())
        return out

    @classmethod
    def from_proto(cls, spec: pb.LayerSpec) -> "LayerSpec":
        """The spec a server answered (ConfigureResponse.spec, SessionInfo.spec)."""
        defaults = {f.name: f.default for f in dataclasses.fields(cls)}
        fields: Dict[str, Any] = {}
        for f in _SPEC_FIELDS:
            value = getattr(spec, f.name)
            if f.enum_type is not None:
                value = _name_of(_SPEC_ENUMS[f.name], value)
            elif f.cpp_type != FieldDescriptor.CPPTYPE_BOOL and not value and \
                    defaults.get(f.name, dataclasses.MISSING) is not dataclasses.MISSING:
                value = defaults[f.name]  # 0 on the wire: the default (rope_theta 10000)
            fields[f.name] = value
        if spec.variant == pb.VARIANT_MLA:
            fields["mla"] = MlaDims(spec.mla.kv_lora_rank, spec.mla.qk_nope_head_dim,
                                    spec.mla.qk_rope_head_dim, spec.mla.v_head_dim,
                                    spec.mla.q_lora_rank, spec.mla.rms_norm_eps or 1e-6)
        if spec.HasField("rope_scaling") and spec.rope_scaling.type != pb.ROPE_SCALING_NONE:
            fields["rope_scaling"] = RopeScaling.from_proto(spec.rope_scaling)
        return cls(**fields)


@dataclass
class Timing:
    """Server-side time of one call (nanoseconds)."""

    queue_ns: int
    compute_ns: int
    total_ns: int

    @classmethod
    def from_proto(cls, timing: pb.Timing) -> "Timing":
        return cls(timing.queue_ns, timing.compute_ns, timing.total_ns)

    @property
    def compute_ms(self) -> float:
        return self.compute_ns / 1e6

    @property
    def total_ms(self) -> float:
        return self.total_ns / 1e6

    @property
    def queue_ms(self) -> float:
        return self.queue_ns / 1e6


@dataclass
class ConfigureResult:
    session_id: str
    parameter_count: int
    parameter_bytes: int
    kv_bytes_per_token: int
    page_bytes: int
    max_context_tokens: int
    timing: Timing
    replica: str = ""  # the server replica holding the session (its --replica_id)
    fingerprint: bytes = b""  # SHA-256 of spec, KV format, page size and weights (ImportRequest)
    spec: Optional[LayerSpec] = None  # the layer configured, as the server resolved it
    stack: List[LayerSpec] = field(default_factory=list)  # a stack's layers, bottom first


def _scalars(cls, message):
    """A dataclass of scalar fields from the same-named fields of a message."""
    return cls(**{f.name: getattr(message, f.name) for f in dataclasses.fields(cls)})


@dataclass
class SessionCost:
    parameter_count: int
    parameter_bytes: int
    kv_bytes_per_token: int
    page_bytes: int
    max_context_tokens: int


@dataclass
class RequestInfo:
    request_id: str
    sequence_length: int
    kv_bytes: int
    idle_ns: int
    next_layer: int = 0  # model sessions: the layer its step in flight runs next (0: none)


@dataclass
class BatchingStats:
    decode_batches: int
    decode_steps: int
    max_decode_batch: int
    prefill_chunks: int
    batches_retried_alone: int


@dataclass
class LayerKindKv:
    kind: str  # "global", "sliding_window:<tokens>" or "mla"
    layers: int
    kv_bytes: int


@dataclass
class SessionInfo:
    """GetSession / ListSessions (proto SessionInfo; ListSessions leaves `requests` empty)."""

    session_id: str
    label: str
    spec: LayerSpec
    kv_cache_dtype: str  # "f32", "f16", "bf16" or "" (unspecified: 8-bit pages)
    kv_cache_quantization: str  # "none", "fp8_e4m3" or "int8"
    page_size: int
    cost: SessionCost
    kv_bytes_used: int
    requests: List[RequestInfo]
    idle_ns: int
    batching: BatchingStats
    fingerprint: bytes
    kv_by_layer_kind: List[LayerKindKv]
    num_layers: int
    per_layer: bool = False  # a model session: each call runs one layer

    @classmethod
    def from_proto(cls, info: pb.SessionInfo) -> "SessionInfo":
        return cls(
            session_id=info.session_id, label=info.label, spec=LayerSpec.from_proto(info.spec),
            kv_cache_dtype={pb.DTYPE_F32: "f32", pb.DTYPE_F16: "f16",
                            pb.DTYPE_BF16: "bf16"}.get(info.kv_cache_dtype, ""),
            kv_cache_quantization={pb.KV_CACHE_QUANTIZATION_FP8_E4M3: "fp8_e4m3",
                                   pb.KV_CACHE_QUANTIZATION_INT8: "int8"}.get(
                                       info.kv_cache_quantization, "none"),
            page_size=info.page_size, cost=_scalars(SessionCost, info.cost),
            kv_bytes_used=info.kv_bytes_used,
            requests=[_scalars(RequestInfo, r) for r in info.requests], idle_ns=info.idle_ns,
            batching=_scalars(BatchingStats, info.batching), fingerprint=info.fingerprint,
            kv_by_layer_kind=[_scalars(LayerKindKv, k) for k in info.kv_by_layer_kind],
            num_layers=info.num_layers, per_layer=info.per_layer)


@dataclass
class Limits:
    max_sessions: int
    max_requests_per_session: int
    max_sequence_length: int
    max_message_bytes: int
    request_ttl_ns: int
    session_ttl_ns: int
    max_parameter_bytes: int


@dataclass
class BackendCapabilities:
    """What the serving backend computes (GetServerInfo.capabilities, kernels/capabilities.h).
    Enums by the names the client takes: variants "mha".."mla", dtypes "f32"/"f16"/"bf16", RoPE
    scalings "none".."yarn"; KV formats "f32", "f16", "bf16", "fp8_e4m3", "int8"."""

    variants: List[str]
    head_dims: List[int]  # MHA/MQA/GQA head_dim values; empty = any valid one
    compute_dtypes: List[str]  # informational: what layers compute in
    kv_formats: List[str]
    rope_scalings: List[str]
    yarn_attention_factor: bool
    qk_norm: bool
    partial_rotary: bool
    logit_softcapping: bool
    attention_sinks: bool
    alibi: bool
    sliding_window: bool
    non_causal: bool
    fork: bool
    export_import: bool
    stacks: bool
    # The variations computed by name ("qk_norm=rms", ..., "qk_norm=rms_across_heads",
    # "partial_rotary", "alibi", ...); the flags above say the same for the older ones. Empty from
    # a server older than the list.
    variations: List[str]

    @classmethod
    def from_proto(cls, c: pb.BackendCapabilities) -> "BackendCapabilities":
        fields = {f.name: getattr(c, f.name) for f in dataclasses.fields(cls)}
        fields["variants"] = [_name_of(_VARIANTS, v) for v in c.variants]
        fields["head_dims"] = list(c.head_dims)
        fields["compute_dtypes"] = [_name_of(_DTYPES, d) for d in c.compute_dtypes]
        fields["kv_formats"] = list(c.kv_formats)
        fields["rope_scalings"] = [_name_of(_ROPE_SCALINGS, r) for r in c.rope_scalings]
        fields["variations"] = list(c.variations)
        return cls(**fields)


@dataclass
class ServerInfo:
    """GetServerInfo."""

    version: str
    backend: str  # "cpu" or "cuda"
    device: str
    kv_pool_capacity_bytes: int
    kv_pool_used_bytes: int
    sessions: int
    requests: int
    limits: Limits
    parameter_bytes_used: int
    replica: str
    capabilities: BackendCapabilities  # what `backend` serves

    @classmethod
    def from_proto(cls, info: pb.GetServerInfoResponse) -> "ServerInfo":
        fields = {f.name: getattr(info, f.name) for f in dataclasses.fields(cls)}
        fields["limits"] = _scalars(Limits, info.limits)
        fields["capabilities"] = BackendCapabilities.from_proto(info.capabilities)
        return cls(**fields)


# A decode stream step with explicit positions: ({request id: hidden row}, {request id: position}).
DecodeStep = Tuple[Mapping[str, np.ndarray], Mapping[str, int]]


@dataclass
class StepResult:
    """Outputs of a Forward or Decode call, by request id."""

    outputs: Dict[str, np.ndarray]
    sequence_lengths: Dict[str, int]
    timing: Timing
    client_ms: float = 0.0  # round trip as this client measured it (0 for stream steps)


class AttnServeError(Exception):
    """A failed RPC: `code` is the gRPC status code name, `message` the server's message."""

    def __init__(self, rpc: str, code: str, message: str):
        super().__init__(f"{rpc} failed: {code}: {message}")
        self.rpc = rpc
        self.code = code
        self.message = message


def _wrap(rpc: str, error: grpc.RpcError) -> AttnServeError:
    code = error.code() if hasattr(error, "code") else None
    details = error.details() if hasattr(error, "details") else str(error)
    return AttnServeError(rpc, code.name if code is not None else "UNKNOWN", details or "")


# ---- The client ---------------------------------------------------------------------------------

class _CallDetails(grpc.ClientCallDetails):
    def __init__(self, details, metadata):
        self.method = details.method
        self.timeout = details.timeout
        self.metadata = metadata
        self.credentials = details.credentials
        self.wait_for_ready = getattr(details, "wait_for_ready", None)
        self.compression = getattr(details, "compression", None)


class _BearerToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                   grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds `authorization: Bearer <token>` to every call. An interceptor rather than
    grpc.access_token_call_credentials, because gRPC refuses call credentials on a plaintext
    channel, and a token without TLS is fine on loopback."""

    def __init__(self, token: str):
        self._entry = ("authorization", f"Bearer {token}")

    def _details(self, details):
        return _CallDetails(details, list(details.metadata or []) + [self._entry])

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, requests):
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation, details, requests):
        return continuation(self._details(details), requests)


# The metadata a load balancer hashes to keep a session's calls on one replica (docs/deploy.md).
SESSION_METADATA_KEY = "x-attnserve-session"


def _session_metadata(session_id: str):
    return ((SESSION_METADATA_KEY, session_id),) if session_id else None


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


class AttnServeClient:
    """Blocking client over one channel. Use as a context manager, or call close().

    Security (each argument falls back to an environment variable when None):
      tls_ca (ATTNSERVE_TLS_CA): PEM file of the CA that signed the server's certificate; TLS when
        set, plaintext otherwise.
      tls_cert, tls_key (ATTNSERVE_TLS_CERT, ATTNSERVE_TLS_KEY): this client's certificate and
        key, for a server that requires mutual TLS (--tls_client_ca).
      token (ATTNSERVE_TOKEN): sent as `authorization: Bearer <token>` on every call, for a server
        with --auth_tokens.
    """

    def __init__(self, target: str = "127.0.0.1:50051", timeout_s: float = 60.0,
                 bf16_as: str = "float32", *, tls_ca: Optional[str] = None,
                 tls_cert: Optional[str] = None, tls_key: Optional[str] = None,
                 token: Optional[str] = None):
        self.target = target
        self.timeout_s = timeout_s
        self.bf16_as = bf16_as
        tls_ca = tls_ca if tls_ca is not None else os.environ.get("ATTNSERVE_TLS_CA", "")
        tls_cert = tls_cert if tls_cert is not None else os.environ.get("ATTNSERVE_TLS_CERT", "")
        tls_key = tls_key if tls_key is not None else os.environ.get("ATTNSERVE_TLS_KEY", "")
        token = token if token is not None else os.environ.get("ATTNSERVE_TOKEN", "")
        if bool(tls_cert) != bool(tls_key):
            raise ValueError("tls_cert and tls_key go together (mutual TLS)")
        if tls_cert and not tls_ca:
            raise ValueError("tls_cert/tls_key need tls_ca: a client certificate is only sent "
                             "over TLS")
        options = [
            ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
        ]
        credentials = None
        if tls_ca:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_read(tls_ca),
                private_key=_read(tls_key) if tls_key else None,
                certificate_chain=_read(tls_cert) if tls_cert else None)
            self._channel = grpc.secure_channel(target, credentials, options=options)
        else:
            self._channel = grpc.insecure_channel(target, options=options)
        # The service's calls carry the token; the health check (health()) needs none.
        self._server_max_message_bytes = 0  # Read once, when a Forward may not fit a message.
        # What a grpc.aio channel of a LoopDecodeStream needs to reach the same server.
        self._aio_channel_args = (target, credentials, options)
        # One event loop and one grpc.aio channel for every LoopDecodeStream of this client,
        # made on first use: a stream per generation then costs no loop, no connection and no
        # HTTP/2 handshake of its own.
        self._aio_loop = None
        self._aio_channel = None
        self._token_metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.stub = pb_grpc.AttentionServiceStub(
            grpc.intercept_channel(self._channel, _BearerToken(token)) if token else self._channel)

    def close(self) -> None:
        if self._aio_loop is not None:
            loop, self._aio_loop = self._aio_loop, None
            try:
                loop.run_until_complete(self._aio_channel.close())
            finally:
                loop.close()
        self._channel.close()

    def _aio(self):
        """The client's event loop and grpc.aio channel (see LoopDecodeStream), made once."""
        if self._aio_loop is None:
            loop = asyncio.new_event_loop()
            target, credentials, options = self._aio_channel_args

            async def open_channel():  # An aio channel binds to the loop it is made on.
                return (grpc.aio.secure_channel(target, credentials, options=options)
                        if credentials is not None else
                        grpc.aio.insecure_channel(target, options=options))
            try:
                self._aio_channel = loop.run_until_complete(open_channel())
            except BaseException:
                loop.close()
                raise
            self._aio_loop = loop
        return self._aio_loop, self._aio_channel

    def __enter__(self) -> "AttnServeClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, rpc: str, request, session_id: str = ""):
        # Every call names its session for a load balancer's affinity (docs/deploy.md).
        session_id = session_id or getattr(request, "session_id", "")
        try:
            return getattr(self.stub, rpc)(request, timeout=self.timeout_s,
                                           metadata=_session_metadata(session_id))
        except grpc.RpcError as error:
            raise _wrap(rpc, error) from None

    # Failures after which the server may or may not have applied a call.
    _RETRYABLE = ("DEADLINE_EXCEEDED", "UNAVAILABLE", "CANCELLED")

    def _call_idempotent(self, rpc: str, request, retries: int):
        """Calls `rpc`; with retries > 0, repeats it under the same call_id (one is drawn when the
        request has none) after a failure that leaves its fate unknown. The server answers a
        repeat of an applied call from that call's results, so tokens are appended once."""
        if retries > 0 and not request.call_id:
            request.call_id = uuid.uuid4().hex
        for attempt in range(retries + 1):
            try:
                return self._call(rpc, request)
            except AttnServeError as error:
                if attempt == retries or error.code not in self._RETRYABLE:
                    raise
        raise AssertionError("unreachable")

    # -- sessions --

    def configure(self, spec: Union[LayerSpec, Mapping[str, Any], None] = None, *,
                  seed: Optional[int] = None,
                  checkpoint: Optional[str] = None, layer: int = 0,
                  weights: Optional[Mapping[str, np.ndarray]] = None, kv_dtype: str = "f32",
                  page_size: int = 0, max_requests: int = 0, max_sequence_length: int = 0,
                  label: str = "", kv_quant: str = "none",
                  stack: Optional[Sequence[Union[LayerSpec, Mapping[str, Any]]]] = None,
                  num_layers: int = 0, per_layer: bool = False) -> ConfigureResult:
        """Creates a session. Weights: `seed`, or `checkpoint` (a safetensors file or directory on
        the server's side) with `layer`, or `weights` (Hugging Face names without the
        "model.layers.N.self_attn." prefix -> arrays). Default: seed 0. `kv_quant` "fp8" or
        "int8" stores KV in 8 bits with per-page scales (kv_dtype is then not sent).
        `spec` None: read from the checkpoint (its config.json, or the spec a safetensors file
        holds in its __metadata__, as attnctl convert writes); the result's `spec` is the layer
        the server configured. A hybrid stack (docs/hybrid_stacks.md):
        `stack`, its layer specs bottom first (with spec None), or `num_layers` layers from a
        checkpoint's config.json (with spec None); get_session reports its KV by layer kind.
        `per_layer=True` makes it a model session (docs/remote_model.md): each forward/decode
        names one layer (`layer=`), in order 0..n-1 per step; with a checkpoint and neither
        `stack` nor `num_layers`, every layer from `layer` on."""
        if spec is not None and not isinstance(spec, LayerSpec):
            spec = LayerSpec.from_dict(spec)
        stack_spec = None
        if stack is not None or num_layers or per_layer:
            if spec is not None:
                raise ValueError("give spec or stack=/num_layers=/per_layer=, not both")
            stack_spec = pb.StackSpec(num_layers=num_layers, per_layer=per_layer, layers=[
                (s if isinstance(s, LayerSpec) else LayerSpec.from_dict(s)).to_proto()
                for s in (stack or [])])
        if sum(x is not None for x in (seed, checkpoint, weights)) > 1:
            raise ValueError("give one of seed=, checkpoint=, weights=")
        source = pb.WeightSource()
        if checkpoint is not None:
            source.checkpoint.CopyFrom(pb.CheckpointWeights(path=checkpoint, layer_index=layer))
        elif weights is not None:
            source.inline_weights.CopyFrom(pb.InlineWeights(tensors=[
                pb.NamedTensor(name=name, tensor=numpy_to_tensor(array))
                for name, array in weights.items()]))
        else:
            source.seed = seed if seed is not None else 0
        if kv_dtype.lower() not in _DTYPES:
            raise ValueError(f"kv_dtype '{kv_dtype}': expected f32, f16 or bf16")
        if kv_quant.lower() not in _KV_QUANTS:
            raise ValueError(f"kv_quant '{kv_quant}': expected none, fp8 or int8")
        quant = _KV_QUANTS[kv_quant.lower()]
        # The server refuses a quantization together with a kv_cache_dtype.
        kv_cache_dtype = (_DTYPES[kv_dtype.lower()] if quant == pb.KV_CACHE_QUANTIZATION_NONE
                          else pb.DTYPE_UNSPECIFIED)
        # A fresh random id, which the server adopts: the balancer hashes it to the replica that
        # will hold the session, as it will every later call's.
        response = self._call("Configure", pb.ConfigureRequest(
            spec=spec.to_proto() if spec is not None else None, stack=stack_spec,
            weights=source, kv_cache_dtype=kv_cache_dtype,
            kv_cache_quantization=quant,
            page_size=page_size, max_requests=max_requests,
            max_sequence_length=max_sequence_length, label=label),
            session_id=secrets.token_hex(16))
        cost = response.cost
        return ConfigureResult(response.session_id, cost.parameter_count, cost.parameter_bytes,
                               cost.kv_bytes_per_token, cost.page_bytes, cost.max_context_tokens,
                               Timing.from_proto(response.timing), response.replica,
                               response.fingerprint,
                               LayerSpec.from_proto(response.spec)
                               if response.HasField("spec") else None,
                               [LayerSpec.from_proto(layer) for layer in response.stack])

    def release(self, session_id: str, request_id: str = "") -> int:
        """Frees a request's KV cache, or the whole session when request_id is empty; returns the
        bytes freed."""
        return self._call("Release", pb.ReleaseRequest(session_id=session_id,
                                                       request_id=request_id)).freed_bytes

    def fork(self, session_id: str, request_id: str,
             new_request_ids: Sequence[str]) -> Dict[str, int]:
        """New requests continuing from request_id's cached tokens (prefix sharing: full KV pages
        shared, the partial last page copied); returns each new id's sequence length."""
        response = self._call("Fork", pb.ForkRequest(session_id=session_id, request_id=request_id,
                                                     new_request_ids=list(new_request_ids)))
        return {r.request_id: r.sequence_length for r in response.results}

    # -- moving a request between replicas (docs/api.md, "Moving a request") --

    def export_request(self, session_id: str, request_id: str,
                       release_after_export: bool = False,
                       max_chunk_bytes: int = 0) -> Tuple[pb.ExportedRequest, bytes]:
        """A request's KV pages and positions: (header, page bytes). Import them with
        import_request into a session of the same fingerprint, on this replica or another."""
        request = pb.ExportRequestRequest(session_id=session_id, request_id=request_id,
                                          release_after_export=release_after_export,
                                          max_chunk_bytes=max_chunk_bytes)
        header, chunks = None, []
        try:
            for message in self.stub.ExportRequest(request, timeout=self.timeout_s,
                                                   metadata=_session_metadata(session_id)):
                if message.HasField("header"):
                    header = message.header
                else:
                    chunks.append(message.pages.data)
        except grpc.RpcError as error:
            raise _wrap("ExportRequest", error) from None
        return header, b"".join(chunks)

    def import_request(self, session_id: str, request_id: str, header: pb.ExportedRequest,
                       pages: bytes, chunk_bytes: int = 1 << 20) -> pb.ImportRequestResponse:
        """Creates `request_id` in `session_id` from export_request's (header, pages)."""
        def messages():
            yield pb.ImportRequestRequest(header=pb.ImportRequestHeader(
                session_id=session_id, request_id=request_id, request=header))
            for offset in range(0, len(pages), chunk_bytes):
                yield pb.ImportRequestRequest(
                    pages=pb.KvPageBytes(data=pages[offset:offset + chunk_bytes]))
        try:
            return self.stub.ImportRequest(messages(), timeout=self.timeout_s,
                                           metadata=_session_metadata(session_id))
        except grpc.RpcError as error:
            raise _wrap("ImportRequest", error) from None

    def get_session(self, session_id: str) -> SessionInfo:
        return SessionInfo.from_proto(
            self._call("GetSession", pb.GetSessionRequest(session_id=session_id)).session)

    def list_sessions(self) -> List[SessionInfo]:
        return [SessionInfo.from_proto(s)
                for s in self._call("ListSessions", pb.ListSessionsRequest()).sessions]

    def info(self) -> ServerInfo:
        """Server state and limits; `.capabilities` is what its backend serves, the table
        Configure checks (BackendCapabilities)."""
        return ServerInfo.from_proto(self._call("GetServerInfo", pb.GetServerInfoRequest()))

    # -- compute --

    def _results(self, response, client_ms: float) -> StepResult:
        return StepResult(
            outputs={r.request_id: tensor_to_numpy(r.output, self.bf16_as) for r in response.results},
            sequence_lengths={r.request_id: r.sequence_length for r in response.results},
            timing=Timing.from_proto(response.timing), client_ms=client_ms)

    def forward(self, session_id: str, inputs: Mapping[str, np.ndarray], *,
                positions: Optional[Mapping[str, Sequence[int]]] = None,
                dtype: Optional[str] = None, call_id: str = "",
                retries: int = 0, layer: int = 0) -> StepResult:
        """Prefill: `inputs` maps request ids to [num_tokens, d_model] hidden states (requests are
        created on first use, extended afterwards). Outputs have the inputs' shape and dtype.
        `call_id` (or `retries` > 0, which draws one) makes the call safe to repeat: see
        docs/api.md, "Retrying safely". `layer`: the layer of a model session this call runs."""
        positions = positions or {}
        request = pb.ForwardRequest(session_id=session_id, call_id=call_id, layer=layer, items=[
            pb.ForwardItem(request_id=rid, hidden=numpy_to_tensor(np.atleast_2d(x), dtype),
                           positions=list(positions.get(rid, ())))
            for rid, x in inputs.items()])
        size = request.ByteSize()
        if (size > _ALWAYS_UNARY_FORWARD_BYTES and
                size + _STREAM_HEADROOM_BYTES > self._max_message_bytes()):
            # Too large for one message: the same call over ForwardStream (docs/api.md).
            if call_id or retries:
                raise ValueError("call_id/retries: a Forward too large for one message goes "
                                 "through ForwardStream, which has no idempotency key")
            if layer:
                raise ValueError("layer: a model session's Forward must fit one message")
            return self.forward_stream(session_id, request)
        start = time.perf_counter()
        response = self._call_idempotent("Forward", request, retries)
        return self._results(response, (time.perf_counter() - start) * 1e3)

    def _max_message_bytes(self) -> int:
        if not self._server_max_message_bytes:
            info = self._call("GetServerInfo", pb.GetServerInfoRequest())
            self._server_max_message_bytes = info.limits.max_message_bytes or (4 << 20)
        return self._server_max_message_bytes

    def forward_stream(self, session_id: str, request: pb.ForwardRequest,
                       max_message_bytes: int = 0) -> StepResult:
        """A ForwardRequest (new requests only, no call_id) sent over ForwardStream: the header,
        then the rows in messages under `max_message_bytes` (0 = the server's limit); the output
        rows come back as the server computes them. forward() calls it when a request does not
        fit one message. All or nothing: an error leaves the session as it was."""
        limit = max_message_bytes or self._max_message_bytes()
        first = request.items[0].hidden
        d_model = first.shape[1]
        row_bytes = len(first.data) // max(first.shape[0], 1)
        header = pb.ForwardStreamHeader(session_id=session_id, dtype=first.dtype, d_model=d_model)
        for item in request.items:
            header.items.add(request_id=item.request_id, num_tokens=item.hidden.shape[0],
                             positions=list(item.positions))
        # A quarter of the limit per message: the server's in-flight quota (4 x the limit by
        # default) covers every message gRPC has started receiving.
        per_message = max(1, (limit // 4 - _STREAM_HEADROOM_BYTES) // row_bytes) * row_bytes

        def messages():
            yield pb.ForwardStreamRequest(header=header)
            rows = b"".join(item.hidden.data for item in request.items)
            for at in range(0, len(rows), per_message):
                yield pb.ForwardStreamRequest(rows=pb.HiddenRows(data=rows[at:at + per_message]))

        start = time.perf_counter()
        chunks: List[bytes] = []
        summary = None
        try:
            for answer in self.stub.ForwardStream(messages(), timeout=self.timeout_s,
                                                  metadata=_session_metadata(session_id)):
                if answer.HasField("rows"):
                    chunks.append(answer.rows.data)
                else:
                    summary = answer.summary
        except grpc.RpcError as error:
            raise _wrap("ForwardStream", error) from None
        if summary is None:
            raise AttnServeError("ForwardStream", "INTERNAL", "the stream ended OK without its summary")
        outputs = b"".join(chunks)
        response = pb.ForwardResponse(timing=summary.timing)
        at = 0
        for done in summary.results:
            n = done.num_tokens * row_bytes
            response.results.add(request_id=done.request_id, sequence_length=done.sequence_length,
                                 output=pb.Tensor(dtype=first.dtype, shape=[done.num_tokens, d_model],
                                                  data=outputs[at:at + n]))
            at += n
        return self._results(response, (time.perf_counter() - start) * 1e3)

    def _decode_request(self, session_id: str, inputs: Mapping[str, np.ndarray],
                        dtype: Optional[str],
                        positions: Optional[Mapping[str, int]] = None,
                        layer: int = 0) -> pb.DecodeRequest:
        positions = positions or {}
        unknown = set(positions) - set(inputs)
        if unknown:
            raise ValueError(f"positions for requests without an input: {sorted(unknown)}")
        items = []
        for rid, x in inputs.items():
            x = np.asarray(x)
            item = pb.DecodeItem(request_id=rid,
                                 hidden=numpy_to_tensor(x.reshape(1, x.shape[-1]), dtype))
            if rid in positions:
                item.position = int(positions[rid])
            items.append(item)
        return pb.DecodeRequest(session_id=session_id, items=items, layer=layer)

    def decode(self, session_id: str, inputs: Mapping[str, np.ndarray], *,
               positions: Optional[Mapping[str, int]] = None,
               dtype: Optional[str] = None, call_id: str = "",
               retries: int = 0, layer: int = 0) -> StepResult:
        """One decode step: `inputs` maps request ids to one hidden row ([d_model] or
        [1, d_model]); each output is [1, d_model]. `positions` maps request ids to the step's
        RoPE position (after the request's last one; default: its sequence length), e.g. to
        continue a request prefilled at positions 5000+. `call_id` / `retries` / `layer` as for
        forward()."""
        request = self._decode_request(session_id, inputs, dtype, positions, layer)
        request.call_id = call_id
        start = time.perf_counter()
        response = self._call_idempotent("Decode", request, retries)
        return self._results(response, (time.perf_counter() - start) * 1e3)

    def decode_stream(self, session_id: str, steps: Iterable[Union[Mapping[str, np.ndarray],
                                                                   DecodeStep]], *,
                      dtype: Optional[str] = None) -> Iterator[StepResult]:
        """Decode steps over one DecodeStream: yields one StepResult per element of `steps`, in
        order. A step is {request id: hidden row}, or a (inputs, positions) pair whose positions
        map request ids to the step's RoPE position (as decode()). `steps` may be a generator that
        computes each step from the previous result. In a model session a step is an
        (inputs, positions, layer) triple: one message per layer, layers 0..n-1 in order."""
        def request(step):
            parts = step if isinstance(step, tuple) else (step,)
            inputs = parts[0]
            positions = parts[1] if len(parts) > 1 else None
            layer = parts[2] if len(parts) > 2 else 0
            return self._decode_request(session_id, inputs, dtype, positions, layer)
        requests = (request(step) for step in steps)
        try:
            for response in self.stub.DecodeStream(requests, timeout=self.timeout_s,
                                                   metadata=_session_metadata(session_id)):
                yield self._results(response, 0.0)
        except grpc.RpcError as error:
            raise _wrap("DecodeStream", error) from None

    def open_decode_stream(self, session_id: str, *, dtype: Optional[str] = None,
                           in_thread: bool = False,
                           timeout_s: Union[float, None, str] = "client") -> "DecodeStream":
        """An open DecodeStream driven step by step: `stream.step({rid: x})` sends one step and
        waits for its answer. Close it (or use `with`) to end the call. `in_thread=True` drives
        it from the calling thread (LoopDecodeStream: grpc.aio on a private event loop) instead
        of through gRPC's request-iterator thread: no thread handoff per message, which is what
        a step-at-a-time caller pays for on a busy machine. `timeout_s` is the deadline of the
        whole stream: the client's timeout_s by default, None for none (a stream that lasts a
        generation outlives any per-call timeout)."""
        timeout = self.timeout_s if timeout_s == "client" else timeout_s
        if in_thread:
            return LoopDecodeStream(self, session_id, dtype, timeout)
        return DecodeStream(self, session_id, dtype, timeout)

    # -- health --

    def health(self, service: str = "", wait_s: float = 0.0) -> str:
        """grpc.health.v1 Check: "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN" or "UNKNOWN".
        With wait_s > 0, retries until SERVING or the time is up (then returns or raises the last
        answer)."""
        check = self._channel.unary_unary("/grpc.health.v1.Health/Check")
        request = b"" if not service else (b"\x0a" + _varint(len(service.encode())) +
                                           service.encode())
        give_up = time.monotonic() + wait_s
        while True:
            try:
                answer = _health_status(check(request, timeout=min(self.timeout_s, 1.0)
                                              if wait_s > 0 else self.timeout_s))
                if answer == "SERVING" or time.monotonic() >= give_up:
                    return answer
            except grpc.RpcError as error:
                if time.monotonic() >= give_up:
                    raise _wrap("Health.Check", error) from None
            time.sleep(0.1)


class DecodeStream:
    """One DecodeStream call, driven a step at a time (see AttnServeClient.open_decode_stream)."""

    _END = object()

    def __init__(self, client: AttnServeClient, session_id: str, dtype: Optional[str],
                 timeout_s: Optional[float] = None):
        self._client = client
        self._session_id = session_id
        self._dtype = dtype
        self._requests: "queue.Queue[Any]" = queue.Queue()
        self._responses = client.stub.DecodeStream(iter(self._requests.get, self._END),
                                                   timeout=timeout_s,
                                                   metadata=_session_metadata(session_id))
        self._closed = False

    def step(self, inputs: Mapping[str, np.ndarray],
             positions: Optional[Mapping[str, int]] = None, *, layer: int = 0,
             session_id: str = "") -> StepResult:
        """Sends one step (`positions` as for AttnServeClient.decode) and waits for its answer.
        `layer`: the layer of a model session this message runs (one message per layer, layers
        0..n-1 in order, each carrying every request of the step). `session_id`: another session
        than the stream's for this message (each message names its own; the stream's metadata
        names the first, for a balancer's affinity). The first failing message ends the stream
        with its status (AttnServeError); the stream is closed then."""
        if self._closed:
            raise RuntimeError("the decode stream is closed")
        request = self._client._decode_request(session_id or self._session_id, inputs,
                                               self._dtype, positions, layer)
        start = time.perf_counter()
        response = self.exchange(request)
        return self._client._results(response, (time.perf_counter() - start) * 1e3)

    def exchange(self, request: pb.DecodeRequest) -> pb.DecodeResponse:
        """Sends one DecodeRequest as it is and returns the raw DecodeResponse (step() without
        the conversions). The message is serialized on gRPC's request thread, later: do not
        change `request` until the answer is in."""
        if self._closed:
            raise RuntimeError("the decode stream is closed")
        self._requests.put(request)
        try:
            return next(self._responses)
        except StopIteration:
            self._abandon()
            raise AttnServeError("DecodeStream", "UNKNOWN", "the server ended the stream") from None
        except grpc.RpcError as error:
            self._abandon()
            raise _wrap("DecodeStream", error) from None

    def _abandon(self) -> None:
        """After the stream ended: nothing more is sent, and close() has nothing to drain."""
        self._closed = True
        self._requests.put(self._END)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._requests.put(self._END)
        try:
            for _ in self._responses:  # Drain to the end so that the call finishes cleanly.
                pass
        except grpc.RpcError as error:
            raise _wrap("DecodeStream", error) from None

    def __enter__(self) -> "DecodeStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class LoopDecodeStream:
    """One DecodeStream driven from the calling thread (AttnServeClient.open_decode_stream with
    in_thread=True): a grpc.aio call on the client's event loop and aio channel (shared by every
    LoopDecodeStream of the client, made once), each step one write-then-read run to completion
    on it. The sync API's bidi call consumes its requests on a thread of its own, so every
    message crosses threads twice; here none does. Not thread-safe, and the client's loop is
    driven by one thread at a time: use a client's LoopDecodeStreams from one thread (grpc.aio
    serves one running event loop at a time per process; two on two threads race for its
    poller)."""

    METHOD = "/attnserve.v1.AttentionService/DecodeStream"

    def __init__(self, client: AttnServeClient, session_id: str, dtype: Optional[str],
                 timeout_s: Optional[float] = None):
        self._client = client
        self._session_id = session_id
        self._dtype = dtype
        self._loop, channel = client._aio()
        self._closed = False
        method = channel.stream_stream(
            self.METHOD,
            request_serializer=pb.DecodeRequest.SerializeToString,
            response_deserializer=pb.DecodeResponse.FromString)
        metadata = tuple(client._token_metadata) + tuple(_session_metadata(session_id) or ())

        async def start():  # The call binds to the running loop.
            return method(timeout=timeout_s, metadata=metadata)
        self._call = self._loop.run_until_complete(start())

    async def _exchange(self, request):
        call = self._call
        core = getattr(call, "_cython_call", None)
        sent = getattr(call, "_metadata_sent", None)
        if core is None or sent is None:  # Another grpc.aio than this was written against.
            await call.write(request)
            return await call.read()
        # call.write() through grpc.aio's own path, less its failure handling: when the server
        # has already ended the stream (e.g. UNIMPLEMENTED: it does not serve the method),
        # grpc.aio's write replaces the server's status with its own INTERNAL "Internal error
        # from Core" if the write fails before the status arrives. Here a failed write is left to
        # the read, which ends (EOF) once the server's status is in, and that status is raised.
        serialized = request.SerializeToString()
        if not sent.is_set():
            await sent.wait()
        if call.done():
            return await call.read()
        # The write and the read in flight together: the write's completion reaches this loop
        # (through grpc.aio's poller thread) about when the answer does, so awaiting it before
        # posting the read cost one more poller -> loop wake-up per message (about 0.1 ms,
        # docs/benchmarks.md, "A layer call's round trip, broken down").
        send = asyncio.ensure_future(core.send_serialized_message(serialized))
        try:
            response = await call.read()
        finally:
            # Always awaited (never cancelled: that would cancel the call). A failed write is
            # left to the read, which raises or returns EOF with the server's status.
            try:
                await send
            except grpc.RpcError:
                raise
            except Exception:  # noqa: BLE001 - cygrpc's InternalError: the stream has ended.
                pass
        return response

    def exchange(self, request: pb.DecodeRequest) -> pb.DecodeResponse:
        """Sends one DecodeRequest as it is and returns the raw DecodeResponse (step() without
        the conversions, for a caller that builds and reads the messages itself)."""
        if self._closed:
            raise RuntimeError("the decode stream is closed")
        try:
            response = self._loop.run_until_complete(self._exchange(request))
        except grpc.RpcError as error:
            self._closed = True
            raise _wrap("DecodeStream", error) from None
        if response is grpc.aio.EOF:
            self._closed = True
            code, details = self._final_status()
            raise AttnServeError("DecodeStream", code, details)
        return response

    def step(self, inputs: Mapping[str, np.ndarray],
             positions: Optional[Mapping[str, int]] = None, *, layer: int = 0,
             session_id: str = "") -> StepResult:
        """As DecodeStream.step."""
        if self._closed:
            raise RuntimeError("the decode stream is closed")
        request = self._client._decode_request(session_id or self._session_id, inputs,
                                               self._dtype, positions, layer)
        start = time.perf_counter()
        response = self.exchange(request)
        return self._client._results(response, (time.perf_counter() - start) * 1e3)

    def _final_status(self) -> Tuple[str, str]:
        try:
            code = self._loop.run_until_complete(self._call.code())
            details = self._loop.run_until_complete(self._call.details())
            return code.name, details or "the server ended the stream"
        except grpc.RpcError as error:
            wrapped = _wrap("DecodeStream", error)
            return wrapped.code, wrapped.message

    async def _finish(self) -> None:
        await self._call.done_writing()
        while await self._call.read() is not grpc.aio.EOF:
            pass

    def close(self) -> None:
        """Half-closes the stream and reads it to its end (the client's channel stays open)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._loop.run_until_complete(self._finish())
            code = self._loop.run_until_complete(self._call.code())
            if code != grpc.StatusCode.OK:
                details = self._loop.run_until_complete(self._call.details())
                raise AttnServeError("DecodeStream", code.name, details or "")
        except grpc.RpcError as error:
            raise _wrap("DecodeStream", error) from None

    def __enter__(self) -> "LoopDecodeStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _health_status(response: bytes) -> str:
    """Field 1 (enum ServingStatus) of grpc.health.v1.HealthCheckResponse, hand-decoded: the
    health proto is not part of this package."""
    status, i = 0, 0
    while i < len(response):
        key = response[i]
        i += 1
        value, shift = 0, 0
        while i < len(response):
            byte = response[i]
            i += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        if key >> 3 == 1:
            status = value
    return {1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}.get(status, "UNKNOWN")
