#!/bin/sh
# DPDK's rte_thash_gfni against flowlane's single Toeplitz hashes (issue 29, item 2), on the
# same 1024 tuples, alternated in one run: ROUNDS times the DPDK program, then the toeplitz
# bench's rows for the default hasher on such a CPU (avx512-gfni-clmul: `Toeplitz::hash`
# and `hash_batch`; criterion, best sample). Prints each round's ns/hash and the ratio
# ours / DPDK (single against rte_thash_gfni, batch against rte_thash_gfni_bulk), then the
# median ratio per tuple size. Also the bench's `call floor` row over DPDK's single: a call
# that only reads the tuple, the least any single hash behind `Toeplitz::hash`'s call (its
# kernels are compiled for features the binary does not assume, so they are not inlined)
# can take, against DPDK's hash inlined into its loop; and ours built for this CPU
# (`-C target-cpu=native`, as DPDK's program is built), where the kernels inline too.
# Needs Debian's libdpdk-dev and pkg-config (apt-get install -y libdpdk-dev pkg-config) and a
# CPU with AVX-512 and GFNI (rte_thash_gfni exists only there).
# Usage: bench/dpdk_thash.sh [ROUNDS]   (default 3; run from the repository root)
set -eu
here=$(dirname "$0")
rounds=${1:-3}
grep -qw gfni /proc/cpuinfo && grep -qw avx512f /proc/cpuinfo || {
    echo "this CPU has no AVX-512 with GFNI: rte_thash_gfni cannot run here" >&2
    exit 1
}
command -v pkg-config >/dev/null && pkg-config --exists libdpdk || {
    echo "DPDK not found: apt-get install -y libdpdk-dev pkg-config" >&2
    exit 1
}
out=${TMPDIR:-/tmp}/flowlane-dpdk-thash
# pkg-config's flags carry -march=corei7: -march=native after them, for GFNI and AVX-512.
cc -O3 -DALLOW_EXPERIMENTAL_API -Wno-deprecated-declarations -o "$out" "$here/dpdk_thash.c" \
    $(pkg-config --cflags --libs libdpdk) -march=native
cargo bench -p flowlane-rss --bench toeplitz --no-run >/dev/null 2>&1
# The same bench built for this CPU, as DPDK's program is: there the kernels inline into the
# loop (the shipped binary assumes x86-64-v2 and calls them).
native="env CARGO_TARGET_DIR=${TMPDIR:-/tmp}/flowlane-thash-native RUSTFLAGS=-Ctarget-cpu=native"
$native cargo bench -p flowlane-rss --bench toeplitz --no-run >/dev/null 2>&1
log=$(mktemp)
trap 'rm -f "$log"' EXIT
r=1
while [ "$r" -le "$rounds" ]; do
    dpdk=$("$out")
    ours=$(cargo bench -q -p flowlane-rss --bench toeplitz -- 'avx512-gfni-clmul|reference|call' \
        --warm-up-time 1 --measurement-time 2 2>/dev/null)
    inlined=$($native cargo bench -q -p flowlane-rss --bench toeplitz -- \
        'avx512-gfni-clmul_single|reference' --warm-up-time 1 --measurement-time 2 2>/dev/null)
    for len in 12 36; do
        for kind in single batch; do
            # DPDK's bulk call for our batch; the best sample (ns/hash) of each.
            d=$(echo "$dpdk" | awk -v l="${len}B" -v k="$kind" '$1 == l &&
                ((k == "single" && $2 == "rte_thash_gfni" && $3 == "single") ||
                 (k == "batch" && $2 == "rte_thash_gfni_bulk")) { print $(k == "single" ? 4 : 3) }')
            o=$(echo "$ours" | awk -v l="${len}B" -v k="$kind" \
                '$1 == l && $2 == "avx512-gfni-clmul" && $3 == k { print $6 }')
            x=$(echo "$o $d" | awk '{ printf "%.2f", $1 / $2 }')
            echo "round $r ${len}B $kind: DPDK $d ns, ours $o ns (${x}x DPDK's time)"
            echo "$len $kind $x" >>"$log"
            [ "$kind" = single ] || continue
            # The floor under any hash behind a call: a call that reads the tuple, no hash.
            f=$(echo "$ours" | awk -v l="${len}B" '$1 == l && $2 == "call" && $3 == "floor" { print $6 }')
            x=$(echo "$f $d" | awk '{ printf "%.2f", $1 / $2 }')
            echo "round $r ${len}B call floor: $f ns (${x}x DPDK's single)"
            echo "$len floor $x" >>"$log"
            n=$(echo "$inlined" | awk -v l="${len}B" '$1 == l && $3 == "single" { print $6 }')
            x=$(echo "$n $d" | awk '{ printf "%.2f", $1 / $2 }')
            echo "round $r ${len}B ours built for this CPU (inlined): $n ns (${x}x DPDK's time)"
            echo "$len inlined $x" >>"$log"
        done
    done
    r=$((r + 1))
done
for len in 12 36; do
    for kind in single inlined floor batch; do
        t=$(case $kind in single | inlined) [ "$len" = 12 ] && echo 0.5 || echo 0.7 ;; *) echo - ;; esac)
        awk -v l="$len" -v k="$kind" '$1 == l && $2 == k { print $3 }' "$log" | sort -n |
            awk -v l="$len" -v k="$kind" -v t="$t" '{ v[NR] = $1 } END {
                printf "%sB %s: %s / DPDK (rte_thash_gfni%s), median of %d rounds: %.2fx%s\n",
                    l, k, k == "floor" ? "a call with no hash" : k == "inlined" ? "ours built for this CPU" : "ours",
                    k == "batch" ? "_bulk" : "", NR, v[int((NR + 1) / 2)],
                    t == "-" ? "" : " (target <= " t "x)" }'
    done
done
