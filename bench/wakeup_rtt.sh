#!/bin/sh
# The network side of wake-up latency (issue 55 item 5): blast --echo at a low paced rate
# through a lab (software RSS, one server worker per CPU), round trips per sender CPU, and the
# server's wake-ups (`sleeps`: times a worker slept on readiness and was woken) — once with
# serve sleeping on readiness, once with `--busy-poll 50` (spin before sleeping). The seed's
# figure, ~750 µs at 20 000 packets a second under interrupt moderation, was a NIC's; a veth
# lab has no interrupt moderation, so this shows the wake-up path alone.
# Usage: bench/wakeup_rtt.sh [FLOWLANE] [RATE] [SECS]
set -eu
bin=${1:-target/release/flowlane}
rate=${2:-20000}
secs=${3:-5}
lab=flwake$$
out=/tmp/$lab
trap '"$bin" lab down --name $lab >/dev/null 2>&1 || true; rm -f $out.*' EXIT INT TERM
"$bin" lab up --name $lab >/dev/null
for mode in sleep busy; do
    extra=""
    [ $mode = busy ] && extra="--busy-poll 50"
    # shellcheck disable=SC2086
    ip netns exec $lab-dut "$bin" serve --bind 198.18.0.2:9000 --duration $((secs + 3)) \
        --json --quiet $extra >$out.serve 2>$out.serve.err &
    srv=$!
    sleep 1
    ip netns exec $lab-gen "$bin" blast --to 198.18.0.2:9000 --echo --rate "$rate" \
        --duration "$secs" --flows 4 --cpus 0,1 --json --quiet >$out.blast 2>/dev/null || true
    wait $srv
    python3 - $mode $out.blast $out.serve <<'PY'
import json, sys
mode, b, s = sys.argv[1], json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
us = lambda v: v / 1e3
print(f"serve {'--busy-poll 50' if mode == 'busy' else 'sleeping on readiness'}:")
l = b["latency_ns"]
print(f"  round trip, all: p50 {us(l['p50']):.1f} p99 {us(l['p99']):.1f} max {us(l['max']):.1f} us"
      f" ({b['rx_packets']} echoes of {b['tx_packets']})")
for c in b.get("cpu_latency_ns", []):
    l = c["latency"] or {}
    print(f"  sender cpu {c['cpu']}: p50 {us(l.get('p50', 0)):.1f} p99 {us(l.get('p99', 0)):.1f}"
          f" max {us(l.get('max', 0)):.1f} us ({c['echoes']} echoes)")
for w in s["workers"]:
    print(f"  server cpu {w['cpu']}: {w['rx_packets']} datagrams, woken {w['sleeps']} times"
          f" ({w['rx_packets'] / max(w['sleeps'], 1):.2f} datagrams a wake-up), "
          f"CPU {w['cpu_ns'] / 1e9:.2f} s")
PY
done
