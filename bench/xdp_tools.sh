#!/bin/sh
# Builds the xdp-tools peers the benches compare against — xdp-forward (route_veth),
# xdp-bench (forward_veth), xdp-trafficgen — from a checkout of
# https://github.com/xdp-project/xdp-tools (>= 1.5.6; Debian's 1.3 predates xdp-forward),
# and installs them in /usr/local/bin. Needs clang, llvm, m4, bpftool, libpcap-dev, libelf-dev,
# zlib1g-dev (apt-get install -y clang llvm m4 bpftool libpcap-dev libelf-dev zlib1g-dev), and
# the checkout's lib/libbpf submodule (git submodule update --init).
# Usage: bench/xdp_tools.sh XDP_TOOLS_CHECKOUT
set -eu
src=$1
for p in clang llc m4 bpftool; do
	command -v "$p" >/dev/null || { echo "missing $p (see the header of $0)" >&2; exit 1; }
done
[ -f "$src/lib/libbpf/src/libbpf.c" ] || {
	echo "$src/lib/libbpf is empty: git -C $src submodule update --init" >&2
	exit 1
}
cd "$src"
# The bundled libbpf (the system's may be older than the tools need).
FORCE_SUBDIR_LIBBPF=1 ./configure
# Some sources use `bool` without <stdbool.h> (a C23 keyword; gcc 12 and clang 14 default to
# older C).
for d in xdp-forward xdp-bench xdp-trafficgen; do
	make -C "$d" CC="gcc -include stdbool.h" CLANG="clang -include stdbool.h"
	install -m 0755 "$d/$d" /usr/local/bin/
done
echo "installed: xdp-forward xdp-bench xdp-trafficgen in /usr/local/bin"
