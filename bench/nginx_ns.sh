# Sourced by the HTTP bench scripts: checks that $bin (the flowlane binary) and every
# COMMAND:PACKAGE of $needs are there (else says what to install and exits 1), then starts one
# nginx worker (as in benches/http_loopback.rs) on CPU 1 in a private namespace, serving /64,
# /1k and /64k at http://198.18.0.1:8081/. Sets $ns and $dir, and a trap that stops nginx and
# removes both on exit. Needs root. With RPS_CPUS (a hex CPU mask, e.g. 2) the namespace's
# loopback hands every packet's receive processing to those CPUs (Receive Packet Steering)
# instead of the sending CPU's: RPS_CPUS=2 keeps the kernel's TCP work of both sides off the
# client's core, so its CPU time is its own.
for p in nginx:nginx-light $needs; do
    command -v "${p%%:*}" >/dev/null || {
        echo "${p%%:*} not found (apt-get install -y ${p#*:})" >&2
        exit 1
    }
done
[ -x "$bin" ] || {
    echo "no $bin: cargo build --release first" >&2
    exit 1
}
ns=flnginx$$
dir=$(mktemp -d)
trap 'kill $(cat "$dir/nginx.pid" 2>/dev/null) 2>/dev/null; ip netns del $ns 2>/dev/null; rm -rf "$dir"' EXIT INT TERM
mkdir -p "$dir/www"
head -c 64 /dev/zero | tr '\0' x >"$dir/www/64"
head -c 1024 /dev/zero | tr '\0' x >"$dir/www/1k"
head -c 65536 /dev/zero | tr '\0' x >"$dir/www/64k"
cat >"$dir/nginx.conf" <<EOC
daemon on; master_process off; worker_processes 1; user root; pid $dir/nginx.pid;
error_log $dir/error.log; worker_rlimit_nofile 20000;
events { worker_connections 19000; }
http {
  access_log off; sendfile on; tcp_nopush on; keepalive_requests 100000000;
  client_body_temp_path $dir; proxy_temp_path $dir; fastcgi_temp_path $dir;
  uwsgi_temp_path $dir; scgi_temp_path $dir;
  server { listen 198.18.0.1:8081 reuseport backlog=4096; root $dir/www; }
}
EOC
ip netns add $ns
ip -n $ns link set lo up
ip -n $ns addr add 198.18.0.1/32 dev lo
if [ -n "${RPS_CPUS:-}" ]; then
    ip netns exec $ns sh -c "echo $RPS_CPUS >/sys/class/net/lo/queues/rx-0/rps_cpus" || exit 1
    echo "loopback receive processing on CPU mask $RPS_CPUS (RPS)" >&2
fi
ip netns exec $ns taskset -c 1 nginx -p "$dir" -c "$dir/nginx.conf"
sleep 1
