#!/usr/bin/env python3
"""Builds the peer case for hybrid stacks: a tiny random Gemma 3 text model of 6 layers in its own
5 sliding-window : 1 global pattern, run as attnserve runs a stack (docs/hybrid_stacks.md).

transformers computes each layer's attention with that layer's own mask (sliding window or full)
and rotary embeddings (rope_local_base_freq for sliding layers, rope_theta with linear scaling
for the global one). This script takes those from the model itself: it runs the model once with
forward pre-hooks on every self_attn that record the keyword arguments transformers passes
(position_embeddings, attention_mask, ...), then chains the attention modules alone on the
residual stream,

    h_0 = x,   h_{i+1} = h_i + layers[i].self_attn(h_i, <layer i's recorded kwargs>)

which is what a stack of attention layers without norms or MLPs computes. The server, configured
from the saved checkpoint with stack.num_layers = 6, must return h_6 for x.

Output, under --out/<name>/ (tests/server/stack_peer_test.cc reads it):
  model.safetensors, config.json   save_pretrained of the model
  io.safetensors   "hidden" [L, d_model] f32 (x), "positions" [L] f32 (contiguous from 5),
                   "expected" [L, d_model] f32 (h_N)
  case.json        {"num_layers", "seq_len", "layer_types", "seed", "versions"}
"""

import argparse
import json
import os
import secrets
import shutil
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import safetensors.torch  # noqa: E402
import torch  # noqa: E402
from transformers import Gemma3ForCausalLM, Gemma3TextConfig  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_peer_cases import POSITION_OFFSET, VOCAB, reinit_attention, versions  # noqa: E402

NUM_LAYERS = 6
WINDOW = 8
SEQ_LEN = 29  # crosses the window several times


def gemma3_five_to_one():
    config = Gemma3TextConfig(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=NUM_LAYERS,
        num_attention_heads=8, num_key_value_heads=4, head_dim=32, query_pre_attn_scalar=32,
        sliding_window=WINDOW, layer_types=["sliding_attention"] * 5 + ["full_attention"],
        rope_theta=1000000.0, rope_local_base_freq=10000.0,
        rope_scaling={"rope_type": "linear", "factor": 8.0}, rms_norm_eps=1e-6,
        max_position_embeddings=512, attn_implementation="eager", torch_dtype=torch.float32)
    model = Gemma3ForCausalLM(config).to(torch.float32).eval()
    for layer in model.model.layers:
        reinit_attention(layer.self_attn, qk_gain=2.0)  # peaked attention, norms away from 1
    return model


def run_stack(model, hidden, positions):
    recorded = []

    def record(module, args, kwargs):
        recorded.append({k: v for k, v in kwargs.items() if k != "hidden_states"})

    handles = [layer.self_attn.register_forward_pre_hook(record, with_kwargs=True)
               for layer in model.model.layers]
    with torch.no_grad():
        model(inputs_embeds=hidden[None], position_ids=positions[None],
              attention_mask=torch.ones(1, hidden.shape[0], dtype=torch.long), use_cache=False)
    for h in handles:
        h.remove()
    assert len(recorded) == NUM_LAYERS, len(recorded)
    stream = hidden[None].clone()
    with torch.no_grad():
        for layer, kwargs in zip(model.model.layers, recorded):
            out = layer.self_attn(hidden_states=stream, **kwargs)
            stream = stream + (out[0] if isinstance(out, tuple) else out)
    return stream[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory to write the case directory into")
    parser.add_argument("--seed", type=int, default=None,
                        help="torch seed (default: a fresh random seed, printed)")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else secrets.randbits(31)
    print(f"make_stack_peer_case: seed {seed} (rerun with --seed {seed})")
    torch.set_num_threads(2)
    torch.manual_seed(seed)
    name = "gemma3_five_to_one_stack"
    case_dir = os.path.join(args.out, name)
    shutil.rmtree(case_dir, ignore_errors=True)
    os.makedirs(case_dir)
    model = gemma3_five_to_one()
    hidden = torch.randn(SEQ_LEN, model.config.hidden_size, dtype=torch.float32)
    # Contiguous positions: a window counts token indices, which then equal position differences.
    positions = POSITION_OFFSET + torch.arange(SEQ_LEN)
    expected = run_stack(model, hidden, positions)
    model.save_pretrained(case_dir, safe_serialization=True)
    safetensors.torch.save_file(
        {"hidden": hidden.contiguous(), "positions": positions.to(torch.float32).contiguous(),
         "expected": expected.to(torch.float32).contiguous()},
        os.path.join(case_dir, "io.safetensors"))
    with open(os.path.join(case_dir, "case.json"), "w") as f:
        json.dump({"num_layers": NUM_LAYERS, "seq_len": SEQ_LEN,
                   "layer_types": model.config.layer_types, "seed": seed,
                   "versions": versions()}, f, indent=2)
        f.write("\n")
    rms_in = float(hidden.pow(2).mean().sqrt())
    rms_out = float(expected.pow(2).mean().sqrt())
    print(f"  {name} L={SEQ_LEN} layers={NUM_LAYERS} rms(x)={rms_in:.3f} rms(h_N)={rms_out:.3f} "
          f"rms(h_N - x)={float((expected - hidden).pow(2).mean().sqrt()):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
