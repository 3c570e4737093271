#!/bin/sh
# Does `rss verify` keep up (issue 51: >= 0.9x)? One generator (blast xdp-live, unpaced, 60-byte
# frames, CPU 0) into a one-queue veth end with NAPI (GRO on) whose frames the stack drops at
# once (nftables, prerouting): frames per second the receiving end took (its rx_packets),
# without and with `rss verify` on it, alternated ROUNDS times. The receiving CPU is the
# bottleneck, so the ratio is what recording each frame's NIC hash, queue and flow costs the
# receive path.
# Usage: bench/verify_rate.sh [FLOWLANE] [ROUNDS] [SECS]
set -eu
bin=${1:-target/release/flowlane}
rounds=${2:-3}
secs=${3:-3}
for p in nft ethtool python3; do
    command -v $p >/dev/null || { echo "$p is not installed"; exit 1; }
done
g=flvrg$$; d=flvrd$$
ip netns add $g; ip netns add $d
trap 'ip netns del $g 2>/dev/null || true; ip netns del $d 2>/dev/null || true; rm -f /tmp/$d.json' EXIT INT TERM
ip link add flg netns $g type veth peer fld netns $d
ip -n $g addr add 198.18.0.1/24 dev flg; ip -n $d addr add 198.18.0.2/24 dev fld
ip netns exec $g sysctl -qw net.ipv6.conf.flg.disable_ipv6=1
ip netns exec $d sysctl -qw net.ipv6.conf.fld.disable_ipv6=1
ip -n $g link set flg up; ip -n $d link set fld up
ip netns exec $d ethtool -K fld gro on
mac=$(ip -n $d -j link show fld | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["address"])')
ip netns exec $d nft add table inet flvr
ip netns exec $d nft add chain inet flvr pre '{ type filter hook prerouting priority -300; policy drop; }' 
rx() { ip -n $d -j -s link show fld | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["stats64"]["rx"]["packets"])'; }
send() {
    ip netns exec $g "$bin" blast --mode xdp-live --dev flg --to 198.18.0.2:9000 --dst-mac "$mac" \
        --sport 10000 --cpus 0 --duration "$secs" --quiet >/dev/null 2>&1 || true
}
plain() { b=$(rx); send; a=$(rx); echo $(( (a - b) / secs )); }
verified() {
    ip netns exec $d "$bin" rss verify --dev fld --duration $((secs + 2)) --json >/tmp/$d.json 2>/dev/null &
    v=$!
    sleep 1
    b=$(rx); send; a=$(rx)
    wait $v || true
    echo $(( (a - b) / secs ))
}
i=0
while [ $i -lt "$rounds" ]; do
    p=$(plain); v=$(verified)
    python3 -c "p,v=$p,$v; print(f'round {$i + 1}: plain {p} /s, verified {v} /s, ratio {v/p:.3f}')"
    i=$((i + 1))
done
python3 - "/tmp/$d.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
s = r["summary"]
print(f"last verify: {s['flows']} flows, {r['frames']} frames recorded, {r['uncounted_frames']} not recorded, NIC hash for {s['with_nic_hash']}")
PY
