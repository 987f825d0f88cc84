"""`dledger chaos --plot FILE.png`: acknowledged appends per second over the run, each fault
as a shaded window (colour by kind), each leader change as a dashed line."""

from __future__ import annotations

from tools.chaos.run import Report

COLOURS = {"kill": "tab:red", "pause": "tab:orange", "role-kill": "tab:purple", "partition": "tab:blue"}
BIN_S = 0.5


def draw(report: Report, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    acks = report.ack_times
    end = max([report.elapsed_s, *acks]) if acks else report.elapsed_s
    nbins = max(1, int(end / BIN_S) + 1)
    counts = [0] * nbins
    for t in acks:
        counts[min(nbins - 1, int(t / BIN_S))] += 1
    xs = [i * BIN_S for i in range(nbins)]
    fig, ax = plt.subplots(figsize=(11, 4.5))
    ax.plot(xs, [c / BIN_S for c in counts], color="black", linewidth=0.8)
    for f in report.faults:
        ax.axvspan(f.started_s, max(f.healed_s, f.started_s + 0.1), color=COLOURS.get(f.kind, "grey"), alpha=0.25)
    for t, leader, term in report.timeline[1:]:
        ax.axvline(t, color="grey", linestyle="--", linewidth=0.6)
        ax.text(t, ax.get_ylim()[1] * 0.97, f"{leader}/{term}", fontsize=6, rotation=90, va="top")
    kinds = sorted({f.kind for f in report.faults})
    ax.legend(handles=[Patch(color=COLOURS.get(k, "grey"), alpha=0.4, label=k) for k in kinds],
              loc="upper right", fontsize=8)
    o = report.options
    ax.set_title(f"dledger chaos: {o.nodes} nodes, seed {o.seed}, {len(report.faults)} faults: "
                 f"{'OK' if report.ok else 'FAILED'}")
    ax.set_xlabel("seconds since start")
    ax.set_ylabel("acknowledged appends / s")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
