#!/bin/sh
# The doctor's cost (issue 52 item 4): the whole `flowlane doctor` with two interfaces
# (<= 0.3 s, its own `took_ms` and the process's wall time), and what reading the host's
# conditions adds to a run's start (<= 20 ms: `host.took_ms` in a `forward` run's report over
# the same two interfaces, read before its first frame). Reference, same run: the checks a
# user would script for the same items with the usual tools — per interface ethtool -i -k -c
# -g -a -l, and the files doctor reads (sysctl -a for the sysctls, /proc/cmdline, cpuinfo,
# interrupts, cpufreq and cpuidle files), one process each.
# Usage: bench/doctor_cost.sh [FLOWLANE] [ROUNDS]
set -eu
bin=${1:-target/release/flowlane}
rounds=${2:-30}
command -v ethtool >/dev/null || { echo "ethtool is not installed (Debian: apt-get install ethtool)"; exit 1; }
ns=fldoccost$$
ip netns add $ns
trap 'ip netns del $ns 2>/dev/null || true' EXIT INT TERM
ip -n $ns link add fla numtxqueues 2 numrxqueues 2 type veth peer flb numtxqueues 2 numrxqueues 2
ip -n $ns link set fla up
ip -n $ns link set flb up
python3 - "$bin" "$ns" "$rounds" <<'PY'
import json, statistics, subprocess, sys, time
bin, ns, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
run = lambda args: subprocess.run(["ip", "netns", "exec", ns] + args, capture_output=True)
took, wall = [], []
for _ in range(rounds):
    t0 = time.perf_counter()
    out = run([bin, "doctor", "--dev", "fla", "--dev", "flb", "--json"])
    wall.append((time.perf_counter() - t0) * 1e3)
    took.append(json.loads(out.stdout)["took_ms"])
start = []
for _ in range(max(3, rounds // 5)):
    out = run([bin, "forward", "--mode", "bridge", "--dev", "fla", "--dev", "flb",
               "--backend", "af-packet", "--duration", "0.2", "--json"])
    start.append(json.loads(out.stdout)["host"]["took_ms"])
ref = []
for _ in range(rounds):
    t0 = time.perf_counter()
    for d in ["fla", "flb"]:
        for o in ["-i", "-k", "-c", "-g", "-a", "-l"]:
            run(["ethtool", o, d])
    run(["sysctl", "-a"])
    for f in ["/proc/cmdline", "/proc/cpuinfo", "/proc/interrupts", "/proc/version"]:
        run(["cat", f])
    run(["sh", "-c", "cat /sys/devices/system/cpu/cpu*/cpufreq/scaling_governor "
                     "/sys/devices/system/cpu/cpu*/cpuidle/state*/latency 2>/dev/null"])
    ref.append((time.perf_counter() - t0) * 1e3)
med = statistics.median
print(f"flowlane doctor, 2 interfaces: took_ms median {med(took):.2f} (max {max(took):.2f}); "
      f"process wall median {med(wall):.1f} ms (max {max(wall):.1f})")
print(f"added to a forward run's start (host.took_ms): median {med(start):.2f} ms (max {max(start):.2f})")
print(f"scripted checks (12 ethtool + sysctl -a + 5 cat): median {med(ref):.1f} ms; "
      f"ratio {med(ref) / med(wall):.1f}x flowlane's process wall time")
print(f"bounds: doctor <= 300 ms: {'met' if max(wall) <= 300 else 'NOT met'}; "
      f"run start <= 20 ms: {'met' if med(start) <= 20 else 'NOT met'}")
PY
