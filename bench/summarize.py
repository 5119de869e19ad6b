#!/usr/bin/env python3
"""Turns bench_hook's JSON into a table of medians and ratios (hooked against direct)."""
import json
import sys


def medians(path):
    with open(path) as handle:
        report = json.load(handle)
    found = {}
    for entry in report["benchmarks"]:
        if entry.get("aggregate_name") == "median":
            found[entry["run_name"]] = entry
    return report["context"], found


def main():
    context, runs = medians(sys.argv[1])
    print(f"Host: {context['num_cpus']} CPUs at {context['mhz_per_cpu']} MHz; "
          f"medians of {runs[next(iter(runs))]['repetitions']} repetitions\n")
    print("| measure | direct | hooked | added by the hook | ratio | target |")
    print("|---|---|---|---|---|---|")
    for name, label, target in [("AllocFree", "cuMemAlloc + cuMemFree pair, limit in force", 200),
                                ("LaunchKernel", "cuLaunchKernel, no compute limit", 10)]:
        direct = runs[f"{name}/0"]["real_time"]
        hooked = runs[f"{name}/1"]["real_time"]
        added = hooked - direct
        verdict = "met" if added < target else "MISSED"
        print(f"| {label} | {direct:.1f} ns | {hooked:.1f} ns | {added:.1f} ns | "
              f"{hooked / direct:.2f}x | < {target} ns: {verdict} |")
    _, limited = medians(sys.argv[2])
    _, low = medians(sys.argv[3])
    direct = runs["LaunchKernelTimed/0"]["real_time"]
    for label, source, target in [("cuLaunchKernel of a 1 us kernel, no compute limit", runs, None),
                                  ("cuLaunchKernel of a 1 us kernel, 100 % share (paced)", limited, 1000),
                                  ("cuLaunchKernel of a 1 us kernel, low priority (governed)", low, 1000)]:
        hooked = source["LaunchKernelTimed/1"]["real_time"]
        verdict = "" if target is None else (" < 1 us: met" if hooked - direct < target else " < 1 us: MISSED")
        print(f"| {label} | {direct:.1f} ns | {hooked:.1f} ns | {hooked - direct:.1f} ns | "
              f"{hooked / direct:.2f}x |{verdict} |")
    # Under the share: a rejected launch alone, an accepted one alone, and the two in turn.
    rejected = limited["LaunchKernel/1"]["real_time"]
    accepted = limited["LaunchKernelTimed/1"]["real_time"]
    pair = limited["LaunchKernelAfterRejected/1"]["real_time"]
    apart = accepted + rejected
    print(f"| rejected cuLaunchKernel, 100 % share | accepted: {accepted:.1f} ns | "
          f"{rejected:.1f} ns | | {rejected / accepted:.2f}x of accepted | "
          f"<= 1x: {'met' if rejected <= accepted else 'MISSED'} |")
    print(f"| rejected + accepted launch in turn, 100 % share | apart: {apart:.1f} ns | "
          f"{pair:.1f} ns | {pair - apart:.1f} ns | {pair / apart:.2f}x | "
          f"< 1.1x: {'met' if pair < 1.1 * apart else 'MISSED'} |")
    print()
    print("| alloc/free pairs per second, one group | direct | hooked |")
    print("|---|---|---|")
    rates = {}
    for processes in (1, 8):
        row = []
        for which in (0, 1):
            rate = runs[f"ContendedAllocFree/{processes}/{which}/manual_time"]["items_per_second"]
            rates[(processes, which)] = rate
            row.append(f"{rate / 1e6:.2f} M/s")
        print(f"| {processes} process{'es' if processes > 1 else ''} | {row[0]} | {row[1]} |")
    for which, label in ((0, "direct"), (1, "hooked")):
        ratio = rates[(8, which)] / rates[(1, which)]
        note = ""
        if which == 1:
            note = " (target: >= 0.5, i.e. within 2x: " + ("met)" if ratio >= 0.5 else "MISSED)")
        print(f"\n8 processes / 1 process, {label}: {ratio:.2f}{note}")


if __name__ == "__main__":
    main()
