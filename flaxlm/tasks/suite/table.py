"""The suite's results: one row per task (task, metric, score with its 95% interval, baseline, time), printed as a
text table and written as OUTPUT_DIR/results.json and OUTPUT_DIR/results.md."""
import json
import os

HEADER = ("task", "metric", "score [95% interval]", "baseline", "time")


def cells(row):
    """The table cells of one result row (a failed task: its error in the score's cell)."""
    if "error" in row:
        score = f"failed: {row['error']}"
    else:
        score = f"{row['score']:.2f} [{row['low']:.2f}, {row['high']:.2f}]"
    baseline = "" if row.get("baseline") is None else f"{row['baseline']:.2f} ({row['baseline_name']})"
    seconds = row.get("seconds")
    time = "" if seconds is None else f"{seconds:.0f} s"
    return (row["task"], row["metric"], score, baseline, time)


def text_table(rows):
    """Columns padded to their widest cell."""
    table = [HEADER, *map(cells, rows)]
    widths = [max(len(r[i]) for r in table) for i in range(len(HEADER))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(rows, about):
    """The table in Markdown, under a line naming the model, the suite and the bootstrap."""
    def line(values):
        return "| " + " | ".join(v.replace("|", "\\|") for v in values) + " |"

    out = [f"Model `{about['model']}`, suite `{about['suite']}`; scores in percent (bits per byte: bits, lower "
           f"is better) on the validation examples, "
           f"95% interval of {about['bootstrap_resamples']} bootstrap resamples (seed {about['bootstrap_seed']}).",
           "", line(HEADER), line(["---"] * len(HEADER)), *(line(cells(r)) for r in rows)]
    if about.get("skipped"):
        out += ["", "Skipped (not for this kind of model): " + ", ".join(about["skipped"]) + "."]
    return "\n".join(out) + "\n"


def write_results(output_dir, rows, about):
    """results.json ({about..., "results": rows}) and results.md in output_dir; their paths."""
    paths = os.path.join(output_dir, "results.json"), os.path.join(output_dir, "results.md")
    with open(paths[0], "w", encoding="utf-8") as f:
        json.dump({**about, "results": rows}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    with open(paths[1], "w", encoding="utf-8") as f:
        f.write(markdown_table(rows, about))
    return paths
