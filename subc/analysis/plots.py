"""PNG plots of ``subc analyze`` (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path


def pyplot():
    """matplotlib's ``pyplot`` with the Agg backend (imported at the first call: about 1 s)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def deliveries_per_subscriber(per_port: dict[int, int], path: Path, title: str = "") -> None:
    """Bar chart: messages delivered per subscriber (port) -> ``path`` (PNG)."""
    plt = pyplot()
    ports = sorted(per_port)
    fig, ax = plt.subplots(figsize=(max(6, min(24, 0.25 * len(ports) + 4)), 4))
    ax.bar([str(p) for p in ports], [per_port[p] for p in ports], color="#3b6ea5")
    ax.set_xlabel("subscriber (port)")
    ax.set_ylabel("messages delivered")
    ax.set_title(title or "Deliveries per subscriber")
    if len(ports) > 40:
        ax.set_xticks(range(0, len(ports), max(1, len(ports) // 20)))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def messages_per_second(seconds: list[int], counts: list[int], path: Path, title: str = "") -> None:
    """Line plot: messages per second against the time of day (``seconds`` since midnight) -> ``path``."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 4))
    ax.plot([s / 3600 for s in seconds], counts, lw=0.6, color="#3b6ea5")
    ax.set_xlabel("time of day (hours since midnight)")
    ax.set_ylabel("messages per second")
    ax.set_title(title or "Messages per second over the trading day")
    ax.set_xlim(0, 24)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
