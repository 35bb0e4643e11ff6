"""ForwardStream through the Python client against a server whose message limit is 256 KiB: a
2000-row prompt at d_model 256 (2 MB in f32) goes through forward() automatically and equals, bit
for bit, the same rows sent as unary forwards of 128 rows; forward_stream() refuses an existing
request with ALREADY_EXISTS and leaves it as it was.

    python3 tests/client/python_forward_stream_test.py HOST:PORT
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "client", "python"))
from attnserve_client.client import AttnServeClient, AttnServeError, numpy_to_tensor  # noqa: E402
from attnserve.v1 import attention_service_pb2 as pb  # noqa: E402


def main(target):
    client = AttnServeClient(target)
    spec = pb.LayerSpec(variant=pb.VARIANT_GQA, d_model=256, num_heads=4, num_kv_heads=2,
                        head_dim=64, rope=pb.ROPE_HALF, causal=True)
    session = client.stub.Configure(pb.ConfigureRequest(spec=spec, weights=pb.WeightSource(seed=1)),
                                    timeout=60).session_id
    x = np.random.default_rng(0).standard_normal((2000, 256)).astype(np.float32)
    assert x.nbytes > 4 * 256 * 1024, "the prompt must not fit one message"

    streamed = client.forward(session, {"streamed": x})  # Too large: over ForwardStream.
    assert streamed.outputs["streamed"].shape == (2000, 256), streamed.outputs["streamed"].shape
    assert streamed.sequence_lengths["streamed"] == 2000
    unary = np.concatenate([client.forward(session, {"unary": x[i:i + 128]}).outputs["unary"]
                            for i in range(0, 2000, 128)])
    assert np.array_equal(unary, streamed.outputs["streamed"]), "streamed != unary outputs"

    request = pb.ForwardRequest(session_id=session, items=[
        pb.ForwardItem(request_id="streamed", hidden=numpy_to_tensor(x[:10]))])
    try:
        client.forward_stream(session, request)
        raise AssertionError("a stream onto an existing request was accepted")
    except AttnServeError as error:
        assert error.code == "ALREADY_EXISTS", error
    info = client.stub.GetSession(pb.GetSessionRequest(session_id=session), timeout=60).session
    lengths = {r.request_id: r.sequence_length for r in info.requests}
    assert lengths == {"streamed": 2000, "unary": 2000}, lengths
    print("python_forward_stream_test: OK")


if __name__ == "__main__":
    main(sys.argv[1])
