#!/usr/bin/env python3
"""PyTorch CPU peer of cpu_attention_benchmark: the same layer work, on the same cores.

    python3 tests/benchmarks/torch_cpu_peer.py [--threads N] [--filter REGEX] [--json OUT]

Rows carry the names of cpu_attention_benchmark's rows (BM_Prefill/<variant>/<tokens>/<kv>,
BM_Decode/<variant>/<context>/<kv>/<batch>) so run_cpu_benchmarks.py can put both side by side.
Each row times what the engine's row times, written the way a PyTorch user would (eager, fp32
weights, torch.set_num_threads(N), inference_mode):

  prefill  q/k/v projections (x @ W^T), RoPE, the new K and V written into a preallocated cache
           of the row's KV dtype, F.scaled_dot_product_attention(is_causal=True, enable_gqa=True),
           o-proj. MLA: q proj, kv_a proj, RMSNorm of the latent, RoPE (interleaved) of q_pe and
           k_pe, latent + k_pe into the cache, kv_b up-projection to per-head K_nope and V, SDPA
           with 96-dim keys and 64-dim values (padded to 96 so that SDPA's flash kernel runs),
           o-proj.
  decode   one step for `batch` sequences: projections of the batch's new tokens, RoPE at each
           sequence's position, K/V appended into the preallocated cache, SDPA of one query per
           sequence over the cache so far (enable_gqa), o-proj; the context grows by one token
           per step, as in the engine's benchmark. bf16 KV: the cache is bf16 and so are q and
           SDPA's inputs (PyTorch's CPU flash kernel accumulates in float32). MLA: absorbed, as
           the engine decodes: q_nope through W_UK into the latent space, one "KV head" of
           [latent | k_pe] (288 dims) with the latent as value (matmul, softmax, matmul: SDPA's
           math fallback for these shapes is far slower), then W_UV and o-proj.

  smol     SmolLM2-135M's attention (d_model 576, 9 query / 3 KV heads of 64, RoPE theta 1e5) as
           transformers runs it: its own LlamaAttention (sdpa) with a DynamicCache, not a
           rewrite. BM_SmolPrefill/<tokens>: one prompt into an empty cache; BM_SmolDecode/
           <context>/<batch>: `batch` prompts of `context` tokens prefilled into one cache (not
           timed), then one step of [batch, 1, 576] per timed iteration, the cache growing.

Time per row: the median of the timed iterations after a warm-up (prefill: >= 5 iterations and
>= 1 s; decode: 16 steps from the same context, the engine takes 64, which moves
the mean context by 1%). Needs only torch.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
import time

import torch
import torch.nn.functional as F

D_MODEL = 512
HEADS = 8
HEAD_DIM = 64
# Variant index (as in cpu_attention_benchmark / client/common/demo_variants.cc): KV heads.
VARIANTS = {0: ("MHA", 8), 1: ("GQA-4", 4), 2: ("MQA", 1), 3: ("MLA-256", None)}
MLA_LORA, MLA_NOPE, MLA_ROPE, MLA_V = 256, 64, 32, 64
ROPE_THETA = 10000.0

PREFILL_ROWS = [(v, 2048, kv) for v in range(4) for kv in (0,)] + [(0, 2048, 1), (3, 2048, 1)]
DECODE_ROWS = [(v, 4096, kv, 8) for kv in (0, 1) for v in range(4)]
DECODE_STEPS = 16


def kv_dtype(code: int) -> torch.dtype:
    return torch.bfloat16 if code else torch.float32


def rope_tables(positions: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (ROPE_THETA ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    angles = positions.to(torch.float64)[:, None] * inv_freq[None, :]
    return angles.cos().float(), angles.sin().float()


def rope_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x [tokens, heads, dim]; cos/sin [tokens, dim/2] (Llama's rotate_half layout).
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat((a * c - b * s, b * c + a * s), dim=-1)


def rope_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    a, b = x[..., 0::2], x[..., 1::2]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.stack((a * c - b * s, b * c + a * s), dim=-1).flatten(-2)


def weight(out_features: int, in_features: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(out_features, in_features, generator=gen) / math.sqrt(in_features)


class GqaPeer:
    def __init__(self, kv_heads: int, dtype: torch.dtype, capacity: int, batch: int):
        gen = torch.Generator().manual_seed(1)
        self.kv_heads = kv_heads
        self.wq = weight(HEADS * HEAD_DIM, D_MODEL, gen)
        self.wk = weight(kv_heads * HEAD_DIM, D_MODEL, gen)
        self.wv = weight(kv_heads * HEAD_DIM, D_MODEL, gen)
        self.wo = weight(D_MODEL, HEADS * HEAD_DIM, gen)
        self.dtype = dtype
        self.k_cache = torch.randn(batch, kv_heads, capacity, HEAD_DIM, generator=gen).to(dtype)
        self.v_cache = torch.randn(batch, kv_heads, capacity, HEAD_DIM, generator=gen).to(dtype)

    def prefill(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        cos, sin = rope_tables(torch.arange(n), HEAD_DIM)
        q = rope_half((x @ self.wq.T).view(n, HEADS, HEAD_DIM), cos, sin).transpose(0, 1)
        k = rope_half((x @ self.wk.T).view(n, self.kv_heads, HEAD_DIM), cos, sin).transpose(0, 1)
        v = (x @ self.wv.T).view(n, self.kv_heads, HEAD_DIM).transpose(0, 1)
        self.k_cache[0, :, :n].copy_(k)
        self.v_cache[0, :, :n].copy_(v)
        o = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True,
                                           enable_gqa=True)
        return o[0].transpose(0, 1).reshape(n, HEADS * HEAD_DIM) @ self.wo.T

    def decode(self, x: torch.Tensor, position: int) -> torch.Tensor:
        b = x.shape[0]
        cos, sin = rope_tables(torch.full((b,), position), HEAD_DIM)
        q = rope_half((x @ self.wq.T).view(b, HEADS, HEAD_DIM), cos, sin)
        k = rope_half((x @ self.wk.T).view(b, self.kv_heads, HEAD_DIM), cos, sin)
        v = (x @ self.wv.T).view(b, self.kv_heads, HEAD_DIM)
        self.k_cache[:, :, position].copy_(k)
        self.v_cache[:, :, position].copy_(v)
        n = position + 1
        o = F.scaled_dot_product_attention(q[:, :, None].to(self.dtype), self.k_cache[:, :, :n],
                                           self.v_cache[:, :, :n], enable_gqa=True)
        return o.float().reshape(b, HEADS * HEAD_DIM) @ self.wo.T


class MlaPeer:
    def __init__(self, dtype: torch.dtype, capacity: int, batch: int):
        gen = torch.Generator().manual_seed(1)
        self.qk = MLA_NOPE + MLA_ROPE
        self.wq = weight(HEADS * self.qk, D_MODEL, gen)
        self.wkv_a = weight(MLA_LORA + MLA_ROPE, D_MODEL, gen)
        self.norm = torch.ones(MLA_LORA)
        self.wkv_b = weight(HEADS * (MLA_NOPE + MLA_V), MLA_LORA, gen)
        self.wo = weight(D_MODEL, HEADS * MLA_V, gen)
        wkv_b = self.wkv_b.view(HEADS, MLA_NOPE + MLA_V, MLA_LORA)
        self.w_uk = wkv_b[:, :MLA_NOPE].contiguous()  # [h, nope, lora]
        self.w_uv = wkv_b[:, MLA_NOPE:].contiguous()  # [h, v, lora]
        self.scale = 1.0 / math.sqrt(self.qk)
        self.dtype = dtype
        # [batch, 1, capacity, lora + rope]: the latent then k_pe, one shared "KV head".
        self.cache = torch.randn(batch, 1, capacity, MLA_LORA + MLA_ROPE, generator=gen).to(dtype)

    def latents(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        kv = x @ self.wkv_a.T
        c = kv[:, :MLA_LORA]
        c = c * torch.rsqrt(c.pow(2).mean(-1, keepdim=True) + 1e-6) * self.norm
        pe = rope_interleaved(kv[:, None, MLA_LORA:], cos, sin)[:, 0]
        return torch.cat((c, pe), dim=-1)

    def queries(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        q = (x @ self.wq.T).view(x.shape[0], HEADS, self.qk)
        return q[..., :MLA_NOPE], rope_interleaved(q[..., MLA_NOPE:], cos, sin)

    def prefill(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        cos, sin = rope_tables(torch.arange(n), MLA_ROPE)
        q_nope, q_pe = self.queries(x, cos, sin)
        lat = self.latents(x, cos, sin)
        self.cache[0, 0, :n].copy_(lat)
        kv = (lat[:, :MLA_LORA] @ self.wkv_b.T).view(n, HEADS, MLA_NOPE + MLA_V)
        k = torch.cat((kv[..., :MLA_NOPE], lat[:, None, MLA_LORA:].expand(n, HEADS, MLA_ROPE)),
                      dim=-1)
        q = torch.cat((q_nope, q_pe), dim=-1)
        # V padded to the key width (96) so SDPA takes its flash kernel rather than the math
        # fallback, as transformers' DeepseekV2 does for flash attention; the pad is sliced off.
        v = F.pad(kv[..., MLA_NOPE:], (0, self.qk - MLA_V))
        o = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                           v.transpose(0, 1)[None], is_causal=True,
                                           scale=self.scale)[..., :MLA_V]
        return o[0].transpose(0, 1).reshape(n, HEADS * MLA_V) @ self.wo.T

    def decode(self, x: torch.Tensor, position: int) -> torch.Tensor:
        b = x.shape[0]
        cos, sin = rope_tables(torch.full((b,), position), MLA_ROPE)
        q_nope, q_pe = self.queries(x, cos, sin)
        self.cache[:, 0, position].copy_(self.latents(x, cos, sin))
        q_lat = torch.einsum("bhn,hnl->bhl", q_nope, self.w_uk)
        q = torch.cat((q_lat, q_pe), dim=-1)[:, :, None].to(self.dtype)  # [b, h, 1, 288]
        n = position + 1
        kv = self.cache[:, 0, :n]  # [b, n, lora + rope]
        # Two batched matmuls and a softmax: SDPA with 288-dim keys, 256-dim values and 8 query
        # heads on one KV head takes its math fallback here, 50-100x slower.
        scores = torch.matmul(q[:, :, 0], kv.transpose(1, 2)).float() * self.scale  # [b, h, n]
        weights = torch.softmax(scores, dim=-1).to(self.dtype)
        o = torch.matmul(weights, kv[..., :MLA_LORA])[:, :, None]  # [b, h, 1, lora]
        o = torch.einsum("bhl,hvl->bhv", o[:, :, 0].float(), self.w_uv)
        return o.reshape(b, HEADS * MLA_V) @ self.wo.T


def make_peer(variant: int, dtype: torch.dtype, capacity: int, batch: int):
    kv_heads = VARIANTS[variant][1]
    return MlaPeer(dtype, capacity, batch) if kv_heads is None else GqaPeer(kv_heads, dtype,
                                                                            capacity, batch)


def time_prefill(variant: int, tokens: int, kv: int) -> float:
    peer = make_peer(variant, kv_dtype(kv), tokens, 1)
    x = torch.randn(tokens, D_MODEL, generator=torch.Generator().manual_seed(2))
    peer.prefill(x)
    times = []
    start_all = time.perf_counter()
    while len(times) < 5 or time.perf_counter() - start_all < 1.0:
        start = time.perf_counter()
        peer.prefill(x)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_decode(variant: int, context: int, kv: int, batch: int) -> float:
    peer = make_peer(variant, kv_dtype(kv), context + DECODE_STEPS + 2, batch)
    x = torch.randn(batch, D_MODEL, generator=torch.Generator().manual_seed(2))
    peer.decode(x, context)  # Warm-up (overwritten by the first timed step).
    times = []
    for step in range(DECODE_STEPS):
        start = time.perf_counter()
        peer.decode(x, context + step)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


SMOL_PREFILL_ROWS = [512]
SMOL_DECODE_ROWS = [(512, 1), (512, 8), (512, 64)]


def smol_attention():
    # Imported here: the other rows need only torch.
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding
    config = LlamaConfig(hidden_size=576, num_attention_heads=9, num_key_value_heads=3,
                         head_dim=64, rope_theta=100000.0, max_position_embeddings=8192,
                         attention_bias=False)
    config._attn_implementation = "sdpa"
    torch.manual_seed(1)
    return config, LlamaAttention(config, layer_idx=0).eval(), LlamaRotaryEmbedding(config)


def smol_forward(attention, rotary, x, cache, start: int):
    n = x.shape[1]
    positions = torch.arange(start, start + n)[None].expand(x.shape[0], n)
    position_embeddings = rotary(x, positions)
    return attention(x, position_embeddings, attention_mask=None, past_key_values=cache,
                     cache_position=torch.arange(start, start + n))[0]


def time_smol_prefill(tokens: int) -> float:
    from transformers import DynamicCache
    config, attention, rotary = smol_attention()
    x = torch.randn(1, tokens, config.hidden_size, generator=torch.Generator().manual_seed(2))
    smol_forward(attention, rotary, x, DynamicCache(), 0)
    times = []
    start_all = time.perf_counter()
    while len(times) < 5 or time.perf_counter() - start_all < 1.0:
        cache = DynamicCache()
        start = time.perf_counter()
        smol_forward(attention, rotary, x, cache, 0)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_smol_decode(context: int, batch: int) -> float:
    from transformers import DynamicCache
    config, attention, rotary = smol_attention()
    gen = torch.Generator().manual_seed(2)
    prompt = torch.randn(batch, context, config.hidden_size, generator=gen)
    step = torch.randn(batch, 1, config.hidden_size, generator=gen)
    cache = DynamicCache()
    smol_forward(attention, rotary, prompt, cache, 0)
    smol_forward(attention, rotary, step, cache, context)  # Warm-up step.
    times = []
    for i in range(DECODE_STEPS):
        start = time.perf_counter()
        smol_forward(attention, rotary, step, cache, context + 1 + i)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--filter", default=".", help="regex over row names")
    parser.add_argument("--json", help="write {row name: seconds} here (default: stdout)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    pattern = re.compile(args.filter)
    results = {}
    with torch.inference_mode():
        for variant, tokens, kv in PREFILL_ROWS:
            name = f"BM_Prefill/{variant}/{tokens}/{kv}"
            if pattern.search(name):
                results[name] = time_prefill(variant, tokens, kv)
                print(f"{name} {results[name] * 1e3:.2f} ms", file=sys.stderr)
        for variant, context, kv, batch in DECODE_ROWS:
            name = f"BM_Decode/{variant}/{context}/{kv}/{batch}"
            if pattern.search(name):
                results[name] = time_decode(variant, context, kv, batch)
                print(f"{name} {results[name] * 1e3:.3f} ms", file=sys.stderr)
        for tokens in SMOL_PREFILL_ROWS:
            name = f"BM_SmolPrefill/{tokens}"
            if pattern.search(name):
                results[name] = time_smol_prefill(tokens)
                print(f"{name} {results[name] * 1e3:.2f} ms", file=sys.stderr)
        for context, batch in SMOL_DECODE_ROWS:
            name = f"BM_SmolDecode/{context}/{batch}"
            if pattern.search(name):
                results[name] = time_smol_decode(context, batch)
                print(f"{name} {results[name] * 1e3:.3f} ms", file=sys.stderr)
    text = json.dumps({"torch": torch.__version__, "threads": args.threads, "rows": results},
                      indent=1)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
