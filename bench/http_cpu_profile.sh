#!/bin/bash
# Where an HTTP client's CPU goes, per answer (issue 27: requests per second of client CPU
# time). nginx (one worker, as in benches/http_loopback.rs) on CPU 1 in a private namespace,
# each client on CPU 0 against it (keep-alive; by default 100 connections and 64-byte
# answers; SECS seconds), sampled by `perf record -e cpu-clock` (a timer: this VM has no
# hardware PMU) on CPU 0, one sample per 100 µs of CPU time. Each client's samples are sorted, by kernel
# symbol name, into what every client pays — TCP/IP, socket buffers and copies; scheduling,
# wake-ups and the samples that land where interrupts come back on — and what a client could
# still shed: system-call entry and file lookups, epoll, its own user space. Prints ns per
# answer for each, then wrk's total over ours (answers per CPU second, ours against wrk's),
# over ours without the epoll and system-call rows (what io_uring could at best make of it)
# and over our shared rows alone (a client with no cost of its own).
# Needs root, nginx (nginx-light), wrk and perf (linux-perf); run after `cargo build --release`.
# Usage: bench/http_cpu_profile.sh [SECS=5]; CONNS (100) and SIZE (64, 1k or 64k) in the
# environment.
set -eu
secs=${1:-5}
bin=$(dirname "$0")/../target/release/flowlane
needs="wrk:wrk perf:linux-perf"
. "$(dirname "$0")/nginx_ns.sh"
conns=${CONNS:-100}
url=http://198.18.0.1:8081/${SIZE:-64}

period=100000 # ns of CPU time per sample
# Samples of one process, as "samples symbol-kind symbol" lines.
samples() { # DATA PID
    perf report -i "$1" --no-children -n --sort pid,sym -q -g none 2>/dev/null |
        awk -v pid="$2" '$3 ~ "^" pid ":" { print $2, $(NF - 1), $NF }'
}

# ns per answer by kind, from the samples of ANSWERS answers.
sort_out() { # ANSWERS
    awk -v n="$1" -v period=$period '{
        ns = $1 * period / n; s = $3
        if ($2 == "[.]") c = "own: user space"
        else if (s ~ /syscall|^fdget|^fput|^__x64_sys|entry_SYSCALL|^syscall_|^__sys_|^__fget|exit_to_user|^ksys_|rseq/) c = "own: system-call entry, file lookup"
        else if (s ~ /epoll|^ep_|_poll$/) c = "own: epoll"
        else if (s ~ /sched|switch|^pick_|enqueue|dequeue|update_curr|wake|hrtimer|idle|^rb_|account|update_load|_raw_spin_unlock_irq/) c = "shared: scheduling, wake-ups, irq-on"
        else c = "shared: TCP/IP, skbs, copies"
        k[c] += ns; t += ns
    } END { for (c in k) printf "%s\t%.0f\n", c, k[c]; printf "total\t%.0f\n", t }'
}

for tool in flowlane wrk; do
    case $tool in
    flowlane) set -- "$bin" http load "$url" -c "$conns" -d "$secs" --cpus 0 --connect-window 1000 \
        --drain 0 --json --quiet ;;
    wrk) set -- taskset -c 0 wrk -t1 -c "$conns" -d "${secs}s" "$url" ;;
    esac
    ip netns exec $ns perf record -q -e cpu-clock -c $period -C 0 -o "$dir/$tool.data" -- "$@" \
        >"$dir/$tool.out" 2>/dev/null
    case $tool in
    flowlane) answers=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["total"]["responses"])' \
        <"$dir/$tool.out") ;;
    wrk) answers=$(awk '/requests in/ { print $1 }' "$dir/$tool.out") ;;
    esac
    pid=$(perf report -i "$dir/$tool.data" --no-children --sort pid -q -g none 2>/dev/null |
        awk '$2 !~ /^0:/ { split($2, p, ":"); print p[1]; exit }')
    samples "$dir/$tool.data" "$pid" | sort_out "$answers" >"$dir/$tool.kinds"
    echo "$tool: $answers answers in $secs s"
done
echo
printf "%-40s %10s %10s\n" "ns of client CPU per answer" flowlane wrk
join -t "$(printf '\t')" <(sort "$dir/flowlane.kinds") <(sort "$dir/wrk.kinds") 2>/dev/null |
    awk -F '\t' '{ printf "%-40s %10s %10s\n", $1, $2, $3 }'
awk -F '\t' '
    FILENAME ~ /wrk/ && $1 == "total" { w = $2 }
    FILENAME ~ /flowlane/ { f[$1] = $2 }
    END {
        shed = f["own: epoll"] + f["own: system-call entry, file lookup"]
        shared = f["shared: TCP/IP, skbs, copies"] + f["shared: scheduling, wake-ups, irq-on"]
        printf "\nanswers per CPU second, ours / wrk: %.2fx; without epoll and system calls: %.2fx; with no cost of our own: %.2fx\n",
            w / f["total"], w / (f["total"] - shed), w / shared
    }' "$dir/flowlane.kinds" "$dir/wrk.kinds"
