#!/usr/bin/env bash
# What `flowlane merge` costs: N shard reports of a blast run with echoes (up to 1 024 flows
# each, 65 536 in all; a latency histogram each) merged, against reading the same reports with Python's json module
# in the same run (the floor: parsing them and nothing else).
#   sh bench/merge_cost.sh [FLOWLANE] [SHARD COUNTS...]     e.g. bench/merge_cost.sh target/release/flowlane 16 64 256
# One real report comes from blast against serve on loopback; the N shards are copies of it
# with their own shard index and flow ids (merge checks both), so the merge does all its work.
set -eu
bin=${1:-target/release/flowlane}
shift || true
counts=${*:-16 64 256}
command -v python3 >/dev/null || { echo "merge_cost: python3 is not installed (Debian: apt-get install python3)" >&2; exit 2; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
port=$((20000 + $$ % 20000))
"$bin" serve --bind 127.0.0.1:$port --cpus 0 --duration 6 --json --quiet > "$dir/serve.json" 2>/dev/null &
sleep 1
"$bin" blast --to 127.0.0.1:$port --flows 1024 --count 200000 --rate 100000 --echo --cpus 0 \
    --shard 0/2 --json --quiet > "$dir/base.json" 2>/dev/null || true
wait
for n in $counts; do
    python3 - "$dir/base.json" "$dir/r$n" "$n" <<'PY'
import json, os, sys
base = json.load(open(sys.argv[1]))
out, n = sys.argv[2], int(sys.argv[3])
os.makedirs(out, exist_ok=True)
# Flow ids are 16 bits: at most 65 536 flows in all, so each shard keeps 65 536 / N of them.
flows = base["flows"][: max(1, 65536 // n)]
for i in range(n):
    r = dict(base)
    r["shard"] = dict(base["shard"], shard={"index": i, "count": n})
    r["flows"] = [dict(f, id=i * len(flows) + k) for k, f in enumerate(flows)]
    json.dump(r, open(f"{out}/s{i}.json", "w"))
PY
    bytes=$(cat "$dir/r$n"/*.json | wc -c)
    t0=$(date +%s%N)
    "$bin" merge "$dir/r$n"/*.json --json > "$dir/m$n.json" 2>/dev/null \
        || { echo "merge_cost: the merge of $n shards failed" >&2; exit 1; }
    t1=$(date +%s%N)
    python3 -c "import json,sys; [json.load(open(f)) for f in sys.argv[1:]]" "$dir/r$n"/*.json
    t2=$(date +%s%N)
    m=$(( (t1 - t0) / 1000000 )); p=$(( (t2 - t1) / 1000000 ))
    echo "$n shards ($((bytes / 1024)) KiB of reports): merge ${m} ms, python json.load ${p} ms, ratio $(python3 -c "print(round($m / max($p, 1), 2))")"
done
