#!/usr/bin/env python3
"""Turns compute_test's JSON reports (one per run) into the sweep's tables: medians and
spreads of the figures each test recorded, and how many runs passed."""
import json
import re
import statistics
import sys
from collections import defaultdict

SKIP = {"name", "status", "result", "time", "timestamp", "classname", "file", "line",
        "value_param", "type_param", "failures"}


def load(paths):
    cases = defaultdict(lambda: {"figures": defaultdict(list), "passed": 0, "runs": 0})
    for path in paths:
        with open(path) as handle:
            report = json.load(handle)
        for suite in report["testsuites"]:
            for test in suite["testsuite"]:
                case = cases[f"{suite['name']}.{test['name']}"]
                case["param"] = test.get("value_param", "")
                case["runs"] += 1
                case["passed"] += 0 if test.get("failures") else 1
                for key, value in test.items():
                    if key not in SKIP:
                        case["figures"][key].append(float(value))
    return cases


def label(name, case):
    """'Compute/ComputeShare.Test/7' and its parameter as people read them."""
    test = name.split(".", 1)[1].split("/")[0]
    param = re.sub(r'0x[0-9a-f]+ pointing to "([^"]*)"', r"\1", case["param"])
    return f"{test} {param}".strip()


def spread(values):
    median = statistics.median(values)
    return f"{median:.1f} ({min(values):.1f} to {max(values):.1f})" if len(values) > 1 \
        else f"{median:.1f}"


def main():
    cases = load(sys.argv[1:])
    runs = max(case["runs"] for case in cases.values())
    print(f"Compute sweep on the simulated GPU: {runs} run(s); median (least to most) over runs;"
          " shares in percent of the device, from its own record.\n")
    print("| case | asked | achieved | within ±2 | passed |")
    print("|---|---|---|---|---|")
    for name, case in cases.items():
        figures = case["figures"]
        if "asked" not in figures:
            continue
        asked = figures["asked"][0]
        achieved = figures["achieved"]
        worst = max(abs(value - asked) for value in achieved)
        print(f"| {label(name, case)} | {asked:.0f} | {spread(achieved)} | "
              f"{'yes' if worst <= 2 else 'NO'} (worst {worst:.1f}) | "
              f"{case['passed']}/{case['runs']} |")
    print("\n| case | figure | value | passed |")
    print("|---|---|---|---|")
    for name, case in cases.items():
        figures = case["figures"]
        if not figures or "asked" in figures:
            continue
        for key, values in figures.items():
            print(f"| {label(name, case)} | {key} | {spread(values)} | {case['passed']}/{case['runs']} |")
    failed = sum(case["runs"] - case["passed"] for case in cases.values())
    print(f"\n{failed} failed case run(s).")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
