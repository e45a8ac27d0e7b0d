"""The plots' frame, shared by every profile: matplotlib off-screen, panels side by side
or stacked, each with a grid and a legend."""

from __future__ import annotations


def figure(panels: int, width: float = 6.0, height: float = 4.6, *, stacked: bool = False):
    """A matplotlib figure of `panels` side by side (or stacked), drawn off-screen:
    (figure, axes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shape = (panels, 1) if stacked else (1, panels)
    size = (width, height * panels) if stacked else (width * panels, height)
    fig, axes = plt.subplots(*shape, figsize=size, squeeze=False)
    return fig, list(axes.flat)


def save_figure(fig, path: str, title: str | None = None) -> None:
    import matplotlib.pyplot as plt

    for axis in fig.axes:
        axis.grid(True, alpha=0.3)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
