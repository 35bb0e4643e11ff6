"""A transformers causal LM whose attention layers run on attnserve (docs/remote_model.md).

    from transformers import AutoModelForCausalLM
    from attnserve_client import AttnServeClient
    from attnserve_client.remote_model import serve_attention

    model = AutoModelForCausalLM.from_pretrained(checkpoint_dir, dtype=torch.float32)
    with AttnServeClient(address) as client, \\
            serve_attention(model, client, "SmolLM2-135M-Instruct") as remote:
        outputs = remote.generate([prompt_ids_a, prompt_ids_b], max_new_tokens=32)

`serve_attention` configures one model session holding every decoder layer (StackSpec.per_layer)
from the checkpoint directory as the server sees it (a path under its --checkpoint_root; the
specs read from config.json), or with `one_session=False` one session per decoder layer, and
replaces each layer's `self_attn` with a `RemoteAttention`. The rest of the model (embeddings,
norms, MLPs / MoE, the LM head) stays in the client. A step packs the new tokens of every active
prompt into one sequence [1, N] with explicit position ids; each decoder layer runs its
input_layernorm locally, and `RemoteAttention` sends each prompt's rows of the normed hidden
states to the server — one call per layer per step, naming the layer in the model session —
Forward (prefill, explicit positions) when some prompt is new,
else a decode step with explicit positions, by default one message of a DecodeStream that lasts
the generation (decode_stream=False: unary Decode) — and returns what attnserve returns: the
attention output after o_proj, which the decoder layer adds to its residual. With overlap=True a
step runs as two micro-batches on two threads, each with its own stream, so that one's MLPs run
here while the other's attention is on the server. Hidden states travel as bf16 when the model
or the KV pages are 16-bit (wire_dtype), else as f32. Every prompt is one request id (in
every session); the server holds the KV caches, the client none. Moving requests to another
server (move_to) happens between steps: a model session's request travels whole (every
layer's pages in one ExportRequest), one session per layer's one request per layer.

Families: anything whose decoder layers call `self.self_attn(hidden_states=..., ...)` and unpack
`(output, weights)`, with a config.json the server maps (kernels/model/hf_config.cc). Tested
token for token against transformers' generate() (tests/model/): Llama (SmolLM2-135M-Instruct),
and a tiny random model of each family in tests/model/remote_generate_test.py's FAMILIES (and
Gemma 3 text and DeepSeek-V3 in its tiny case), the one list of them. DeepSeek-V2 under YaRN with
mscale_all_dim (every released V2) gets DeepSeek's softmax scale, which transformers'
DeepseekV2Attention omits: its text is DeepSeek's, and serve_attention warns
(deepseek_v2_yarn_mscale).

`RemoteModel.generate` is continuous batching: up to `max_batch` prompts run together; a prompt
leaves (its requests released) when it reaches `max_new_tokens` or an EOS token, and a waiting
prompt joins (prefilled in the same step as the others decode). Greedy by default; sampling with
`do_sample=True` (temperature, top_k, top_p, seeded).
"""

from __future__ import annotations

import math
import secrets
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import torch

from attnserve.v1 import attention_service_pb2 as pb
from attnserve_client.client import (AttnServeClient, AttnServeError, LayerSpec,
                                     _bf16_bits_to_float)

# The name RemoteModel gives the model's attention implementation while it serves it: one that
# transformers has no mask function for, so a step builds no attention mask (RemoteAttention
# needs none: the server knows each request's positions). Building one was 12% of a batch-1
# step's time (the packed positions make it a per-element vmap; masking_utils.py skips it for
# "custom attention without equivalent mask creation").
_ATTN_IMPLEMENTATION = "attnserve_remote"


@dataclass
class _Segment:
    """One prompt's rows in a packed step."""

    request_id: str
    start: int
    length: int
    positions: List[int]
    prefill: bool  # Forward (new tokens of a new or extended request) or Decode (one token)


@dataclass
class _Plan:
    segments: List[_Segment] = field(default_factory=list)
    lane: int = 0  # the micro-batch (0 or 1 with overlap): each has its own decode stream
    # A decode step's message, built at its first layer and reused by the others: only the
    # layer and the rows change from layer to layer (the ids and positions are the step's).
    decode_request: Optional[pb.DecodeRequest] = None
    decode_items: List[pb.DecodeItem] = field(default_factory=list)


class RemoteAttention(torch.nn.Module):
    """Stands in for a decoder layer's self_attn: its input (the hidden states after
    input_layernorm) goes to attnserve, its output is attnserve's (after o_proj)."""

    def __init__(self, owner: "RemoteModel", layer: int, original: torch.nn.Module):
        super().__init__()
        # The original's plain attributes, which decoder layers read (Gemma 3: is_sliding).
        for key, value in vars(original).items():
            if not key.startswith("_") and (value is None or isinstance(
                    value, (bool, int, float, str, tuple))):
                setattr(self, key, value)
        self.layer = layer
        self.layer_idx = layer
        # Not a submodule: the owner holds the original modules and their weights.
        object.__setattr__(self, "_owner", owner)

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs):
        owner = self._owner
        plan = getattr(owner._local, "plan", None)
        if plan is None:
            raise RuntimeError("RemoteAttention called outside RemoteModel.step/generate: the "
                               "request ids and positions of the rows are unknown")
        if hidden_states.dim() != 3 or hidden_states.shape[0] != 1:
            raise ValueError(f"RemoteAttention expects a packed [1, N, d_model] input, got "
                             f"{tuple(hidden_states.shape)}")
        out = owner._attend(self.layer, hidden_states[0].detach(), plan)
        return out.to(device=hidden_states.device, dtype=hidden_states.dtype).unsqueeze(0), None


@dataclass
class GenerateStats:
    prompts: int = 0
    steps: int = 0
    prompt_tokens: int = 0
    new_tokens: int = 0
    seconds: float = 0.0
    rpc_seconds: float = 0.0  # wall time inside attnserve calls (client side)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0


def deepseek_v2_yarn_mscale(config) -> float:
    """The factor by which DeepSeek's own code (and attnserve, and transformers'
    DeepseekV3Attention) multiply a DeepSeek-V2 layer's softmax scale under YaRN,
    mscale(factor, mscale_all_dim)^2, and which transformers' DeepseekV2Attention leaves out
    (kernels/model/hf_config.h); 1.0 where the two agree (not DeepSeek-V2, no YaRN, no
    mscale_all_dim). The released DeepSeek-V2 checkpoints have it (1.59 for V2-Lite's factor 40,
    mscale_all_dim 0.707), so their text through attnserve is DeepSeek's, not transformers'."""
    scaling = getattr(config, "rope_scaling", None) or {}
    if getattr(config, "model_type", "") != "deepseek_v2" or \
            scaling.get("rope_type", scaling.get("type")) != "yarn":
        return 1.0
    factor, all_dim = float(scaling.get("factor") or 1.0), float(scaling.get("mscale_all_dim") or 0)
    if not all_dim or factor <= 1:
        return 1.0
    mscale = 0.1 * all_dim * math.log(factor) + 1.0
    return mscale * mscale


def _decoder_layers(model) -> Sequence[torch.nn.Module]:
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise TypeError(f"{type(model).__name__}: no decoder .layers found")
    return layers


class RemoteModel:
    """A model whose self_attn modules are RemoteAttention (see serve_attention)."""

    def __init__(self, model, client: AttnServeClient, checkpoint: str, *, kv_dtype: str = "f32",
                 page_size: int = 0, label: str = "remote_model", one_session: bool = True,
                 decode_stream: bool = True, overlap: bool = False,
                 wire_dtype: Optional[str] = None):
        self.model = model
        self.one_session = one_session
        self.client = client
        self.checkpoint = checkpoint
        self.kv_dtype = kv_dtype
        self.page_size = page_size
        self.label = label
        # Decode steps over DecodeStream (one stream per micro-batch, one message per layer per
        # step); off, or after a server refused the stream (UNIMPLEMENTED), unary Decode calls.
        self.decode_stream = decode_stream
        # Drive the stream from the model's thread (grpc.aio on a private loop: no thread
        # handoff per message) rather than through the sync API's request-iterator thread.
        # With overlap, the helper thread's micro-batch uses the sync API's stream.
        self.stream_in_thread = True
        # Two micro-batches per step, one on a helper thread: while one's attention call is on
        # the server, the other runs its norms, MLPs and LM head here.
        self.overlap = overlap
        # Hidden states on the wire: bf16 when the model computes in bf16 or the KV pages are
        # 16-bit (the attention input is rounded to 16 bits on the server anyway as K/V), f32
        # otherwise. Outputs come back in the same dtype.
        if wire_dtype is None:
            sixteen_bit = (getattr(model, "dtype", torch.float32) == torch.bfloat16 or
                           kv_dtype in ("bf16", "f16"))
            wire_dtype = "bf16" if sixteen_bit else "f32"
        if wire_dtype not in ("f32", "bf16"):
            raise ValueError(f"wire_dtype '{wire_dtype}': expected f32 or bf16")
        self.wire_dtype = wire_dtype
        self._wire = pb.DTYPE_BF16 if wire_dtype == "bf16" else pb.DTYPE_F32
        self._layers = _decoder_layers(model)
        self._originals = [layer.self_attn for layer in self._layers]
        self._local = threading.local()  # .plan: the packed step this thread runs
        self._streams: Dict[int, object] = {}  # lane -> open (Loop)DecodeStream
        self._helper: Optional[ThreadPoolExecutor] = None  # runs micro-batch 1 with overlap
        self._rpc_lock = threading.Lock()
        self.rpc_seconds = 0.0
        self.stream_messages = 0  # layer messages answered over decode streams
        # Decode calls or stream messages (one per layer per step per micro-batch), the client's
        # wall time in them and the server's own time for them (Timing.total_ns: arrival to
        # answer), for the per-layer round trip.
        self.decode_calls = 0
        self.decode_rpc_seconds = 0.0
        self.decode_server_seconds = 0.0
        # Of that, the backend's compute (Timing.compute_ns): the layer itself, without the queue,
        # parsing or encoding.
        self.decode_compute_seconds = 0.0
        # The calling thread's CPU time in those calls (thread_time: the rows' conversion,
        # protobuf, gRPC, and the kernel's loopback send, which delivers to the server): the
        # client's own work, apart from waiting for the server or for a core.
        self.decode_client_cpu_seconds = 0.0
        self.stream_fallbacks = 0  # decode steps that fell back from the stream to unary Decode
        self.fingerprints: List[bytes] = []
        # Each decoder layer's spec as the server read it from config.json (LayerSpec).
        self.layer_specs: List[LayerSpec] = []
        self.sessions = self._configure(client)
        self.live: Dict[str, int] = {}  # request id -> tokens cached on the server
        for i, layer in enumerate(self._layers):
            layer.self_attn = RemoteAttention(self, i, self._originals[i])
        # No attention masks while served (see _ATTN_IMPLEMENTATION); close() puts it back.
        self._attn_implementation = model.config._attn_implementation
        model.config._attn_implementation = _ATTN_IMPLEMENTATION
        mscale = deepseek_v2_yarn_mscale(model.config)
        if mscale != 1.0:
            warnings.warn(f"DeepSeek-V2 with YaRN mscale_all_dim: attnserve scales the softmax by "
                          f"mscale^2 = {mscale:.4f} as DeepSeek's own code does, which "
                          "transformers' DeepseekV2Attention omits; the text will be DeepSeek's, "
                          "not that of this model's generate()", stacklevel=3)

    def _configure(self, client: AttnServeClient) -> List[str]:
        if self.one_session:
            return self._configure_model_session(client)
        sessions: List[str] = []
        fingerprints: List[bytes] = []
        specs = []
        d_model = self.model.config.hidden_size
        try:
            for i in range(len(self._layers)):
                result = client.configure(None, checkpoint=self.checkpoint, layer=i,
                                          kv_dtype=self.kv_dtype, page_size=self.page_size,
                                          label=f"{self.label}.layer{i}")
                sessions.append(result.session_id)
                fingerprints.append(result.fingerprint)
                spec = result.spec or client.get_session(result.session_id).spec
                specs.append(spec)
                if spec.d_model != d_model:
                    raise ValueError(f"layer {i}: the server's session has d_model "
                                     f"{spec.d_model}, the model {d_model}")
        except BaseException:
            for sid in sessions:
                try:
                    client.release(sid)
                except Exception:  # noqa: BLE001 - best effort on the way out
                    pass
            raise
        self.fingerprints = fingerprints
        self.layer_specs = specs
        return sessions

    def _configure_model_session(self, client: AttnServeClient) -> List[str]:
        """One model session of every layer of the checkpoint (its config.json's count)."""
        result = client.configure(None, checkpoint=self.checkpoint, per_layer=True,
                                  kv_dtype=self.kv_dtype, page_size=self.page_size,
                                  label=self.label)
        try:
            if len(result.stack) != len(self._layers):
                raise ValueError(f"the server's model session has {len(result.stack)} layers, "
                                 f"the model {len(self._layers)}")
            d_model = self.model.config.hidden_size
            if result.stack[0].d_model != d_model:
                raise ValueError(f"the server's model session has d_model "
                                 f"{result.stack[0].d_model}, the model {d_model}")
        except BaseException:
            client.release(result.session_id)
            raise
        self.fingerprints = [result.fingerprint]
        self.layer_specs = list(result.stack)
        return [result.session_id]

    # -- lifetime --

    def close(self) -> None:
        """Releases every session and puts the original attention modules back."""
        self.close_streams()
        if self._helper is not None:
            self._helper.shutdown(wait=True)
            self._helper = None
        for layer, original in zip(self._layers, self._originals):
            layer.self_attn = original
        self.model.config._attn_implementation = self._attn_implementation
        sessions, self.sessions = self.sessions, []
        for sid in sessions:
            try:
                self.client.release(sid)
            except Exception:  # noqa: BLE001 - the server may be gone already
                pass
        self.live.clear()

    def __enter__(self) -> "RemoteModel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def release(self, request_id: str) -> None:
        """Frees one prompt's KV cache in every layer's session."""
        if request_id in self.live:
            del self.live[request_id]
            for sid in self.sessions:
                self.client.release(sid, request_id)

    def move_to(self, client: AttnServeClient) -> None:
        """Moves every session and live request to the server behind `client` (same checkpoint,
        hence the same fingerprints): configures the layers there, exports each request's KV
        pages here and imports them there, then releases the sessions here. Generation continues
        on the new server as if nothing happened. Call it between steps (on_step): a model
        session refuses to export a request whose step has not run every layer. With one model
        session, one export per request carries every layer's pages; with one_session=False,
        one export per request and layer."""
        self.close_streams()  # Their messages name the old server's sessions.
        old_client, old_sessions = self.client, self.sessions
        new_sessions = self._configure(client)
        for old_sid, new_sid in zip(old_sessions, new_sessions):
            for rid in self.live:
                header, pages = old_client.export_request(old_sid, rid)
                client.import_request(new_sid, rid, header, pages)
        self.client, self.sessions = client, new_sessions
        for sid in old_sessions:
            old_client.release(sid)

    # -- one layer's attention over a packed step --

    def close_streams(self) -> None:
        """Ends the open decode streams (generate() does at its end; a later decode step opens a
        new one)."""
        streams, self._streams = self._streams, {}
        for stream in streams.values():
            try:
                stream.close()
            except AttnServeError:  # It already failed; its error went to its step.
                pass

    def _wire_rows(self, rows: torch.Tensor) -> np.ndarray:
        """rows [N, d_model] as the wire carries them: float32, or bf16 bits (uint16; PyTorch
        rounds to nearest even, as numpy_to_tensor does). A view where no conversion is due."""
        if self._wire == pb.DTYPE_BF16:
            return rows.to(torch.bfloat16).cpu().contiguous().view(torch.int16).numpy().view(
                np.uint16)
        return rows.to(torch.float32).cpu().contiguous().numpy()

    def _attend(self, layer: int, rows: torch.Tensor, plan: _Plan) -> torch.Tensor:
        # A model session: one session, the call names the layer; else the layer's own session.
        sid, index = ((self.sessions[0], layer) if self.one_session
                      else (self.sessions[layer], 0))
        start, start_cpu = time.perf_counter(), time.thread_time()
        wire = self._wire_rows(rows)
        prefill = any(s.prefill for s in plan.segments)
        if prefill:
            result = self.client.forward(
                sid, {s.request_id: wire[s.start:s.start + s.length] for s in plan.segments},
                positions={s.request_id: s.positions for s in plan.segments}, layer=index,
                dtype=self.wire_dtype)
            out = np.empty(rows.shape, dtype=np.float32)
            for s in plan.segments:
                rows_out = result.outputs[s.request_id]
                if rows_out.dtype == np.uint16:  # A client made with bf16_as="uint16".
                    rows_out = _bf16_bits_to_float(rows_out)
                out[s.start:s.start + s.length] = rows_out.reshape(s.length, rows.shape[1])
            server_ns = result.timing.total_ns
            out = torch.from_numpy(out)
        else:
            response = self._decode(sid, index, wire, plan)
            out = self._decode_outputs(response, plan, rows.shape[1])
            server_ns = response.timing.total_ns
            compute_ns = response.timing.compute_ns
        elapsed = time.perf_counter() - start
        cpu = time.thread_time() - start_cpu
        with self._rpc_lock:
            self.rpc_seconds += elapsed
            if not prefill:
                self.decode_calls += 1
                self.decode_rpc_seconds += elapsed
                self.decode_server_seconds += server_ns * 1e-9
                self.decode_compute_seconds += compute_ns * 1e-9
                self.decode_client_cpu_seconds += cpu
        return out

    def _decode(self, sid: str, index: int, wire: np.ndarray, plan: _Plan) -> pb.DecodeResponse:
        """One layer's decode message (every segment is one token at row segment.start): the
        step's message with this layer's rows, over the lane's stream or a unary Decode."""
        request = plan.decode_request
        if request is None or request.session_id != sid:
            request = pb.DecodeRequest(session_id=sid)
            for s in plan.segments:
                item = request.items.add(request_id=s.request_id, position=s.positions[0])
                item.hidden.dtype = self._wire
                item.hidden.shape.extend([1, wire.shape[1]])
            plan.decode_request, plan.decode_items = request, list(request.items)
        request.layer = index
        data = wire.tobytes()
        row_bytes = len(data) // wire.shape[0]
        for s, item in zip(plan.segments, plan.decode_items):
            item.hidden.data = data[s.start * row_bytes:(s.start + 1) * row_bytes]
        response = self._stream_exchange(plan.lane, sid, request) if self.decode_stream else None
        if response is None:
            response = self.client._call("Decode", request)
        return response

    def _decode_outputs(self, response: pb.DecodeResponse, plan: _Plan,
                        d_model: int) -> torch.Tensor:
        """The output rows [N, d_model] of a decode message, in the segments' row order."""
        results = response.results
        if len(results) != len(plan.segments):
            raise AttnServeError("Decode", "INTERNAL", f"{len(results)} results for "
                                 f"{len(plan.segments)} requests")
        if any(r.request_id != s.request_id for r, s in zip(results, plan.segments)):
            by_id = {r.request_id: r for r in results}
            results = [by_id[s.request_id] for s in plan.segments]
        for r in results:
            if r.output.dtype != self._wire:
                raise AttnServeError("Decode", "INTERNAL", f"output dtype {r.output.dtype}, "
                                     f"sent {self._wire}")
        # One copy, into a buffer PyTorch may own (a bytes object is read-only).
        data = bytearray(b"".join(r.output.data for r in results))
        if self._wire == pb.DTYPE_BF16:
            out = torch.frombuffer(data, dtype=torch.bfloat16)
        else:
            out = torch.frombuffer(data, dtype=torch.float32)
        return out.view(len(results), d_model)

    def _stream_exchange(self, lane: int, sid: str, request: pb.DecodeRequest):
        """One layer's decode message on the lane's stream (opened on first use). None when the
        server does not serve DecodeStream (UNIMPLEMENTED: the message never ran), after which
        this model decodes with unary calls. Any other failure ends the stream and is raised,
        as a failed unary call would be: whether the message ran is for GetSession to say (the
        request's next_layer), and the next decode step opens a new stream."""
        stream = self._streams.get(lane)
        if stream is None:
            # Lane 0, the caller's thread, drives its stream on the client's event loop; lane 1
            # (overlap's helper thread) uses the sync API's, since one loop runs on one thread
            # at a time. No deadline: the stream lasts the generation, longer than any one
            # call's timeout (a batch of 64 x 32 tokens took 57 s on the loaded test machine).
            stream = self.client.open_decode_stream(
                sid, dtype=self.wire_dtype, in_thread=self.stream_in_thread and lane == 0,
                timeout_s=None)
            self._streams[lane] = stream
        try:
            response = stream.exchange(request)
            with self._rpc_lock:
                self.stream_messages += 1
            return response
        except AttnServeError as error:
            self._streams.pop(lane, None)
            if error.code == "UNIMPLEMENTED":
                self.decode_stream = False
                with self._rpc_lock:
                    self.stream_fallbacks += 1
                return None
            raise

    # -- one packed step of the whole model --

    @torch.no_grad()
    def step(self, tokens: Dict[str, Sequence[int]]) -> Dict[str, torch.Tensor]:
        """Appends `tokens` (request id -> new token ids; a new id starts a request at position
        0) and returns each request's logits for its last token [vocab]. With overlap and two or
        more requests, the requests run as two micro-batches at once (see RemoteModel)."""
        items = []
        for rid, new in tokens.items():
            new = [int(t) for t in new]
            if not new:
                raise ValueError(f"request '{rid}': no tokens")
            items.append((rid, new))
        if self.overlap and len(items) >= 2:
            half = (len(items) + 1) // 2
            if self._helper is None:
                self._helper = ThreadPoolExecutor(max_workers=1,
                                                  thread_name_prefix="attnserve-microbatch")
            second = self._helper.submit(self._run_packed, items[half:], 1)
            try:
                first = self._run_packed(items[:half], 0)
            finally:
                rest = second.result()  # Waits even when the first failed: no stray thread.
            segments = first[0] + rest[0]
            logits = {**first[1], **rest[1]}
        else:
            segments, logits = self._run_packed(items, 0)
        for s in segments:
            self.live[s.request_id] = s.positions[-1] + 1
        return logits

    def _run_packed(self, items, lane: int):
        """The model's forward over `items` packed into one sequence [1, N]; returns the
        segments and each request's last-token logits."""
        segments, ids, positions = [], [], []
        for rid, new in items:
            first = self.live.get(rid, 0)
            pos = list(range(first, first + len(new)))
            segments.append(_Segment(rid, len(ids), len(new), pos,
                                     prefill=rid not in self.live or len(new) > 1))
            ids.extend(new)
            positions.extend(pos)
        device = self.model.device
        input_ids = torch.tensor([ids], dtype=torch.long, device=device)
        position_ids = torch.tensor([positions], dtype=torch.long, device=device)
        last = torch.tensor([s.start + s.length - 1 for s in segments], dtype=torch.long,
                            device=device)
        self._local.plan = _Plan(segments, lane)
        try:
            with torch.no_grad():
                logits = self.model(input_ids=input_ids, position_ids=position_ids,
                                    use_cache=False, logits_to_keep=last).logits[0]
        finally:
            self._local.plan = None
        return segments, {s.request_id: logits[i] for i, s in enumerate(segments)}

    # -- continuous batched generation --

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int = 32, *,
                 max_batch: int = 0, eos_token_id=None, do_sample: bool = False,
                 temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                 seed: Optional[int] = None,
                 on_step: Optional[Callable[["RemoteModel", int], None]] = None,
                 stats: Optional[GenerateStats] = None) -> List[List[int]]:
        """Generates up to `max_new_tokens` for every prompt (token id lists); returns the new
        tokens of each, in order. `max_batch` (0: all at once) bounds the prompts running
        together; the others wait and join as running ones finish. `eos_token_id` (default: the
        model's generation_config; an int or a list) ends a prompt after that token, as
        transformers' generate() does. `on_step(self, step)` runs between steps (e.g. to
        move_to another server)."""
        if eos_token_id is None:
            eos_token_id = getattr(getattr(self.model, "generation_config", None),
                                   "eos_token_id", None)
        eos = set([eos_token_id] if isinstance(eos_token_id, int) else (eos_token_id or []))
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        prefix = secrets.token_hex(4)
        waiting = list(range(len(prompts)))
        running: Dict[str, int] = {}  # request id -> prompt index
        outputs: List[List[int]] = [[] for _ in prompts]
        pending: Dict[str, List[int]] = {}  # request id -> tokens to send next step
        limit = max_batch if max_batch > 0 else len(prompts)
        started, rpc_before, step_index = time.perf_counter(), self.rpc_seconds, 0
        try:
            while waiting or running:
                while waiting and len(running) < limit:
                    index = waiting.pop(0)
                    rid = f"gen-{prefix}-{index}"
                    running[rid] = index
                    pending[rid] = [int(t) for t in prompts[index]]
                if on_step is not None:
                    on_step(self, step_index)
                logits = self.step(pending)
                step_index += 1
                pending = {}
                for rid, row in logits.items():
                    token = self._pick(row, do_sample, temperature, top_k, top_p, generator)
                    index = running[rid]
                    outputs[index].append(token)
                    if len(outputs[index]) >= max_new_tokens or token in eos:
                        del running[rid]
                        self.release(rid)
                    else:
                        pending[rid] = [token]
        finally:
            self.close_streams()  # One stream per generation loop.
            for rid in list(running):
                self.release(rid)
        if stats is not None:
            stats.prompts += len(prompts)
            stats.steps += step_index
            stats.prompt_tokens += sum(len(p) for p in prompts)
            stats.new_tokens += sum(len(o) for o in outputs)
            stats.seconds += time.perf_counter() - started
            stats.rpc_seconds += self.rpc_seconds - rpc_before
        return outputs

    @staticmethod
    def _pick(logits: torch.Tensor, do_sample: bool, temperature: float, top_k: int,
              top_p: float, generator: Optional[torch.Generator]) -> int:
        if not do_sample:
            return int(torch.argmax(logits))
        scores = logits.to(torch.float32) / max(temperature, 1e-6)
        if top_k > 0:
            kth = torch.topk(scores, min(top_k, scores.numel())).values[-1]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if top_p < 1.0:
            ordered, order = torch.sort(scores, descending=True)
            cumulative = torch.softmax(ordered, dim=-1).cumsum(dim=-1)
            drop = cumulative - torch.softmax(ordered, dim=-1) > top_p
            scores[order[drop]] = float("-inf")
        probs = torch.softmax(scores, dim=-1)
        return int(torch.multinomial(probs, 1, generator=generator))


def serve_attention(model, client: AttnServeClient, checkpoint: str, **options) -> RemoteModel:
    """Serves every attention layer of `model` (a loaded transformers causal LM) from attnserve:
    one model session holding every decoder layer (or, with one_session=False, one session per
    decoder layer, which move_to needs), configured from `checkpoint` (the model's checkpoint
    directory as the server names it: a path under its --checkpoint_root). Returns the
    RemoteModel (a context manager: closing it releases the sessions and restores the model).
    Options: kv_dtype ("f32" or "bf16"), page_size, label, one_session; decode_stream (default
    True: decode steps over DecodeStream, one message per layer per step; False: unary Decode);
    overlap (default False: two micro-batches per step, one's MLPs here while the other's
    attention is on the server); wire_dtype ("f32" or "bf16"; default bf16 when the model is
    bf16 or kv_dtype is 16-bit, else f32)."""
    return RemoteModel(model, client, checkpoint, **options)
