#!/bin/sh
# `flowlane top`'s own cost (issue 51: <= 1 % of a CPU at one line a second for 128 queues):
# a veth end with 128 receive queues watched for SECS seconds; top reports the CPU time its
# thread used as a share of one CPU and what reading every counter took per line.
# Usage: bench/top_cost.sh [FLOWLANE] [SECS]
set -eu
bin=${1:-target/release/flowlane}
secs=${2:-20}
ns=fltopcost$$
ip netns add $ns
trap 'ip netns del $ns 2>/dev/null || true; rm -f "/tmp/$ns.json"' EXIT INT TERM
ip -n $ns link add fla numtxqueues 128 numrxqueues 128 type veth peer flb numtxqueues 128 numrxqueues 128
ip -n $ns link set fla up
ip -n $ns link set flb up
ip netns exec $ns "$bin" top --dev fla --duration "$secs" --json --quiet >"/tmp/$ns.json"
python3 - "/tmp/$ns.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
d = r["devs"][0]
print(f"queues {d['queues']}, {r['ticks']} lines in {r['duration_s']:.1f} s")
print(f"read per line: mean {r['read_us_mean']:.0f} us, max {r['read_us_max']:.0f} us")
ok = "met" if r["cpu_share"] <= 0.01 else "NOT met"
print(f"CPU: {r['cpu_share'] * 100:.3f} % of one CPU (bound 1 %: {ok})")
PY
rm -f "/tmp/$ns.json"
