#!/bin/sh
# DPDK's rte_hash on the flow table's workload: the peer check for
# `cargo bench -p flowlane-flowtable --bench flowtable`. Needs Debian's libdpdk-dev
# (apt-get install -y libdpdk-dev pkg-config). Usage: bench/dpdk_hash.sh
set -eu
here=$(dirname "$0")
out=${TMPDIR:-/tmp}/flowlane-dpdk-hash
command -v pkg-config >/dev/null && pkg-config --exists libdpdk || {
    echo "DPDK is not installed (Debian: apt-get install libdpdk-dev pkg-config)"; exit 1; }
cc -O2 -march=x86-64-v2 -o "$out" "$here/dpdk_hash.c" $(pkg-config --cflags --libs libdpdk)
exec "$out" "$@"
