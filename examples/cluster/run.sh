#!/usr/bin/env bash
# Three `subc serve --cluster` brokers on one host (README, "Brokers on several hosts"; docs/cluster.md).
#
# Builds network namespaces (addresses inside them only; all removed on exit):
#   cxpub (publisher) --10.21.K.0/24-- cxbK (broker K, XDP on cxfK) --cxsK 10.31.0.1K-- bridge in cxsub (10.31.0.2)
#   cxbK --cxcK 10.41.0.1K-- bridge in cxctl (one etcd member, 10.41.0.100:2379)
# starts etcd and three brokers, subscribes a recovering receiver (subc listen --recover) to the BOB
# orders through broker 1, replays the real ITCH sample to all three brokers (a replicated feed),
# kills the receiver's broker with kill -9 half-way, and prints `subc cluster status` and what the
# receiver got: every message once and in order (as many as subc simulate counts), the gap left by
# the kill re-requested from a survivor ("recovered"), "lost" empty.  About a minute.  Needs root, the eBPF broker's setup (docs/ebpf.md) and
# Debian's etcd-server.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
spec="$root/examples/itch/spec.p4"
trace="$root/../shared/data/itch/ex20101224.TEST_ITCH_50"
[ -f "$trace" ] || trace="$root/examples/itch/data/ex20101224.TEST_ITCH_50"
[ "$(id -u)" = 0 ] || { echo "run as root" >&2; exit 2; }
command -v etcd >/dev/null || { echo "needs etcd (apt-get install etcd-server)" >&2; exit 2; }
subc=(python3 -m subc.cli)
work="$(mktemp -d /tmp/subc-cluster.XXXXXX)"
pids=()

cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    for k in 1 2 3; do
        [ -e /run/netns/cxb$k ] && nsenter --net=/run/netns/cxb$k "${subc[@]}" unload --iface cxf$k >/dev/null 2>&1 || true
    done
    for ns in cxpub cxsub cxctl cxb1 cxb2 cxb3; do ip netns del $ns 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT
inns() { local ns=$1; shift; nsenter --net=/run/netns/$ns "$@"; }  # (not for background jobs: $! would be a subshell)

for ns in cxpub cxsub cxctl cxb1 cxb2 cxb3; do ip netns add $ns; ip -n $ns link set lo up; done
ip -n cxsub link add br0 type bridge; ip -n cxsub addr add 10.31.0.2/24 dev br0; ip -n cxsub link set br0 up
ip -n cxctl link add br1 type bridge; ip -n cxctl addr add 10.41.0.100/24 dev br1; ip -n cxctl link set br1 up
for k in 1 2 3; do
    ip link add cxp$k netns cxpub type veth peer name cxf$k netns cxb$k
    ip -n cxpub addr add 10.21.$k.1/24 dev cxp$k; ip -n cxb$k addr add 10.21.$k.2/24 dev cxf$k
    ip -n cxpub link set cxp$k up; ip -n cxb$k link set cxf$k up
    ip netns exec cxpub ethtool -K cxp$k tx off >/dev/null
    ip link add cxs$k netns cxb$k type veth peer name cxq$k netns cxsub
    ip -n cxb$k addr add 10.31.0.1$k/24 dev cxs$k; ip -n cxb$k link set cxs$k up
    ip -n cxsub link set cxq$k master br0; ip -n cxsub link set cxq$k up
    ip netns exec cxsub ethtool -K cxq$k gro on >/dev/null
    ip link add cxc$k netns cxb$k type veth peer name cxr$k netns cxctl
    ip -n cxb$k addr add 10.41.0.1$k/24 dev cxc$k; ip -n cxb$k link set cxc$k up
    ip -n cxctl link set cxr$k master br1; ip -n cxctl link set cxr$k up
done

ip netns exec cxctl etcd --name e1 --data-dir "$work/etcd" --listen-client-urls http://10.41.0.100:2379 \
    --advertise-client-urls http://10.41.0.100:2379 --listen-peer-urls http://10.41.0.100:2380 \
    --initial-advertise-peer-urls http://10.41.0.100:2380 --initial-cluster e1=http://10.41.0.100:2380 \
    --logger zap --log-outputs "$work/etcd.log" >/dev/null 2>&1 &
pids+=($!)

cat >"$work/acl.toml" <<'EOF'
[[grant]]
source = "10.31.0.0/24"
to = ["10.31.0.0/24"]
EOF
declare -A broker
for k in 1 2 3; do
    nsenter --net=/run/netns/cxb$k "${subc[@]}" serve --spec "$spec" --iface cxf$k --listen 0.0.0.0:7000 --state "$work/b$k" \
        --acl "$work/acl.toml" --journal --rerequest 0.0.0.0:9100 \
        --cluster 10.41.0.100:2379 --node b$k --cluster-ttl 2 2>"$work/b$k.log" &
    broker[$k]=$!
    pids+=($!)
done
for k in 1 2 3; do
    until grep -q "^serving on" "$work/b$k.log"; do
        kill -0 "${broker[$k]}" 2>/dev/null || { cat "$work/b$k.log" >&2; exit 1; }
        sleep 0.2
    done
done
status() { inns cxctl "${subc[@]}" cluster status --cluster 10.41.0.100:2379 "$@"; }
until status --json | python3 -c 'import json,sys; d=json.load(sys.stdin); b=[r for r in d["brokers"] if r["live"]]; sys.exit(not (len(b)==3 and all(r["acknowledged"] for r in b)))'; do
    sleep 0.5
done
echo "== three brokers up"
status

# the subscriber: a TCP request (proven by its handshake) for its UDP endpoint, granted by the ACL
reply="$(inns cxsub bash -c 'exec 3<>/dev/tcp/10.31.0.11/7000; echo "SUBSCRIBE add_order.stock == \"BOB\" TO 10.31.0.2:6001" >&3; head -1 <&3')"
echo "== $reply (from broker 1)"
until status --json | python3 -c 'import json,sys; d=json.load(sys.stdin); sys.exit(not (d["owners"] and all(b["applied"] is not None and b["applied"] >= d["revision"] - 3 for b in d["brokers"] if b["live"])))'; do
    sleep 0.5
done
owner="$(status --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["owners"]["10.31.0.2:6001"][1:])')"
servers="10.31.0.1$owner:9100,10.31.0.1$(( owner % 3 + 1 )):9100,10.31.0.1$(( (owner + 1) % 3 + 1 )):9100"
echo "== broker $owner delivers to 10.31.0.2:6001; the receiver re-requests from $servers (in turn)"
nsenter --net=/run/netns/cxsub "${subc[@]}" listen 10.31.0.2:6001 --recover "$servers" --timeout 6 --json >"$work/listen.json" 2>/dev/null &
listener=$!
sleep 1
for k in 1 2 3; do
    nsenter --net=/run/netns/cxpub "${subc[@]}" replay "$trace" --to 10.21.$k.2:26400 --rate 1000 --spec "$spec" >/dev/null &
    pids+=($!)
done
sleep 3
echo "== kill -9 broker $owner (its kernel stops at its fence; its lease ends after 2 s)"
kill -9 "${broker[$owner]}"
wait "$listener" || true
echo "== after the fail-over"
status
want="$("${subc[@]}" simulate "$root/examples/itch/rules.sub" --spec "$spec" --trace "$trace" --json 2>/dev/null |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["per_port"]["1"])')"
echo "== the receiver (subc listen --recover); the sample's BOB orders (subc simulate, rules.sub port 1): $want"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print({k: d[k] for k in ("messages", "gaps", "recovered", "lost", "duplicates", "requests")})' "$work/listen.json"
