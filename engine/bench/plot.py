"""An optional PNG of a benchmark summary. matplotlib is not a dependency: without it, say so."""

from __future__ import annotations

from typing import Any


def write_plot(path: str, summary: dict[str, Any], title: str) -> bool:
    """Bars of output tok/s (tokenmill, HF per batch size), and with a quantization comparison
    each mode's throughput and KV capacity relative to unquantized. False if matplotlib is
    missing."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = ["tokenmill"] + [f"HF batch {size}" for size in summary["hf"]]
    values = [summary["tokenmill"]["output_tokens_per_s"]] + [
        h["output_tokens_per_s"] for h in summary["hf"].values()
    ]
    quantization = summary.get("quantization")
    fig, axes = plt.subplots(1, 2 if quantization else 1, figsize=(13 if quantization else 6, 3.5),
                             squeeze=False)
    ax = axes[0][0]
    bars = ax.bar(names, values, color=["tab:blue"] + ["tab:gray"] * (len(names) - 1))
    ax.bar_label(bars, fmt="%.0f")
    ax.set_ylabel("output tokens/s")
    ax.set_title(title)
    if quantization:
        _quantization_panel(axes[0][1], quantization["modes"])
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _quantization_panel(ax: Any, modes: dict[str, dict[str, Any]]) -> None:
    names = list(modes)
    positions = range(len(names))
    width = 0.4
    for offset, key, label in ((-width / 2, "throughput_ratio", "output tok/s"),
                               (width / 2, "kv_capacity_ratio", "KV tokens held")):
        bars = ax.bar([p + offset for p in positions], [modes[n][key] for n in names], width,
                      label=label)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.axhline(1.0, color="black", linewidth=0.5)
    ax.set_xticks(list(positions), names, rotation=20, fontsize=8)
    ax.set_ylabel("relative to unquantized")
    ax.set_title("quantization modes at the same KV budget")
    ax.legend(fontsize=8)
