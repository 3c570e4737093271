#!/bin/sh
# Two flowlane binaries side by side, alternated in the same run: is a change slower or less
# exact? Per round, each binary runs (in the lab, counted at the peer's interface)
#   blast --mode udp | raw | xdp | xdp-live for SECS seconds each (frames the DUT's fldut got),
#   bench k = 1..2, sink and echo steps (server-seen pps, and k2/k1),
#   route bench on a generated 200k-prefix IPv4 table (FIB batch lookups inside prefixes),
#   forward --mode reflect with each backend (xdp, af-xdp, af-packet) on the DUT's end while
#   NEW's blast --mode raw sends for SECS seconds (frames forwarded per second of the blast,
#   and the workers' CPU time per frame; the same sender for both, and NEW's sink --backend
#   af-xdp on the generator's end so veth takes the reflected frames back),
#   http serve on the DUT's CPU 1 loaded by http load from the generator's CPU 0, 64
#   connections asking /bytes/64 (answers per second).
# Prints per-round figures, then the median of each and the ratio NEW/OLD. Needs root,
# iproute2 and python3 (for the JSON). Usage:
#   bench/ab.sh OLD_BINARY NEW_BINARY [ROUNDS=3] [SECS=2]
# Build the old one from a worktree, e.g.:
#   git worktree add /tmp/fl-old REV && (cd /tmp/fl-old && cargo build --release --target-dir /tmp/fl-old-target)
set -eu
old=$1
new=$2
rounds=${3:-3}
secs=${4:-2}
lab=flab$$
# The forward rows' own lab: no steering program on the DUT's end (the forwarders attach theirs).
flab=ffwd$$
out=${TMPDIR:-/tmp}/flowlane-ab-$$
mkdir -p "$out"
trap '"$new" lab down --name $lab >/dev/null 2>&1 || true; "$new" lab down --name $flab >/dev/null 2>&1 || true; rm -rf "$out"' EXIT INT TERM
"$new" route gen --v4 200000 --seed 1 >"$out/t4.txt"
"$new" lab up --name $lab --queues 2 >/dev/null
"$new" lab up --name $flab --queues 2 --steer none >/dev/null

rx() { # frames the DUT's interface received so far
    ip -j -s -n $lab-dut link show dev fldut |
        python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["stats64"]["rx"]["packets"])'
}

one() { # BINARY TAG: one round of every measurement, as "TAG name value" lines
    bin=$1
    tag=$2
    for mode in udp raw xdp xdp-live; do
        before=$(rx)
        # A fixed source port: a port the kernel chose would put the flow on a random RSS
        # bucket, the sender's CPU or the other, and udp runs moved 176k <-> 292k with it.
        # Frames leave by the interface named; UDP sockets by the route (--dev is refused).
        dev="--dev flgen"; [ "$mode" = udp ] && dev=""
        ip netns exec $lab-gen "$bin" blast --mode $mode $dev --to 198.18.0.2:9000 \
            --sport 10000 --duration "$secs" --json --quiet >"$out/blast.json" 2>/dev/null || true
        after=$(rx)
        python3 - "$out/blast.json" "$before" "$after" "$tag" "$mode" <<'EOF'
import json, sys
path, before, after, tag, mode = sys.argv[1:]
j = json.load(open(path))
secs = j["duration_s"] or 1e-9
print(tag, "blast-" + mode + "-pps-at-peer", round((int(after) - int(before)) / secs))
EOF
    done
    "$bin" bench --name $lab --buckets 1..2 --step-secs "$secs" --mode both --json \
        --out "$out/rep" >"$out/bench.json" 2>/dev/null || true
    python3 - "$out/bench.json" "$tag" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
tag = sys.argv[2]
pps = {}
for s in r["steps"]:
    pps[(s["mode"], s["buckets"])] = s["pps"]["server_seen"]
    print(tag, "bench-%s-k%d-seen-pps" % (s["mode"], s["buckets"]), s["pps"]["server_seen"])
for m in ("sink", "echo"):
    if (m, 1) in pps and (m, 2) in pps:
        print(tag, "bench-%s-k2/k1" % m, round(pps[(m, 2)] / pps[(m, 1)], 3))
print(tag, "bench-problems", len(r["problems"]))
EOF
    for backend in xdp af-xdp af-packet; do
        # sink on the generator's end: its XDP program takes the frames veth hands back.
        ip netns exec $flab-gen "$new" sink --dev flgen --backend af-xdp --cpus 0 \
            --duration $((secs + 3)) --quiet >/dev/null 2>&1 &
        sink=$!
        # Native XDP runs where each frame arrived (no --cpus); the others on CPU 1.
        cpus="--cpus 1"
        [ $backend = xdp ] && cpus=
        ip netns exec $flab-dut "$bin" forward --mode reflect --dev fldut --backend $backend \
            --swap ip,ports $cpus --duration $((secs + 2)) --json --quiet \
            >"$out/fwd.json" 2>/dev/null &
        fwd=$!
        sleep 1
        ip netns exec $flab-gen "$new" blast --mode raw --dev flgen --to 198.18.0.2:9000 \
            --sport 10000 --duration "$secs" --cpus 0 --quiet >/dev/null 2>&1 || true
        wait $fwd || true
        wait $sink || true
        python3 - "$out/fwd.json" "$tag" "$backend" "$secs" <<'EOF'
import json, sys
path, tag, backend, secs = sys.argv[1:]
try:
    r = json.load(open(path))
    f = r["total"]["forwarded"]
    seen = sum(c["rx_packets"] for c in r["cpus"])
    ns = sum(c["cpu_ns_per_packet"] * c["rx_packets"] for c in r["cpus"]
             if c.get("cpu_ns_per_packet") is not None)
except (OSError, ValueError, KeyError, TypeError):
    f, seen, ns = 0, 0, 0
print(tag, "forward-%s-pps" % backend, round(f / float(secs)))
if backend != "xdp":
    # Below its ceiling a forwarder carries what it is offered: its CPU time per frame is
    # what tells a slower one.
    print(tag, "forward-%s-worker-ns-per-frame" % backend, round(ns / seen) if seen else 0)
EOF
    done
    ip netns exec $lab-dut "$bin" http serve --bind 198.18.0.2:8080 --cpus 1 \
        --duration $((secs + 3)) --quiet >/dev/null 2>&1 &
    srv=$!
    sleep 1
    ip netns exec $lab-gen "$bin" http load http://198.18.0.2:8080/bytes/64 -c 64 --cpus 0 \
        -d "$secs" --json --quiet >"$out/load.json" 2>/dev/null || true
    wait $srv || true
    python3 - "$out/load.json" "$tag" <<'EOF'
import json, sys
try:
    r = json.load(open(sys.argv[1]))["requests_per_s"]
except (OSError, ValueError, KeyError):
    r = 0
print(sys.argv[2], "http-load-64B-answers-per-s", round(r))
EOF
    "$bin" route bench --table "$out/t4.txt" --seconds 0.3 --addresses 1048576 --json \
        >"$out/route.json"
    python3 - "$out/route.json" "$tag" <<'EOF'
import json, sys
l = json.load(open(sys.argv[1]))["ipv4"]["lookups"]
print(sys.argv[2], "route-inside-batch-Mlps", round(l["inside"]["batch_lps"] / 1e6, 1))
print(sys.argv[2], "route-inside-vs-dir24-8", round(l["inside"]["ratio"], 3))
EOF
}

i=0
while [ $i -lt "$rounds" ]; do
    one "$old" old
    one "$new" new
    i=$((i + 1))
done | tee "$out/all.txt"
python3 - "$out/all.txt" <<'EOF'
import statistics, sys
v = {}
for line in open(sys.argv[1]):
    tag, name, value = line.split()
    v.setdefault(name, {}).setdefault(tag, []).append(float(value))
print()
print("%-32s %14s %14s %8s" % ("median of rounds", "old", "new", "new/old"))
for name, t in v.items():
    o, n = statistics.median(t.get("old", [0])), statistics.median(t.get("new", [0]))
    print("%-32s %14.3f %14.3f %8.3f" % (name, o, n, n / o if o else float("nan")))
EOF
