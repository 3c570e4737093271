#!/bin/sh
# DPDK's rte_lpm on a flowlane table: the peer check for `flowlane route bench`'s DIR-24-8
# column. Needs Debian's libdpdk-dev (apt-get install -y libdpdk-dev pkg-config).
# Usage: bench/dpdk_lpm.sh TABLE   (e.g. from `flowlane route gen --v4 950000 --seed 1`)
# With FLOWLANE_DPDK_HUGE=1 the tables go on 2 MiB hugepages, as DPDK runs in production
# (reserve them first, as root: echo 700 > /proc/sys/vm/nr_hugepages).
set -eu
here=$(dirname "$0")
out=${TMPDIR:-/tmp}/flowlane-dpdk-lpm
cc -O2 -march=x86-64-v2 -o "$out" "$here/dpdk_lpm.c" $(pkg-config --cflags --libs libdpdk)
exec "$out" "$@"
