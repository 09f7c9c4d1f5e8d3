"""A grid run's CSV (`host bench --grid`), as the grid's scripts read it: the peers' names and
the isolated rows."""

import csv
import math

PEERS = ("torch", "torch_unfused", "triton", "quack", "flashinfer")


def read(path):
    """{variant: {(rows, cols): (median_ms, pct_of_copy)}} of the isolated rows (a % of copy the
    row lacks reads NaN), and the run's dtype."""
    runs, dtype = {}, None
    with open(path) as f:
        for row in csv.DictReader(f):
            if row["timing"] != "isolated":
                continue
            try:
                ms = float(row["median_ms"])
            except ValueError:
                continue
            try:
                pct = float(row["pct_of_copy"])
            except ValueError:
                pct = math.nan
            runs.setdefault(row["variant"], {})[(int(row["rows"]), int(row["cols"]))] = (ms, pct)
            dtype = row["dtype"]
    return runs, dtype
