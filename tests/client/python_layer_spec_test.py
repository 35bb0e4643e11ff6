"""ctest: the Python client's LayerSpec, which is built from the proto's fields
(client/python/attnserve_client/client.py: _SPEC_FIELDS, _with_new_proto_fields), keeps its API and
its wire bytes: the keyword names and defaults callers use, the bytes of to_proto (the server
fingerprints what it resolves from them, so these bytes are pinned as the hand-written client wrote
them before the fields came from the proto), to_dict and from_proto, and the refusals of unknown
names. A proto field the class does not declare becomes a keyword argument with the proto's zero.

Usage: python_layer_spec_test.py (no server; the client package from the source tree).
"""

import dataclasses
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "client" / "python"))

from attnserve_client import LayerSpec, MlaDims  # noqa: E402
from attnserve_client import client  # noqa: E402
from attnserve_client.client import RopeScaling  # noqa: E402

EVERY_FIELD = dict(
    variant="gqa", d_model=128, num_heads=8, num_kv_heads=2, head_dim=16, qkv_bias=True,
    o_bias=True, rope="interleaved", rope_theta=500000.0,
    rope_scaling=RopeScaling(type="yarn", factor=4.0, original_max_position_embeddings=4096,
                             beta_fast=16.0, beta_slow=2.0, mscale=1.0, mscale_all_dim=0.5,
                             truncate=False),
    causal=True, sliding_window=64, softmax_scale=0.1, rotary_dim=8, qk_norm="rms_unit_offset",
    qk_norm_eps=1e-5, attn_logit_softcapping=30.0, attention_sinks=True, alibi="mpt",
    alibi_bias_max=6.0)

# to_proto's bytes (deterministic), as the client wrote them before its fields came from the proto.
PINNED_PROTO = {
    "every_field": (EVERY_FIELD,
                    "0803108001180820022810300138014002490000000080841e415001584065cdcccc3d72460804"
                    "11000000000000104018802021000000000000f03f290000000000001040310000000000003040"
                    "39000000000000004041000000000000f03f49000000000000e03f500078088001028d01acc527"
                    "3795010000f041980101a00102ad010000c040"),
    "minimal_mha": (dict(variant="mha", d_model=64, num_heads=4),
                    "08011040180420042810400149000000000088c34050018d01bd378635"),
    "mqa": (dict(variant="MQA", d_model=64, num_heads=4, causal=False),
            "08021040180420012810400149000000000088c3408d01bd378635"),
    # The slope range goes on the wire only with ALiBi.
    "alibi_max_without_alibi": (dict(variant="mha", d_model=64, num_heads=4, alibi_bias_max=4.0,
                                     qk_norm="RMS_ACROSS_HEADS", rope="none"),
                                "0801104018042004281049000000000088c34050018001038d01bd378635"),
    "bloom": (dict(variant="mha", d_model=64, num_heads=4, alibi="bloom", rope="none"),
              "0801104018042004281049000000000088c34050018d01bd378635a00101ad0100000041"),
    "mla": (dict(variant="mla", d_model=64, num_heads=4,
                 mla=MlaDims(kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
                             v_head_dim=16, q_lora_rank=24, rms_norm_eps=1e-5),
                 rope_scaling=RopeScaling(type="yarn", factor=40.0,
                                          original_max_position_embeddings=4096, mscale=1.0,
                                          mscale_all_dim=0.707)),
            "080410401804400149000000000088c34050016a0f0818102018102008281035acc527377246080411"
            "000000000000444018802021000000000000f03f29000000000000104031000000000000404039000000"
            "000000f03f41000000000000f03f4939b4c876be9fe63f50018d01bd378635"),
}

# The keyword names and defaults existing callers rely on, in their order (positional calls).
DECLARED = [
    ("variant", dataclasses.MISSING), ("d_model", dataclasses.MISSING),
    ("num_heads", dataclasses.MISSING), ("num_kv_heads", 0), ("head_dim", 0), ("qkv_bias", False),
    ("o_bias", False), ("rope", "half"), ("rope_theta", 10000.0), ("rope_scaling", None),
    ("causal", True), ("sliding_window", 0), ("softmax_scale", 0.0), ("mla", None),
    ("rotary_dim", 0), ("qk_norm", "none"), ("qk_norm_eps", 1e-6), ("attn_logit_softcapping", 0.0),
    ("attention_sinks", False), ("alibi", "none"), ("alibi_bias_max", 8.0)]


def check(condition, message):
    if not condition:
        print(f"python_layer_spec_test: FAIL: {message}")
        sys.exit(1)


def main():
    fields = [(f.name, f.default) for f in dataclasses.fields(LayerSpec)]
    check(fields[:len(DECLARED)] == DECLARED, f"declared fields changed: {fields}")
    check(LayerSpec.__name__ == "LayerSpec" and LayerSpec.__module__ == client.__name__,
          f"{LayerSpec.__module__}.{LayerSpec.__name__}")
    positional = LayerSpec("gqa", 64, 4, 2, 16).to_proto()
    check((positional.num_kv_heads, positional.head_dim) == (2, 16), str(positional))

    for name, (kwargs, pinned) in PINNED_PROTO.items():
        spec = LayerSpec(**kwargs)
        proto = spec.to_proto()
        got = proto.SerializeToString(deterministic=True).hex()
        check(got == pinned, f"{name}: to_proto is {got}, pinned {pinned}")
        back = LayerSpec.from_proto(proto)
        check(LayerSpec.from_dict(spec.to_dict()) == back, f"{name}: to_dict -> from_dict {back}")
        check(back.to_proto() == proto, f"{name}: from_proto -> to_proto")

    back = LayerSpec.from_proto(LayerSpec(**EVERY_FIELD).to_proto())
    check(back.rope_scaling.truncate is False and back.alibi == "mpt" and
          back.qk_norm == "rms_unit_offset" and back.rope == "interleaved", str(back))
    # 0 on the wire reads as the default; alibi_bias_max without ALiBi is not sent.
    minimal = LayerSpec.from_proto(LayerSpec(variant="mha", d_model=64, num_heads=4,
                                             alibi_bias_max=4.0).to_proto())
    check((minimal.rope_theta, minimal.alibi_bias_max, minimal.head_dim, minimal.num_kv_heads) ==
          (10000.0, 8.0, 16, 4), str(minimal))
    check(minimal.to_dict()["qk_norm_eps"] == 9.999999974752427e-07, str(minimal.to_dict()))

    refusals = {
        "variant": ("xqa", "variant 'xqa': expected mha, mqa, gqa or mla"),
        "rope": ("spiral", "rope 'spiral': expected none, half, interleaved"),
        "qk_norm": ("layer", "qk_norm 'layer': expected none, rms, rms_unit_offset, "
                             "rms_across_heads, layer_norm"),
        "alibi": ("t5", "alibi 't5': expected none, bloom, mpt"),
    }
    for key, (value, message) in refusals.items():
        try:
            LayerSpec(**{"variant": "mha", "d_model": 64, "num_heads": 4, key: value}).to_proto()
            check(False, f"{key}={value!r} accepted")
        except ValueError as e:
            check(str(e) == message, f"{key}: {e}")
    try:
        LayerSpec(variant="mha", d_model=64, num_heads=4,
                  rope_scaling=RopeScaling(type="ntk")).to_proto()
        check(False, "rope_scaling ntk accepted")
    except ValueError as e:
        check(str(e) == "rope_scaling.type 'ntk': expected none, linear, dynamic, llama3, yarn",
              str(e))

    # A class declaring only the required fields gets every other proto field, at its zero.
    @client._with_new_proto_fields
    @dataclasses.dataclass
    class Required:
        variant: str
        d_model: int
        num_heads: int

    added = {f.name: (f.type, f.default) for f in dataclasses.fields(Required)}
    check(added["alibi"] == (str, "none") and added["qk_norm_eps"] == (float, 0.0) and
          added["attention_sinks"] == (bool, False) and added["rotary_dim"] == (int, 0) and
          "mla" not in added and "rope_scaling" not in added, str(added))
    print("python_layer_spec_test: PASS")


if __name__ == "__main__":
    main()
