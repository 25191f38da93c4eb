#!/usr/bin/env python3
"""Summarises a tools/compare-perftest log: per case the median over rounds of the per-round
rverbs/perftest ratio (with its range), doorbells per request, barrier medians (and their
plot). With RVERBS_COMPARE_DOC=1 it writes the section of docs/benchmarks.md between the
"compare-perftest" markers."""
import os
import platform
import re
import statistics
import subprocess
import sys
import time

log = open(sys.argv[1]).read().splitlines()
# Cases whose number is a rate (higher is better): the ratio is still rverbs/perftest.
RATES = ("_bw_",)

rounds = {}
for line in log:
    m = re.match(r"round (\d+) (\S+) perftest=(\S+) rverbs=(\S+)", line)
    if not m:
        continue
    try:
        p, r = float(m.group(3)), float(m.group(4))
    except ValueError:
        continue
    if p > 0 and r > 0:
        rounds.setdefault(m.group(2), []).append((p, r))

doors = {}
for line in log:
    m = re.match(r"doorbells (\S+) (\w+) n=(\d+) writes=(\d+)", line)
    if m:
        doors.setdefault((m.group(1), m.group(2)), {})[int(m.group(3))] = int(m.group(4))

barriers = {}
for line in log:
    m = re.match(r"barrier ranks=(\d+) (\S+) p50_us=([0-9.]+)", line)
    if m:
        barriers.setdefault(m.group(2), {})[int(m.group(1))] = float(m.group(3))

vm = next((l[4:] for l in log if l.startswith("vm: ")), "")

# market-feed publisher cost per datagram (mcast): microseconds and posts per datagram.
mcast = {}
for line in log:
    m = re.search(r"(mcast[0-9]+): publisher: ([0-9]+) datagrams .* in ([0-9.]+) s .* \(([0-9.]+) per datagram\)", line)
    if m:
        mcast.setdefault(m.group(1), []).append((float(m.group(3)) * 1e6 / int(m.group(2)), float(m.group(4))))
for name, runs in sorted(mcast.items()):
    print(f"{name}: publisher {statistics.median(u for u, _ in runs):.2f} us per datagram "
          f"(median of {len(runs)} rounds), at most {max(p for _, p in runs):.2f} posts per datagram")


def unit(case):
    return "Mpps" if any(k in case for k in RATES) else "us"


rows = []
for case, runs in rounds.items():
    ratios = [r / p for p, r in runs]
    rows.append((case, len(runs), statistics.median(p for p, _ in runs),
                 statistics.median(r for _, r in runs), statistics.median(ratios),
                 min(ratios), max(ratios)))

out = []
out.append("| case | rounds | perftest (median) | rverbs-perf (median) | rverbs/perftest: median of rounds | range |")
out.append("|---|---|---|---|---|---|")
for case, n, p, r, med, lo, hi in rows:
    u = unit(case)
    fmt = "{:.4f}" if u == "Mpps" else "{:.2f}"
    out.append(f"| `{case}` | {n} | {fmt.format(p)} {u} | {fmt.format(r)} {u} | **{med:.2f}** | {lo:.2f} - {hi:.2f} |")
table = "\n".join(out)

dtable = ""
if doors:
    d = ["| case | perftest doorbells per request | rverbs-perf doorbells per request |", "|---|---|---|"]
    for case in sorted({c for c, _ in doors}):
        vals = []
        for tool in ("perftest", "rverbs"):
            w = doors.get((case, tool), {})
            if 3200 in w and 6400 in w:
                per = (w[6400] - w[3200]) / 3200
                vals.append(f"{per:.4f} (1/{1/per:.1f}; {w[3200]} writes at -n 3200)" if per > 0 else "0")
            else:
                vals.append("n/a")
        d.append(f"| `{case}` | {vals[0]} | {vals[1]} |")
    dtable = "\n".join(d)

btable = ""
png = "docs/barrier-latency.png"
if barriers:
    ranks = sorted({r for v in barriers.values() for r in v})
    b = ["| algorithm | " + " | ".join(f"{r} ranks" for r in ranks) + " |", "|---" * (len(ranks) + 1) + "|"]
    for alg, v in sorted(barriers.items()):
        b.append(f"| {alg} | " + " | ".join(f"{v[r]:.1f} us" if r in v else "n/a" for r in ranks) + " |")
    btable = "\n".join(b)
    data = "".join(f"{alg},{r},{us}\n" for alg, v in barriers.items() for r, us in v.items())
    target = png if os.environ.get("RVERBS_COMPARE_DOC") == "1" else "target/compare/barrier-latency.png"
    subprocess.run(["target/release/rverbs-plot", target, "Barrier latency on SoftRoCE (one VM)",
                    "ranks", "median per barrier [us]"], input=data.encode(), check=True)
    print(f"plot: {target}")

if rows:
    print(table)
if dtable:
    print()
    print(dtable)
if btable:
    print()
    print(btable)

if os.environ.get("RVERBS_COMPARE_DOC") == "1":
    cpu = ""
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    commit = os.environ.get("RVERBS_COMPARE_COMMIT") or subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    section = f"""<!-- compare-perftest:begin (written by tools/compare-perftest; edits here are replaced) -->
## rverbs-perf against perftest on rxe

Written by `RVERBS_COMPARE_DOC=1 {os.environ.get('RVERBS_COMPARE_CMD', 'tools/compare-perftest')}` on
{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} (commit {commit or 'unknown'}), host {platform.machine()} ({cpu}, {os.cpu_count()} cores),
SoftRoCE in one VM boot ({vm}). rxe is emulated (TCG): read the ratios, not the absolute
numbers. Each case runs perftest's tool and `rverbs-perf` with the same flags, interleaved;
the ratio column is the median over rounds of each round's rverbs/perftest ratio (for
latency lower is better, for message rate higher is better).

{table}
"""
    if dtable:
        section += f"""
Doorbells per request: `write(2)` calls of the client under `strace -f -c -e trace=write`
(on rxe every post is one `write` on the uverbs device), from the difference between
`-n 6400` and `-n 3200`, so setup and the TCP exchange cancel out:

{dtable}
"""
    if btable:
        section += f"""
Barrier latency against world size (`cluster --ranks N`, 1000 barriers per algorithm, the
default wait policy, the median over ranks of each rank's median per barrier). Once the
ranks (and rxe's kernel threads) outnumber the VM's vCPUs, the scheduler, not the library,
sets the pace.

{btable}

![barrier latency against world size]({png.split('/', 1)[1]})
"""
    section += "<!-- compare-perftest:end -->\n"
    path = "docs/benchmarks.md"
    doc = open(path).read()
    begin, end = doc.find("<!-- compare-perftest:begin"), doc.find("<!-- compare-perftest:end -->")
    if begin >= 0 and end > begin:
        doc = doc[:begin] + section + doc[end + len("<!-- compare-perftest:end -->\n"):]
    else:
        doc = doc.rstrip() + "\n\n" + section
    open(path, "w").write(doc)
    print(f"wrote {path}")
