#!/usr/bin/env python3
"""Charts of the candle benchmark (`integrations/candle/examples/bench.rs`).

    python3 bench/candle_chart.py RESULTS.csv OUT_PREFIX

writes OUT_PREFIX.png and OUT_PREFIX.svg: for each element type and operation, the % of the
copy that softmax-candle and candle reach on every shape.
"""

import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(path, prefix):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    panels = [(d, op) for d in ("F32", "BF16") for op in ("softmax", "log-softmax")]
    figure, axes = plt.subplots(len(panels), 1, figsize=(12, 3.2 * len(panels)), sharex=True)
    for axis, (dtype, op) in zip(axes, panels):
        picked = [r for r in rows if r["dtype"] == dtype and r["op"] == op]
        shapes = list(dict.fromkeys(f'{r["rows"]}x{r["cols"]}' for r in picked))
        for name, colour in (("softmax-candle", "tab:blue"), ("candle", "tab:orange")):
            values = {f'{r["rows"]}x{r["cols"]}': float(r["pct_of_copy"]) for r in picked if r["impl"] == name}
            axis.plot(range(len(shapes)), [values[s] for s in shapes], "o-", color=colour, label=name)
        axis.axhline(100, color="black", linestyle="--", linewidth=1, label="copy")
        axis.set_ylabel("% of copy")
        axis.set_title(f"{dtype} {op}, H200, isolated launches")
        axis.set_xticks(range(len(shapes)))
        axis.set_xticklabels(shapes, rotation=45, ha="right", fontsize=8)
        axis.set_ylim(0, 115)
        axis.legend(loc="lower left", fontsize=8)
    figure.tight_layout()
    for ext in ("png", "svg"):
        figure.savefig(f"{prefix}.{ext}", dpi=110)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: candle_chart.py RESULTS.csv OUT_PREFIX")
    main(sys.argv[1], sys.argv[2])
