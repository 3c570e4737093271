#!/bin/sh
# DPDK's rte_hash on the flow table's workload: the peer check for
# `cargo bench -p flowlane-flowtable --bench flowtable` (and bench/flowtable_vs_dpdk.sh).
# Needs Debian's libdpdk-dev (apt-get install -y libdpdk-dev pkg-config). Usage:
#   bench/dpdk_hash.sh [lookups ROUNDS | turns]
# rte_hash runs on hugepages (as DPDK is deployed, and as flowlane's table runs on
# transparent huge pages): when fewer than 256 MiB of 2 MiB hugepages are free, this reserves
# them (root) and gives them back on exit; without them, set FLOWLANE_DPDK_NO_HUGE=1.
set -eu
here=$(dirname "$0")
out=${TMPDIR:-/tmp}/flowlane-dpdk-hash
command -v pkg-config >/dev/null && pkg-config --exists libdpdk || {
    echo "DPDK is not installed (Debian: apt-get install libdpdk-dev pkg-config)"; exit 1; }
[ "$out" -nt "$here/dpdk_hash.c" ] ||
    cc -O2 -march=x86-64-v2 -o "$out" "$here/dpdk_hash.c" $(pkg-config --cflags --libs libdpdk)
if [ -z "${FLOWLANE_DPDK_NO_HUGE:-}" ]; then
    nr=/proc/sys/vm/nr_hugepages
    free=$(awk '/^HugePages_Free:/ { print $2 }' /proc/meminfo)
    if [ "${free:-0}" -lt 128 ]; then
        before=$(cat "$nr")
        trap 'echo "$before" > "$nr" 2>/dev/null' EXIT INT TERM
        if ! echo $((before + 128 - free)) > "$nr" 2>/dev/null; then
            echo "dpdk_hash: cannot reserve 2 MiB hugepages ($nr; run as root, or set FLOWLANE_DPDK_NO_HUGE=1)" >&2
            exit 1
        fi
    fi
fi
"$out" "$@"
