"""Unmodified Hugging Face decoder layers: eager, torch.compile, max-autotune and the superopt backend on one GPU.

Layers are built from config objects with random weights (``tests/frontend_models.py``; no downloads) at real
shapes, bf16, batch 1, prefill:

* ``llama3-8b``: hidden 4096, 32 heads, 8 KV heads, head 128, FFN 14336, 2048 tokens (sdpa: causal, GQA);
* ``gpt2-medium``: hidden 1024, 16 heads, 1024 tokens (fused c_attn split, LayerNorm, GELU-tanh);
* ``gemma2-2b``: hidden 2304, 8 heads, 4 KV heads, head 256, FFN 9216, 2048 tokens (eager attention:
  softcapping, repeat_kv, a sliding-window mask of 4096 as an additive tensor);
* ``llama3-8b-padded``: the Llama prefill layer given its prompt's first 64 tokens as padding (a boolean
  ``[1, 1, t, t]`` attention mask: causal and not padding), so 64 query rows see no key and are 0 in SDPA;
  the boolean-mask form of attention (``torchops.MASKED_SCORE``), timed and checked at the real shape;
* ``llama3-8b-decode``: the Llama layer's decode step: one query token, a ``DynamicCache`` holding 2047
  past keys and values (seeded random; the same ones at every timed call, so each call is one step at KV
  length 2048, the cache append included for every variant).

Every variant runs under ``torch.no_grad()`` and is timed alike (``run.timing.side_by_side_us``: CUDA-graph
replay when all variants can be captured, interleaved rounds, median of ``--rounds`` >= 5). Outputs are
compared with the float32 eager layer (max error over the largest value). One JSON line per layer and
variant goes to ``--out``, with the superopt backend's region table (ops, kernels, modelled us, decision,
reason) and the command that made it. On the GPU the backend's first call times every region against
inductor's code for the same ops and keeps the faster (``pyrunner.frontend.decide``): the table's decision
column says which and the reason gives both times; decisions are cached under ``$SUPEROPT_CACHE_DIR``.

On the GPU machine::

    SCRIPT=benchmarks/hf_layers.py TOTAL_S=560 bash benchmarks/gpu_run.sh

``--small`` is the CPU smoke test of the script itself: tiny layers, the backend's no-GPU path (regions
planned in bf16 and CPU-checked, PyTorch runs the layer), no inductor, wall-clock times only.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "tests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

LAYERS = {
    "llama3-8b": ("llama", {"seq": 2048, "hidden": 4096, "heads": 32, "kv_heads": 8, "head_dim": 128,
                            "ffn": 14336}),
    "llama3-8b-decode": ("llama", {"seq": 2047, "hidden": 4096, "heads": 32, "kv_heads": 8, "head_dim": 128,
                                   "ffn": 14336}),
    "llama3-8b-padded": ("llama", {"seq": 2048, "hidden": 4096, "heads": 32, "kv_heads": 8, "head_dim": 128,
                                   "ffn": 14336}),
    "gpt2-medium": ("gpt2", {"seq": 1024, "hidden": 1024, "heads": 16}),
    "gemma2-2b": ("gemma2", {"seq": 2048, "hidden": 2304, "heads": 8, "kv_heads": 4, "head_dim": 256,
                             "ffn": 9216, "window": 4096}),
}
PADDED = {"llama3-8b-padded": 64}
"""Layers given a boolean attention mask whose first N keys are padding (N query rows keep no key)."""
DECODE = {"llama3-8b-decode"}
"""Layers timed as one decode step after ``seq`` cached tokens."""
SMALL = {
    "llama3-8b": {"seq": 32, "hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 16, "ffn": 128},
    "gpt2-medium": {"seq": 32, "hidden": 64, "heads": 4},
    "gemma2-2b": {"seq": 32, "hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 16, "ffn": 128, "window": 16},
    "llama3-8b-padded": {"seq": 32, "hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 16, "ffn": 128},
    "llama3-8b-decode": {"seq": 31, "hidden": 64, "heads": 4, "kv_heads": 2, "head_dim": 16, "ffn": 128},
}
BOUND = 3e-2
"""bf16 through a layer against the float32 eager layer (normalised max error)."""


class FreshCache:
    """A ``DynamicCache`` made anew at every call from the same past keys and values, so a decode step timed
    again and again runs at one KV length (the layer appends its token to a fresh cache each time)."""

    def __init__(self, cfg, keys, values) -> None:
        self.cfg, self.keys, self.values = cfg, keys, values

    def make(self):
        from transformers.cache_utils import DynamicCache

        return DynamicCache(ddp_cache_data=[(self.keys, self.values)])

    def to(self, **kw) -> FreshCache:
        return FreshCache(self.cfg, self.keys.to(**kw), self.values.to(**kw))


def call(f, args: tuple, kwargs: dict):
    """``f(*args, **kwargs)`` with each ``FreshCache`` made into a new cache."""
    return f(*args, **{k: v.make() if isinstance(v, FreshCache) else v for k, v in kwargs.items()})


def decode_inputs(m, args: tuple) -> tuple[tuple, dict]:
    """One decode step after ``args``' tokens: seeded random past keys and values for them (a prefill's
    values would time the same), one new token, its rotary tables at the next position."""
    import torch
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    (x,) = args
    cfg = m.self_attn.config
    g = torch.Generator().manual_seed(11)
    kv = (1, cfg.num_key_value_heads, x.shape[1], cfg.head_dim)
    keys, values = torch.randn(*kv, generator=g), torch.randn(*kv, generator=g)
    x1 = torch.randn(1, 1, x.shape[-1], generator=g)
    return (x1,), {"attention_mask": None, "use_cache": True,
                   "position_embeddings": LlamaRotaryEmbedding(cfg)(x1, torch.tensor([[x.shape[1]]])),
                   "past_key_values": FreshCache(cfg, keys, values)}


def build(name: str, small: bool, device: str, dtype):
    """The layer, its positional and keyword inputs, on ``device`` in ``dtype`` (masks and rotary tables too)."""
    import torch
    from frontend_models import HF_BLOCKS

    kind, shape = LAYERS[name]
    m, args, kwargs = HF_BLOCKS[kind](**(SMALL[name] if small else shape))
    if name in DECODE:
        args, kwargs = decode_inputs(m, args)
    if name in PADDED:
        t = args[0].shape[1]
        pad = min(PADDED[name], t // 2)
        q, k = torch.arange(t)[:, None], torch.arange(t)[None, :]
        kwargs = {**kwargs, "attention_mask": ((k <= q) & (k >= pad))[None, None]}

    def move(v):
        if isinstance(v, torch.Tensor):
            return v.to(device=device, dtype=dtype if v.is_floating_point() else v.dtype)
        if isinstance(v, FreshCache):
            return v.to(device=device, dtype=dtype)
        if isinstance(v, tuple):
            return tuple(move(x) for x in v)
        return v

    return (m.to(device=device, dtype=dtype).requires_grad_(False), tuple(move(a) for a in args),
            {k: move(v) for k, v in kwargs.items()})


def first(y):
    return y[0] if isinstance(y, tuple) else y


def err(y, ref) -> float:
    return float((first(y).double() - ref).abs().max() / ref.abs().max())


def variants(m, small: bool, wanted: list[str]) -> dict:
    """Name -> compiled callable (compiled lazily on first call), only those in ``wanted``."""
    import torch

    import pyrunner.frontend  # noqa: F401 - registers the backend

    out = {"eager": m}
    if not small:
        out["torch.compile"] = torch.compile(m)
        if "max-autotune" in wanted:
            # without its own CUDA graphs, so every variant is replayed from one graph of ours alike
            out["max-autotune"] = torch.compile(m, mode="max-autotune-no-cudagraphs")
    opts = {"fallback": "eager" if small else "inductor"}
    if small:
        opts["dtype"] = "bfloat16"  # the smoke test's float32 layer, planned as the GPU run would
    out["superopt"] = torch.compile(m, backend="superopt", options=opts, dynamic=False)
    return out


def run_layer(name: str, args: argparse.Namespace, out) -> None:
    import torch

    from pyrunner.frontend.backend import LAST_REPORTS
    from pyrunner.run.timing import device_name, side_by_side_us

    device = "cpu" if args.small else "cuda"
    dtype = torch.float32 if args.small else torch.bfloat16
    m, a, kw = build(name, args.small, device, dtype)
    with torch.no_grad():
        m32 = build(name, args.small, device, torch.float32)[0]
        a32 = tuple(x.float() if isinstance(x, torch.Tensor) else x for x in a)
        kw32 = {k: (tuple(t.float() for t in v) if isinstance(v, tuple) else
                    v if isinstance(v, torch.Tensor) and not v.is_floating_point() else  # a boolean mask
                    v.to(dtype=torch.float32) if isinstance(v, (torch.Tensor, FreshCache)) else v)
                for k, v in kw.items()}
        ref = first(call(m32, a32, kw32)).double()
        del m32
        fns, errors, notes = {}, {}, {}
        for vname, f in variants(m, args.small, args.variants).items():
            torch._dynamo.reset() if vname != "eager" else None
            t0 = time.perf_counter()
            try:
                y = call(f, a, kw)
                errors[vname] = err(y, ref)
                notes[vname] = f"first call {time.perf_counter() - t0:.1f} s"
                fns[vname] = (lambda f=f: call(f, a, kw))
            except Exception as e:  # noqa: BLE001 - one variant failing is a row, not the end of the run
                traceback.print_exc()
                notes[vname] = f"FAIL {type(e).__name__}: {' '.join(str(e).split())[:300]}"
            if vname == "superopt" and LAST_REPORTS:
                table = str(LAST_REPORTS[-1])
                print(f"[{name}] superopt regions:\n{table}", flush=True)
                notes["superopt_table"] = table
                notes["flop_share"] = LAST_REPORTS[-1].flop_share
        times, method, per_round = side_by_side_us(fns, rounds=args.rounds)
    base = times.get("torch.compile")
    for vname in fns:
        rec = {"layer": name, "variant": vname, "us": times.get(vname), "method": method.get(vname),
               "rounds_us": per_round.get(vname), "err_vs_fp32": errors.get(vname), "bound": BOUND,
               "vs_torch_compile": (base / times[vname]) if base and times.get(vname) else None,
               "note": notes.get(vname), "device": device_name() if not args.small else "cpu",
               "small": args.small, "command": " ".join(sys.argv)}
        if vname == "superopt":
            rec["regions"] = notes.get("superopt_table")
            rec["flop_share"] = notes.get("flop_share")
        out.write(json.dumps(rec) + "\n")
        out.flush()
        us = times.get(vname)
        print(f"[{name}] {vname:14s} {us if us is None else f'{us:10.1f} us'}  err {errors.get(vname)}  "
              f"{'' if not base or not us else f'{base / us:.2f}x torch.compile'}  {notes.get(vname)}",
              flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", nargs="*", default=list(LAYERS), choices=list(LAYERS))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "hf-layers.jsonl"),
                    help="a .jsonl file to append to, or a folder (then FOLDER/hf-layers.jsonl)")
    ap.add_argument("--budget-s", type=float, default=0.0,
                    help="start no new layer that would end past this many seconds, judged by the longest "
                         "layer so far (0: no limit); gpu_run.sh passes it")
    ap.add_argument("--variants", nargs="*", default=["max-autotune"], choices=["max-autotune"],
                    help="optional variants beside eager, torch.compile and superopt (none: --variants)")
    ap.add_argument("--small", action="store_true", help="CPU smoke test of the script (tiny layers, no timing "
                                                         "that means anything)")
    args = ap.parse_args()
    if not args.small:
        import torch

        if not torch.cuda.is_available():
            print("hf_layers: no CUDA GPU here; use --small for the CPU smoke test", file=sys.stderr)
            return 2
    out_path = Path(args.out)
    if out_path.suffix != ".jsonl":
        out_path = out_path / "hf-layers.jsonl"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    longest = 0.0
    # A layer with max-autotune compiles for minutes (Gemma2: 165 s on an H100, run 140), so "past the
    # budget" is judged before a layer starts, by the longest one so far: run 140 started its fourth
    # layer inside its budget, ran past the tool's 600 s limit and was killed with nothing of it written.
    with open(out_path, "a") as out:
        for name in args.layers:
            elapsed = time.monotonic() - start
            if args.budget_s and elapsed + longest > args.budget_s:
                print(f"[{name}] SKIPPED: {elapsed:.0f} s spent and the longest layer took {longest:.0f} s, "
                      f"past the {args.budget_s:.0f} s budget", flush=True)
                continue
            try:
                run_layer(name, args, out)
            except Exception:  # noqa: BLE001 - the next layer still runs
                traceback.print_exc()
            longest = max(longest, time.monotonic() - start - elapsed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
