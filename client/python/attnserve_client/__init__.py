"""Python client of attnserve's AttentionService (proto/attnserve/v1/attention_service.proto).

    from attnserve_client import AttnServeClient, LayerSpec

    with AttnServeClient("127.0.0.1:50051") as client:
        session = client.configure(LayerSpec("gqa", d_model=512, num_heads=8, num_kv_heads=2),
                                   seed=1)
        out = client.forward(session.session_id, {"a": prompt})      # prompt: [T, 512] float32
        step = client.decode(session.session_id, {"a": hidden})      # hidden: [512] or [1, 512]
        client.release(session.session_id)

Install with `pip install ./client/python` (README.md there). In the source tree the protobuf
modules are generated from the .proto on first import (see _codegen.py); an installed package
carries them. The raw messages and stub are available as `attnserve_client.pb` and
`attnserve_client.pb_grpc`.
"""

from attnserve_client import _codegen

_codegen.ensure_on_path()

from attnserve.v1 import attention_service_pb2 as pb  # noqa: E402
from attnserve.v1 import attention_service_pb2_grpc as pb_grpc  # noqa: E402

from attnserve_client.client import (  # noqa: E402
    AttnServeClient,
    AttnServeError,
    BackendCapabilities,
    BatchingStats,
    ConfigureResult,
    DecodeStep,
    DecodeStream,
    LayerKindKv,
    LayerSpec,
    Limits,
    MlaDims,
    RequestInfo,
    RopeScaling,
    ServerInfo,
    SessionCost,
    SessionInfo,
    StepResult,
    Timing,
    numpy_to_tensor,
    tensor_to_numpy,
)

__all__ = [
    "AttnServeClient",
    "AttnServeError",
    "BackendCapabilities",
    "BatchingStats",
    "ConfigureResult",
    "DecodeStep",
    "DecodeStream",
    "LayerKindKv",
    "LayerSpec",
    "Limits",
    "MlaDims",
    "RequestInfo",
    "RopeScaling",
    "ServerInfo",
    "SessionCost",
    "SessionInfo",
    "StepResult",
    "Timing",
    "numpy_to_tensor",
    "pb",
    "pb_grpc",
    "tensor_to_numpy",
]
