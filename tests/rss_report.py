"""Per test file: resident memory it added and the wall time it took, from a BENDC_TEST_RSS log.

    BENDC_TEST_RSS=/tmp/rss/run make test
    python tests/rss_report.py /tmp/rss/run.*        [--top N]

Each worker's log (tests/conftest.py) has one line per test: node id, VmRSS in kB after its
teardown, and (newer logs) the time then. A file's growth is the sum of the rises between
consecutive tests of one worker that belong to it; its time, the sum of the gaps (so a file's
module fixtures count to its first test). Numba never frees compiled machine code, so growth is
mostly the kernels a file compiles that no earlier file on that worker did.
"""
from __future__ import annotations

import argparse
import collections


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", nargs="+")
    parser.add_argument("--top", type=int, default=25)
    options = parser.parse_args(argv)
    growth: collections.Counter = collections.Counter()
    seconds: collections.Counter = collections.Counter()
    for path in options.logs:
        previous = None
        peak = 0
        with open(path) as log:
            rows = [line.rstrip("\n").split("\t") for line in log if line.strip()]
        for row in rows:
            name, kb = row[0].split("::")[0], int(row[1])
            stamp = float(row[2]) if len(row) > 2 else None
            if previous is not None:
                growth[name] += kb - previous[0]
                if stamp is not None and previous[1] is not None:
                    seconds[name] += stamp - previous[1]
            previous = (kb, stamp)
            peak = max(peak, kb)
        print(f"{path}: {len(rows)} tests, peak resident {peak / 2**20:.2f} GiB")
    print(f"\n{'MiB':>7} {'s':>7}  file (by resident growth)")
    for name, kb in growth.most_common(options.top):
        print(f"{kb / 1024:7.0f} {seconds[name]:7.1f}  {name}")
    if seconds:
        print(f"\n{'s':>7}  file (by time)")
        for name, value in seconds.most_common(options.top):
            print(f"{value:7.1f}  {name}")


if __name__ == "__main__":
    main()
