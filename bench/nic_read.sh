#!/bin/sh
# Reading an interface's whole RSS and queue configuration (issue 51: <= 10 ms): flowlane's
# `rss show --dev` (driver, RSS contexts, hash fields of ten flow types, channels, rings,
# sysfs/procfs queues and IRQs; its own `read_ms`, one netlink socket, no process) against
# ethtool reading the same items (-i, -x, -l, -g and -n rx-flow-hash for the ten flow types,
# one process each, as a script that asks ethtool must), on a veth end with 8 queues.
# Usage: bench/nic_read.sh [FLOWLANE] [ROUNDS]
set -eu
bin=${1:-target/release/flowlane}
rounds=${2:-50}
command -v ethtool >/dev/null || { echo "ethtool is not installed (Debian: apt-get install ethtool)"; exit 1; }
ns=flnicread$$
ip netns add $ns
trap 'ip netns del $ns 2>/dev/null || true' EXIT INT TERM
ip -n $ns link add fla numtxqueues 8 numrxqueues 8 type veth peer flb numtxqueues 8 numrxqueues 8
python3 - "$bin" "$ns" "$rounds" <<'PY'
import json, statistics, subprocess, sys, time
bin, ns, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
run = lambda args: subprocess.run(["ip", "netns", "exec", ns] + args, capture_output=True)
ours = []
for _ in range(rounds):
    out = run([bin, "rss", "show", "--dev", "fla", "--json", "--sample", "1"])
    ours.append(json.loads(out.stdout)["nic"]["read_ms"])
theirs = []
flows = ["tcp4", "udp4", "sctp4", "ah4", "tcp6", "udp6", "sctp6", "ah6", "ip4", "ip6"]
for _ in range(rounds):
    t0 = time.perf_counter()
    cmds = [["-i", "fla"], ["-x", "fla"], ["-l", "fla"], ["-g", "fla"]]
    cmds += [["-n", "fla", "rx-flow-hash", f] for f in flows]
    for c in cmds:
        run(["ethtool"] + c)
    theirs.append((time.perf_counter() - t0) * 1e3)
m, t = statistics.median(ours), statistics.median(theirs)
print(f"flowlane rss show --dev (read_ms, in process): median {m:.3f} ms, max {max(ours):.3f} ms over {rounds} rounds")
print(f"ethtool -i -x -l -g + 10 x -n rx-flow-hash (14 processes): median {t:.1f} ms")
print(f"ratio ethtool / flowlane: {t / m:.0f}x; bound 10 ms: {'met' if m <= 10 else 'NOT met'}")
PY
