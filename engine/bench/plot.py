"""An optional PNG of a benchmark summary. matplotlib is not a dependency: without it, say so."""

from __future__ import annotations

from typing import Any


def write_plot(path: str, summary: dict[str, Any], title: str) -> bool:
    """Bars of output tok/s (tokenmill, HF per batch size). False if matplotlib is missing."""
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
    fig, ax = plt.subplots(figsize=(6, 3.5))
    bars = ax.bar(names, values, color=["tab:blue"] + ["tab:gray"] * (len(names) - 1))
    ax.bar_label(bars, fmt="%.0f")
    ax.set_ylabel("output tokens/s")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
