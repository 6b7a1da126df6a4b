"""Model loading against the disk: the raw read bandwidth of the model's safetensors files and
the engine's load of the same files (build_model, as at start-up), measured side by side in
one run, each repeat reading raw then loading. `cold` drops the files from the page cache
before every read (posix_fadvise DONTNEED: clean pages, no root needed); `warm` reads them
from the page cache. Also measured: the raw read into freshly allocated memory (what a load
pays on top of the disk: first touch of the pages the weights live in) and the peak host
memory each load adds. With --s3 the files are uploaded to moto's S3 server on loopback and
the model is loaded from s3:// into an empty download directory: download, then load.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import tempfile
import time
from typing import Any

CHUNK = 16 << 20
BUCKET = "bench-models"
PREFIX = "load"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True,
                        help="A local safetensors model directory, or a hf:// or s3:// URI "
                             "(downloaded into --download-dir first).")
    parser.add_argument("--download-dir", default=None, help="Where a URI model is fetched.")
    parser.add_argument("--device", default="cpu", help="Where the weights go (cpu, cuda).")
    parser.add_argument("--dtype", default="auto",
                        help="Weights' dtype in memory; auto keeps the checkpoint's.")
    parser.add_argument("--workers", default="1,2,4",
                        help="Comma-separated counts of tensors read at once to compare.")
    parser.add_argument("--modes", default="cold,warm", help="cold, warm or both.")
    parser.add_argument("--repeats", type=int, default=3, help="Measurements of each kind.")
    parser.add_argument("--s3", action="store_true",
                        help="Also load the model from s3:// on moto's loopback server.")
    parser.add_argument("--json", default=None, help="Write the raw results here.")


def run(args: argparse.Namespace) -> int:
    from tokenmill.engine.bench.report import command_line, git_revision, machine_info, write_json
    from tokenmill.engine.models.source import resolve_model

    source = resolve_model(args.model, args.download_dir)
    workers = [int(w) for w in args.workers.split(",")]
    modes = args.modes.split(",")
    files = _files(source.directory)
    runs = [run for mode in modes for run in _local_runs(source, files, mode, workers, args)]
    payload: dict[str, Any] = {
        "command": command_line(), "git": git_revision(), "machine": machine_info(args.device),
        "model": args.model, "files": len(files),
        "file_bytes": sum(os.path.getsize(f) for f in files), "runs": runs,
        "summary": {mode: _summary([r for r in runs if r["mode"] == mode], workers)
                    for mode in modes}}
    if args.s3:
        payload["s3"] = _s3_runs(source, files, args)
        payload["summary"]["s3"] = _s3_summary(payload["s3"], payload["summary"])
    payload["machine"]["load_average_after"] = list(os.getloadavg())
    print(format_summary(payload["summary"]))
    if args.json:
        write_json(args.json, payload)
        print(f"raw results: {args.json}")
    return 0


def _files(directory: str) -> list[str]:
    from tokenmill.engine.models.safetensors_files import checkpoint_files

    return checkpoint_files(directory)


def drop_page_cache(files: list[str]) -> None:
    """Drop the files' pages from the page cache (no root needed), so the next read comes from
    the disk. Dirty pages are not dropped, so the files are synced first: a checkpoint written
    just before is cached and dirty."""
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def raw_read(files: list[str], fresh: bool = False) -> tuple[float, int]:
    """Seconds to read every file sequentially in 16 MiB reads: into one reused buffer, or
    (`fresh`) into newly allocated memory of the files' size, as a load must."""
    import torch

    buffer = memoryview(bytearray(CHUNK))
    total = 0
    start = time.perf_counter()
    for path in files:
        size = os.path.getsize(path)
        if fresh:
            dest = memoryview(torch.empty(size, dtype=torch.uint8).numpy())
        with open(path, "rb", buffering=0) as f:
            done = 0
            while done < size:
                target = dest[done:done + CHUNK] if fresh else buffer
                n = f.readinto(target)
                if not n:
                    break
                done += n
        total += done
    return time.perf_counter() - start, total


def _peak_reset() -> int | None:
    """Restart the peak resident memory count; the current resident bytes (None off Linux)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _status("VmRSS")
    except OSError:
        return None


def _status(key: str) -> int | None:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    return None


def _load(source: Any, device: str, dtype: str, workers: int) -> dict[str, Any]:
    import torch

    from tokenmill.engine.models.loader import build_model, load_config

    config = load_config(source)
    torch_dtype = _dtype(source, dtype)
    before = _peak_reset()
    model = build_model(config, source, 64, torch_dtype, torch.device(device),
                        show_progress=False, workers=workers)
    peak = _status("VmHWM") if before is not None else None
    report = model.load_report
    del model
    gc.collect()
    return {"seconds": report.seconds, "bytes": report.bytes,
            "gb_per_s": report.gb_per_s, "dtype": str(torch_dtype).removeprefix("torch."),
            "peak_rss_added_bytes": None if before is None else peak - before}


def _dtype(source: Any, dtype: str) -> Any:
    import torch

    from tokenmill.engine.models.safetensors_files import read_header

    if dtype != "auto":
        return getattr(torch, dtype)
    return read_header(_files(source.directory)[0])[0].dtype


def _local_runs(source: Any, files: list[str], mode: str, workers: list[int],
                args: argparse.Namespace) -> list[dict[str, Any]]:
    runs = []
    for repeat in range(args.repeats):
        for kind in ["raw", "raw-fresh", *(f"load-{w}" for w in workers)]:
            if mode == "cold":
                drop_page_cache(files)
            elif repeat == 0 and kind == "raw":
                raw_read(files)  # fill the page cache
            if kind.startswith("raw"):
                seconds, nbytes = raw_read(files, fresh=kind == "raw-fresh")
                run = {"seconds": seconds, "bytes": nbytes, "gb_per_s": nbytes / 1e9 / seconds}
            else:
                run = {"workers": int(kind.split("-")[1]),
                       **_load(source, args.device, args.dtype, int(kind.split("-")[1]))}
            runs.append({"mode": mode, "kind": kind, "repeat": repeat, **run})
    return runs


def _median(runs: list[dict[str, Any]], kind: str, key: str = "gb_per_s") -> float:
    return statistics.median(r[key] for r in runs if r["kind"] == kind)


def _summary(runs: list[dict[str, Any]], workers: list[int]) -> dict[str, Any]:
    raw = _median(runs, "raw")
    out: dict[str, Any] = {"raw_gb_per_s": raw, "raw_fresh_gb_per_s": _median(runs, "raw-fresh")}
    for w in workers:
        load = _median(runs, f"load-{w}")
        peaks = [r["peak_rss_added_bytes"] for r in runs if r["kind"] == f"load-{w}"]
        out[f"load_{w}"] = {
            "gb_per_s": load, "seconds": _median(runs, f"load-{w}", "seconds"),
            "ratio_to_raw": load / raw,
            "ratio_to_raw_fresh": load / out["raw_fresh_gb_per_s"],
            "peak_rss_added_bytes": None if None in peaks else max(peaks)}
    return out


def _s3_runs(source: Any, files: list[str], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Upload the model's directory to moto's server, then per repeat: fetch into an empty
    download directory (timed as the engine times it) and load from there."""
    from tokenmill.engine.bench.s3_fetch import _boto, moto_environment
    from tokenmill.engine.models.source import resolve_model

    runs = []
    with moto_environment() as endpoint, tempfile.TemporaryDirectory() as tmp:
        client = _boto(endpoint)
        client.create_bucket(Bucket=BUCKET)
        for name in os.listdir(source.directory):
            path = os.path.join(source.directory, name)
            if os.path.isfile(path):
                client.upload_file(path, BUCKET, f"{PREFIX}/{name}")
        workers = int(args.workers.split(",")[-1])
        for repeat in range(args.repeats):
            local = resolve_model(f"s3://{BUCKET}/{PREFIX}", os.path.join(tmp, str(repeat)))
            load = _load(local, args.device, args.dtype, workers)
            runs.append({"repeat": repeat, "download_seconds": local.download_seconds,
                         "download_gb_per_s": sum(os.path.getsize(f) for f in files)
                         / 1e9 / local.download_seconds,
                         "workers": workers, **{f"load_{k}": v for k, v in load.items()}})
    return runs


def _s3_summary(runs: list[dict[str, Any]], summary: dict[str, Any]) -> dict[str, Any]:
    download = statistics.median(r["download_seconds"] for r in runs)
    load = statistics.median(r["load_seconds"] for r in runs)
    out = {"download_seconds": download, "load_seconds": load, "total_seconds": download + load,
           "download_gb_per_s": statistics.median(r["download_gb_per_s"] for r in runs)}
    if "cold" in summary:
        out["download_ratio_to_cold_raw"] = out["download_gb_per_s"] / summary["cold"][
            "raw_gb_per_s"]
    return out


def format_summary(summary: dict[str, Any]) -> str:
    lines = []
    for mode, s in summary.items():
        if mode == "s3":
            lines.append(f"s3 (moto, loopback): download {s['download_seconds']:.2f} s "
                         f"({s['download_gb_per_s']:.2f} GB/s), then load "
                         f"{s['load_seconds']:.2f} s")
            continue
        lines.append(f"{mode}: raw read {s['raw_gb_per_s']:.2f} GB/s, into fresh memory "
                     f"{s['raw_fresh_gb_per_s']:.2f} GB/s")
        for key, load in s.items():
            if key.startswith("load_"):
                lines.append(f"  {key.replace('_', ' ')} workers: {load['gb_per_s']:.2f} GB/s "
                             f"({load['seconds']:.2f} s), {load['ratio_to_raw']:.2f} of raw, "
                             f"{load['ratio_to_raw_fresh']:.2f} of raw into fresh memory")
    return "\n".join(lines)
