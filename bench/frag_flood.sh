#!/bin/sh
# An incomplete-fragment flood against `flowlane sink` (issue 54 item 5): every datagram
# cut into four fragments and its last never sent, for SECS seconds (default 600) at RATE
# datagrams a second (default 20000), through a lab's kernel router into the sink, whose
# resident memory (VmRSS) is sampled each second. Its reassembly is bounded (1 024 contexts,
# 4 MiB by default): the memory must stay flat however long the flood runs, and the report
# must account every fragment (held, timed out or evicted).
# Usage (root): bench/frag_flood.sh [FLOWLANE] [SECS] [RATE]
set -eu
bin=${1:-target/release/flowlane}
secs=${2:-600}
rate=${3:-20000}
lab=flff$$
$bin lab up --name $lab --topology line --queues 1 --kernel route --steer none >/dev/null
trap '$bin lab down --name $lab >/dev/null 2>&1 || true' EXIT INT TERM
out=$(mktemp)
ip netns exec $lab-sink $bin sink --dev flsink --duration $((secs + 5)) --json > "$out" 2>/dev/null &
sleep 1
sink=$(pgrep -n -f "sink --dev flsink --duration $((secs + 5))")
ip netns exec $lab-gen $bin blast --mode raw --dev flgen --to 198.18.1.2:9000 --size 1000 \
    --fragment-size 256 --fragment-attack incomplete --flows 64 --rate "$rate" \
    --duration "$secs" --quiet --json > /dev/null &
i=0
: > "$out.rss"
while [ $i -lt $((secs + 3)) ] && kill -0 "$sink" 2>/dev/null; do
    awk '/VmRSS/ {print $2}' /proc/$sink/status >> "$out.rss" 2>/dev/null || true
    sleep 1
    i=$((i + 1))
done
wait
python3 - "$out" "$out.rss" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
rss = [int(x) for x in open(sys.argv[2]) if x.strip()]
f = r.get("fragments", {})
print(f"sink RSS over {len(rss)} samples: first {rss[0]} KiB, after 10 s {rss[min(10, len(rss)-1)]} KiB, "
      f"max {max(rss)} KiB, last {rss[-1]} KiB")
print("fragments:", json.dumps(f))
held = f["datagram_fragments"] + f["overlap"] + f["duplicate"] + f["too_many"] + f["too_big"] \
    + f["memory"] + f["malformed"] + f["timed_out"] + f["evicted"] + f["held_fragments"]
print(f"every fragment accounted: {held == f['fragments']} ({held} of {f['fragments']})")
PY
rm -f "$out" "$out.rss"
