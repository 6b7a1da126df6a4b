"""Stage `kernels`: the Triton kernels' launch settings swept on this GPU at Llama-3.1-8B's
shapes; the fastest correct ones are written as a launch-config file
(engine/kernels/launch_configs.py).

Parts:
  weight-only        fp8 weights times bf16 rows (kernels/weight_only_matmul.py), the four
                     projections at one row and at 16: every candidate against bf16 `F.linear`
                     of the same shape and fp8 `_scaled_mm` (rows quantized first), in GB/s of
                     weights read against the measured copy bandwidth
  prefill-attention  one 2,048-token prompt, and 256 decodes beside a 1,792-token chunk
                     (kernels/prefill_attention.py), against torch's SDPA over the same prompt
                     laid out contiguously
  decode-attention   256 sequences at 1,000 tokens of context and one at 640, split as a
                     CUDA graph splits them (kernels/decode_attention.py), against the bytes
                     they must read over the bandwidth
Each candidate's output is checked before it is timed (weight-only: against the dequantized
matmul; attention: against the default settings' output); one that fails to compile or
differs is recorded and left out. The attention kernels' candidates are ranked by the mean
over the part's workloads of their time relative to the default settings'.

Writes <prefix>-kernels.json and launch-configs-<gpu>.json beside it: with
TOKENMILL_KERNEL_CONFIGS set to that file the engine launches with those settings; committed as
engine/kernels/configs/<gpu>.json they are the defaults on that GPU. A dry run sweeps two or
three candidates at tiny shapes in Triton's CPU interpreter.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import time
from collections.abc import Callable
from typing import Any

from tokenmill.engine.bench.gpu_suite.context import SuiteContext, status
from tokenmill.engine.bench.gpu_suite.suite import selected

PARTS = ["weight-only", "prefill-attention", "decode-attention"]

# Llama-3.1-8B's projections as [outputs, inputs], and the benchmark model's context limit.
WEIGHT_SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096),
                 "down": (4096, 14336)}
DRY_WEIGHT_SHAPES = {"qkv": (48, 256), "down": (32, 384)}
ROWS, DRY_ROWS = (1, 16), (1, 3)
HEADS, DRY_HEADS = (32, 8, 128), (4, 2, 32)  # query heads, K/V heads, head size
BLOCK_SIZE = 16
MAX_MODEL_LEN = 8192
# Seconds a part may sweep on a GPU (Triton compiles each new setting first, about a second
# or more); past them the candidates left are skipped, the ones tried still written.
PART_SECONDS = {"weight-only": 60, "prefill-attention": 35, "decode-attention": 25}

# In the order tried (a sweep cut short keeps the first): split_k needs no new compile, so the
# default tile's splits come first; then a row per program; then other tensor-core tiles.
WEIGHT_CANDIDATES = [
    *({"rowwise": False, "block_n": 16, "block_k": 256, "num_warps": 4, "num_stages": 3,
       "split_k": s} for s in (2, 4, 8)),
    *({"rowwise": True, "block_n": n, "block_k": k, "num_warps": w, "num_stages": 3,
       "split_k": s}
      for (n, k), w, s in itertools.product(((8, 512), (16, 256), (32, 128), (4, 1024)),
                                            (4, 8), (1, 2, 4, 8))),
    *({"rowwise": False, "block_n": n, "block_k": k, "num_warps": w, "num_stages": st,
       "split_k": s}
      for (n, k), w, st, s in itertools.product(((16, 512), (32, 256), (16, 128), (64, 128)),
                                                (4, 8), (3, 4), (1, 2, 4, 8))),
]
DRY_WEIGHT_CANDIDATES = [
    {"rowwise": True, "block_n": 16, "block_k": 64, "num_warps": 4, "num_stages": 3,
     "split_k": 2},
    {"rowwise": False, "block_n": 32, "block_k": 64, "num_warps": 4, "num_stages": 3,
     "split_k": 3},
]
PREFILL_CANDIDATES = [
    {"block_m": m, "block_n": n, "num_warps": w, "num_stages": s}
    for (m, n), w, s in itertools.product(((64, 64), (128, 64), (64, 32), (64, 128), (128, 32)),
                                          (4, 8), (2, 3))]
DRY_PREFILL_CANDIDATES = [{"block_m": 32, "block_n": 32, "num_warps": 4, "num_stages": 2}]
DECODE_CANDIDATES = [
    {"block_n": n, "num_warps": w, "num_stages": s}
    for n, w, s in itertools.product((32, 64, 128), (4, 8), (2, 3))]
DRY_DECODE_CANDIDATES = [{"block_n": 32, "num_warps": 4, "num_stages": 2}]


def run(ctx: SuiteContext, args: argparse.Namespace) -> int:
    if ctx.dry_run:  # read when a kernel is defined: before the kernels' modules are imported
        os.environ.setdefault("TRITON_INTERPRET", "1")
    import torch

    from tokenmill.engine.bench.bandwidth import measure_bandwidth
    from tokenmill.engine.kernels.launch_configs import device_slug

    device = torch.device(ctx.device)
    bandwidth = measure_bandwidth(ctx.device)
    status(f"device bandwidth {bandwidth.gb_per_s:.0f} GB/s")
    result: dict[str, Any] = {"device": ctx.device, "bandwidth_gb_per_s": bandwidth.gb_per_s,
                              "parts": {}, "launch_configs": {}}
    sweeps = {"weight-only": _weight_only, "prefill-attention": _prefill,
              "decode-attention": _decode}
    for part in selected(PARTS, args.only):
        status(f"kernels part {part}")
        deadline = time.monotonic() + (math.inf if ctx.dry_run else PART_SECONDS[part])
        sweep, configs = sweeps[part](ctx, device, bandwidth.gb_per_s, deadline)
        result["parts"][part] = sweep
        result["launch_configs"].update(configs)
        ctx.write("kernels", result)
        path = ctx.out_dir / f"launch-configs-{device_slug(device)}.json"
        path.write_text(json.dumps(result["launch_configs"], indent=1, sort_keys=True) + "\n")
        status(f"wrote {path}")
    return 0


# ---- weight-only matmul ------------------------------------------------------------------


def _weight_only(ctx: SuiteContext, device: Any, gb_per_s: float, deadline: float
                 ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Each candidate over every shape and row count before the next candidate, so that a
    sweep cut short by its time budget has tried the same candidates everywhere."""
    from tokenmill.engine.kernels.launch_configs import KERNEL_DEFAULTS, weight_key

    shapes = DRY_WEIGHT_SHAPES if ctx.dry_run else WEIGHT_SHAPES
    cases = [_WeightCase(ctx, device, gb_per_s, name, outputs, inner, rows)
             for (name, (outputs, inner)), rows in itertools.product(
                 shapes.items(), DRY_ROWS if ctx.dry_run else ROWS)]
    candidates = _unique([KERNEL_DEFAULTS["weight_only_matmul"],
                          *(DRY_WEIGHT_CANDIDATES if ctx.dry_run else WEIGHT_CANDIDATES)])
    tried = _sweep(candidates, deadline, lambda settings: [case.measure(settings)
                                                           for case in cases])
    runs, best = [], {}
    for case in cases:
        run = case.report()
        run["baselines"] = _weight_baselines(ctx, device, case.outputs, case.inner, case.rows,
                                             gb_per_s)
        runs.append(run)
        if run["best"] is not None:
            best[weight_key(case.rows, case.outputs, case.inner)] = run["best"]["settings"]
        _say_weight_only(run)
    return ({"runs": runs, "candidates_tried": tried, "candidates": len(candidates)},
            {"weight_only_matmul": best})


class _WeightCase:
    """One weight shape and row count: its inputs, and each candidate's result on it
    (checked against the dequantized matmul, then timed)."""

    def __init__(self, ctx: SuiteContext, device: Any, gb_per_s: float, name: str,
                 outputs: int, inner: int, rows: int):
        import torch

        from tokenmill.engine.layers import fp8_matmul

        self.ctx, self.device, self.gb_per_s = ctx, device, gb_per_s
        self.name, self.outputs, self.inner, self.rows = name, outputs, inner, rows
        # fp8 where the GPU has it; the CPU interpreter converts float16 weights as a GPU does.
        weight_dtype = fp8_matmul.FP8_DTYPE if device.type == "cuda" else torch.float16
        gen = torch.Generator(device=device).manual_seed(outputs + inner + rows)
        self.weight_bytes = outputs * inner * torch.tensor([], dtype=weight_dtype).element_size()
        self.weights = [(torch.randn(outputs, inner, device=device, generator=gen) * 0.05
                         ).to(weight_dtype)
                        for _ in range(_rotation(self.weight_bytes, device))]
        self.scale = torch.rand(outputs, device=device, generator=gen) + 0.5
        self.x = torch.randn(rows, inner, device=device, dtype=getattr(torch, ctx.dtype),
                             generator=gen)
        self.want = self.x.float() @ (self.weights[0].float() * self.scale.unsqueeze(1)).t()
        self.results: list[dict[str, Any]] = []

    def measure(self, settings: dict[str, Any]) -> None:
        import torch

        from tokenmill.engine.kernels import weight_only_matmul as kernel

        if self.rows > 1 and settings["rowwise"]:
            return  # a row per program re-reads the weights for every row

        def call(i: int) -> torch.Tensor:
            return kernel.weight_only_matmul(self.x, self.weights[i % len(self.weights)],
                                             self.scale, **settings)

        def check(out: torch.Tensor) -> None:
            torch.testing.assert_close(out.float(), self.want, rtol=2 ** -6,
                                       atol=2 ** -6 * self.want.abs().max().item())

        def rates(seconds: float) -> dict[str, float]:
            gb_per_s = self.weight_bytes / seconds / 1e9
            return {"gb_per_s": gb_per_s, "of_bandwidth": gb_per_s / self.gb_per_s}

        self.results.append(_timed(self.ctx, self.device, settings, call, check, rates))

    def report(self) -> dict[str, Any]:
        return {"shape": self.name, "outputs": self.outputs, "inner": self.inner,
                "rows": self.rows, "weight_bytes": self.weight_bytes,
                "candidates": self.results, "default_us": self.results[0].get("us"),
                "best": _fastest(self.results)}


def _weight_baselines(ctx: SuiteContext, device: Any, outputs: int, inner: int,
                      rows: int, gb_per_s: float) -> dict[str, Any]:
    """bf16 weights through F.linear (the unquantized model's matmul), and fp8 through
    `_scaled_mm` after quantizing the rows (fp8's path past the weight-only kernel)."""
    import torch

    from tokenmill.engine.layers import fp8_matmul

    dtype = getattr(torch, ctx.dtype)
    x = torch.randn(rows, inner, device=device, dtype=dtype)
    linear_s = _dense_linear_s(ctx, device, x, outputs)
    dense_bytes = outputs * inner * x.element_size()
    out: dict[str, Any] = {"dense_linear_us": linear_s * 1e6,
                           "dense_gb_per_s": dense_bytes / linear_s / 1e9,
                           "dense_of_bandwidth": dense_bytes / linear_s / 1e9 / gb_per_s,
                           "scaled_mm_us": None}
    fp8 = [(torch.randn(outputs, inner, device=device) * 0.05).to(fp8_matmul.FP8_DTYPE)
           for _ in range(_rotation(outputs * inner, device))]
    scale = torch.ones(1, outputs, device=device)

    def scaled(i: int) -> torch.Tensor:
        values, scales = fp8_matmul.quantize_rows(x)
        return torch._scaled_mm(values, fp8[i % len(fp8)].t(), scale_a=scales, scale_b=scale,
                                out_dtype=dtype)

    try:
        out["scaled_mm_us"] = _time(ctx, device, scaled) * 1e6
    except (RuntimeError, NotImplementedError) as error:  # no fp8 tensor cores
        out["scaled_mm_error"] = _short(error)
    return out


def _dense_linear_s(ctx: SuiteContext, device: Any, x: Any, outputs: int) -> float:
    import torch

    copies = _rotation(outputs * x.shape[1] * x.element_size(), device)
    dense = [torch.randn(outputs, x.shape[1], device=device, dtype=x.dtype) * 0.05
             for _ in range(copies)]
    return _time(ctx, device, lambda i: torch.nn.functional.linear(x, dense[i % copies]))


def _say_weight_only(run: dict[str, Any]) -> None:
    best, base = run["best"], run["baselines"]
    if best is None:
        status(f"weight-only {run['shape']} rows {run['rows']}: no candidate ran")
        return
    status(f"weight-only {run['shape']} rows {run['rows']}: default {run['default_us']:.1f} us, "
           f"best {best['us']:.1f} us ({best['of_bandwidth']:.0%} of bandwidth), dense linear "
           f"{base['dense_linear_us']:.1f} us; best {best['settings']}")


# ---- attention -----------------------------------------------------------------------------


def _prefill(ctx: SuiteContext, device: Any, gb_per_s: float, deadline: float
             ) -> tuple[dict[str, Any], dict[str, Any]]:
    import torch

    from tokenmill.engine.kernels import prefill_attention as kernel
    from tokenmill.engine.kernels.launch_configs import KERNEL_DEFAULTS, attention_key

    heads, kv_heads, dim = DRY_HEADS if ctx.dry_run else HEADS
    workloads = ({"prompt": ([], 40), "mixed": ([20] * 3, 24)} if ctx.dry_run else
                 {"prompt-2048": ([], 2048), "mixed-256+1792": ([600] * 256, 1792)})
    dtype = getattr(torch, ctx.dtype)
    batches = {name: _paged_batch(device, dtype, heads, kv_heads, dim, decodes, chunk)
               for name, (decodes, chunk) in workloads.items()}

    def calls(settings: dict[str, Any]) -> dict[str, Callable[[int], Any]]:
        def call(batch: dict[str, Any]) -> Callable[[int], Any]:
            return lambda i: kernel.prefill_attention(
                batch["q"], *batch["caches"][i % len(batch["caches"])], batch["tables"],
                batch["seq_lens"], batch["query_start"], dim ** -0.5, **settings)
        return {name: call(batch) for name, batch in batches.items()}

    candidates = [KERNEL_DEFAULTS["prefill_attention"],
                  *(DRY_PREFILL_CANDIDATES if ctx.dry_run else PREFILL_CANDIDATES)]
    sweep = _attention_sweep(ctx, device, candidates, calls, deadline)
    prompt_name, (_, prompt_len) = next(iter(workloads.items()))
    flops = 4 * heads * dim * prompt_len * (prompt_len + 1) / 2  # causal: half the scores
    sweep["prompt_flops"] = flops
    sweep["sdpa_us"] = _sdpa_us(ctx, device, dtype, heads, kv_heads, dim, prompt_len)
    best = sweep["best"]
    status(f"prefill-attention: default {sweep['default_us']}, best "
           f"{None if best is None else best['us']} us by workload, SDPA over the prompt "
           f"{sweep['sdpa_us']:.1f} us; best {None if best is None else best['settings']}")
    key = attention_key(batches[prompt_name]["q"], batches[prompt_name]["caches"][0][0],
                        heads // kv_heads)
    return sweep, {"prefill_attention": {} if best is None else {key: best["settings"]}}


def _decode(ctx: SuiteContext, device: Any, gb_per_s: float, deadline: float
            ) -> tuple[dict[str, Any], dict[str, Any]]:
    import torch

    from tokenmill.engine.execution.decode_graphs import graph_decode_splits
    from tokenmill.engine.kernels import decode_attention as kernel
    from tokenmill.engine.kernels.launch_configs import KERNEL_DEFAULTS, attention_key

    heads, kv_heads, dim = DRY_HEADS if ctx.dry_run else HEADS
    workloads = ({"batch4-ctx40": [40] * 4, "batch1-ctx64": [64]} if ctx.dry_run else
                 {"batch256-ctx1000": [1000] * 256, "batch1-ctx640": [640]})
    max_len = 128 if ctx.dry_run else MAX_MODEL_LEN
    dtype = getattr(torch, ctx.dtype)
    batches = {name: _paged_batch(device, dtype, heads, kv_heads, dim, contexts, 0)
               for name, contexts in workloads.items()}
    splits = {name: graph_decode_splits(len(contexts), kv_heads, max_len)
              for name, contexts in workloads.items()}

    def calls(settings: dict[str, Any]) -> dict[str, Callable[[int], Any]]:
        def call(name: str, batch: dict[str, Any]) -> Callable[[int], Any]:
            return lambda i: kernel.decode_attention(
                batch["q"], *batch["caches"][i % len(batch["caches"])], batch["tables"],
                batch["seq_lens"], max_len, dim ** -0.5, num_splits=splits[name], **settings)
        return {name: call(name, batch) for name, batch in batches.items()}

    candidates = [KERNEL_DEFAULTS["decode_attention"],
                  *(DRY_DECODE_CANDIDATES if ctx.dry_run else DECODE_CANDIDATES)]
    sweep = _attention_sweep(ctx, device, candidates, calls, deadline)
    element = torch.tensor([], dtype=dtype).element_size()
    sweep["bound_us"] = {name: sum(contexts) * kv_heads * dim * 2 * element / gb_per_s / 1e3
                         for name, contexts in workloads.items()}
    sweep["splits"] = splits
    best = sweep["best"]
    status(f"decode-attention: default {sweep['default_us']}, best "
           f"{None if best is None else best['us']} us, bound {sweep['bound_us']}; best "
           f"{None if best is None else best['settings']}")
    first = next(iter(batches.values()))
    key = attention_key(first["q"], first["caches"][0][0], heads // kv_heads)
    return sweep, {"decode_attention": {} if best is None else {key: best["settings"]}}


def _attention_sweep(ctx: SuiteContext, device: Any, candidates: list[dict[str, Any]],
                     calls: Callable[[dict[str, Any]], dict[str, Callable[[int], Any]]],
                     deadline: float) -> dict[str, Any]:
    """Every candidate over every workload, checked against the first's (the defaults')
    output; ranked by the mean over workloads of its time over the defaults' time."""
    import torch

    reference = {name: call(0).float() for name, call in calls(candidates[0]).items()}
    results = []

    def measure(settings: dict[str, Any]) -> None:
        entry: dict[str, Any] = {"settings": settings, "us": {}}
        try:
            for name, call in calls(settings).items():
                want = reference[name]
                torch.testing.assert_close(call(0).float(), want, rtol=2e-2, atol=2e-2)
                entry["us"][name] = _time(ctx, device, call) * 1e6
        except Exception as error:  # noqa: BLE001 - a compile failure or a wrong result
            entry["error"] = _short(error)
        results.append(entry)

    candidates = _unique(candidates)
    tried = _sweep(candidates, deadline, measure)
    default = results[0]["us"] if "error" not in results[0] else None
    ranked = [r for r in results if "error" not in r]
    if default:
        for entry in ranked:
            entry["relative"] = sum(entry["us"][n] / default[n] for n in default) / len(default)
    best = min(ranked, key=lambda r: r.get("relative", 0.0)) if ranked and default else None
    return {"candidates": results, "default_us": default, "best": best,
            "candidates_tried": tried, "candidates_listed": len(candidates)}


def _paged_batch(device: Any, dtype: Any, heads: int, kv_heads: int, dim: int,
                 decodes: list[int], chunk: int) -> dict[str, Any]:
    """Decoding sequences at these context lengths (one query each), then one prompt chunk
    of `chunk` tokens with nothing before it; their K/V in a paged cache whose blocks are
    shuffled, as a pool in use hands them out; the caches rotated past the L2."""
    import torch

    contexts = [*decodes, *([chunk] if chunk else [])]
    queries = [*([1] * len(decodes)), *([chunk] if chunk else [])]
    per_seq = [-(-n // BLOCK_SIZE) for n in contexts]
    num_blocks = sum(per_seq)
    width = max(per_seq)
    order = torch.randperm(num_blocks, device=device)
    tables = torch.zeros(len(contexts), width, dtype=torch.long, device=device)
    start = 0
    for i, count in enumerate(per_seq):
        tables[i, :count] = order[start:start + count]
        start += count
    element = torch.tensor([], dtype=dtype).element_size()
    cache_bytes = 2 * num_blocks * BLOCK_SIZE * kv_heads * dim * element
    caches = [tuple(torch.randn(num_blocks, BLOCK_SIZE, kv_heads, dim, device=device,
                                dtype=dtype) for _ in range(2))
              for _ in range(_rotation(cache_bytes, device))]
    query_start = torch.tensor([0, *itertools.accumulate(queries)], device=device)
    return {"q": torch.randn(sum(queries), heads, dim, device=device, dtype=dtype),
            "caches": caches, "tables": tables,
            "seq_lens": torch.tensor(contexts, device=device), "query_start": query_start}


def _sdpa_us(ctx: SuiteContext, device: Any, dtype: Any, heads: int, kv_heads: int, dim: int,
             length: int) -> float:
    """torch's SDPA (FlashAttention on a GPU) over one causal prompt of `length` tokens laid
    out contiguously: what the paged kernel's prompt workload is set against."""
    import torch

    q = torch.randn(1, heads, length, dim, device=device, dtype=dtype)
    k, v = (torch.randn(1, kv_heads, length, dim, device=device, dtype=dtype) for _ in range(2))
    return _time(ctx, device, lambda i: torch.nn.functional.scaled_dot_product_attention(
        q, k, v, is_causal=True, enable_gqa=True)) * 1e6


# ---- shared --------------------------------------------------------------------------------


def _sweep(candidates: list[dict[str, Any]], deadline: float,
           measure: Callable[[dict[str, Any]], Any]) -> int:
    """Measure candidates in order until the time budget is spent (the first, the defaults,
    always); return how many were measured."""
    for tried, settings in enumerate(candidates):
        if tried and time.monotonic() > deadline:
            status(f"time budget spent: {len(candidates) - tried} of {len(candidates)} "
                   "candidates left out")
            return tried
        measure(settings)
    return len(candidates)


def _timed(ctx: SuiteContext, device: Any, settings: dict[str, Any],
           call: Callable[[int], Any], check: Callable[[Any], None],
           rates: Callable[[float], dict[str, float]]) -> dict[str, Any]:
    try:
        check(call(0))
        seconds = _time(ctx, device, call)
    except Exception as error:  # noqa: BLE001 - a compile failure or a wrong result
        return {"settings": settings, "error": _short(error)}
    return {"settings": settings, "us": seconds * 1e6, **rates(seconds)}


def _time(ctx: SuiteContext, device: Any, call: Callable[[int], Any]) -> float:
    from tokenmill.engine.bench.gpu_suite.kernel_timing import time_call

    return time_call(call, device, calls=2 if ctx.dry_run else 20,
                     repeats=1 if ctx.dry_run else 3)


def _rotation(bytes_per_copy: int, device: Any) -> int:
    from tokenmill.engine.bench.gpu_suite.kernel_timing import rotation

    return rotation(bytes_per_copy, device.type == "cuda")


def _fastest(results: list[dict[str, Any]]) -> dict[str, Any] | None:
    timed = [r for r in results if "us" in r and math.isfinite(r["us"])]
    return min(timed, key=lambda r: r["us"]) if timed else None


def _unique(candidates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The candidates in order, each once (the defaults are also among the grid)."""
    seen, out = set(), []
    for settings in candidates:
        key = json.dumps(settings, sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(dict(settings))
    return out


def _short(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}"
    return text if len(text) <= 300 else text[:297] + "..."
