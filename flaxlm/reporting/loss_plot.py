"""A run's loss curves as a picture: the train loss at each logging step and the eval loss at each evaluation,
against the step, drawn from the rows of its metrics.jsonl into a PNG with matplotlib's Agg backend (no display)."""

CURVES = (("train", {"linewidth": 1.2}), ("eval", {"marker": "o", "linewidth": 1.5}))  # split, line style


def loss_curves(rows):
    """{split: (steps, losses)} of the train and eval rows that carry a loss, in the order logged."""
    curves = {}
    for split, _ in CURVES:
        points = [(r["step"], r["loss"]) for r in rows if r.get("split") == split and "loss" in r]
        curves[split] = ([s for s, _ in points], [loss for _, loss in points])
    return curves


def draw_loss_curves(rows, png_path, title=None):
    """Write png_path: one line per split that has a loss (a run without evaluation gets the train line only)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(7, 4.2), dpi=100, layout="tight")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    curves = loss_curves(rows)
    for split, style in CURVES:
        steps, losses = curves[split]
        if steps:
            ax.plot(steps, losses, label=f"{split} loss", **style)
    if ax.lines:
        ax.legend()
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    if title:
        ax.set_title(title)
    fig.savefig(png_path)
