#!/bin/bash
# Quick A/B of `http load` settings against wrk and h2load (issue 27), for one size and
# connection count: one nginx worker (as in benches/http_loopback.rs) on CPU 1 in a private
# namespace, every client on CPU 0, SECS-second runs, ROUNDS rounds with the variants and the
# peers alternated. Prints each run's answers per second and the client's user and system CPU
# seconds (/usr/bin/time), so answers per CPU second can be compared within a round. A variant
# is NAME:ENV:ARGS — environment for the client and extra `http load` arguments, e.g.
#   bench/http_probe.sh 64 100 "base::" "bw::--batch-wait 1ms" "tp::--busy-poll 50us --read-size 4k"
# SIZE is 64, 1k or 64k. Needs root, nginx (nginx-light), wrk, nghttp2-client (h2load), python3
# and /usr/bin/time (time); run after `cargo build --release`.
# Environment: ROUNDS (3), SECS (3), FLOWLANE (the binary; default target/release/flowlane).
set -u
size=${1:?usage: bench/http_probe.sh SIZE CONNS VARIANT...}
conns=${2:?usage: bench/http_probe.sh SIZE CONNS VARIANT...}
shift 2
rounds=${ROUNDS:-3}
secs=${SECS:-3}
bin=${FLOWLANE:-$(dirname "$0")/../target/release/flowlane}
needs="wrk:wrk h2load:nghttp2-client python3:python3 /usr/bin/time:time"
. "$(dirname "$0")/nginx_ns.sh"
url=http://198.18.0.1:8081/$size
run() { # NAME COMMAND... : prints NAME, answers/s, user and system CPU seconds
    local name=$1
    shift
    ip netns exec $ns taskset -c 0 /usr/bin/time -f "%U %S" -o "$dir/time" "$@" >"$dir/out" 2>/dev/null
    python3 - "$name" "$dir/out" "$dir/time" "$secs" <<'EOF'
import json, re, sys
name, out, tm, secs = sys.argv[1:]
text = open(out).read()
if name in ("wrk", "h2load"):
    m = re.search(r"Requests/sec:\s*([\d.]+)", text) or re.search(r"([\d.]+) req/s", text)
    rps = float(m.group(1)) if m else 0.0
else:
    try:
        rps = json.loads(text)["requests_per_s"]
    except ValueError:
        rps = 0.0
user, system = map(float, open(tm).read().split()[-2:])
cpu = user + system
print(f"{name:10} {rps:9.0f} answers/s  cpu {user:.2f} + {system:.2f} s  "
      f"{rps * float(secs) / cpu if cpu else 0:9.0f} answers per CPU s")
EOF
}
for r in $(seq "$rounds"); do
    echo "round $r"
    for v in "$@"; do
        IFS=: read -r name env args <<<"$v"
        # shellcheck disable=SC2086 # ENV and ARGS are word lists
        run "$name" env $env "$bin" http load "$url" -c "$conns" -d "$secs" --cpus 0 \
            --connect-window 1000 --drain 0 --json --quiet $args
    done
    run wrk wrk -t1 -c "$conns" -d "${secs}s" "$url"
    run h2load h2load --h1 -t1 -c "$conns" -D "$secs" "$url"
done
