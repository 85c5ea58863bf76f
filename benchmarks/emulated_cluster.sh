#!/usr/bin/env bash
# An emulated cluster on one host: each MPI rank runs in its own network namespace behind a
# rate-limited veth link, so ranks talk over real TCP at cluster-like bandwidth instead of
# shared memory (where compression cannot win). Runs `gradzip-bench allreduce` (or another
# gradzip-bench command, e.g. `overlap`) on it.
#
#   sudo benchmarks/emulated_cluster.sh [--ranks N] [--rate RATE] [--bench PATH]
#                                       [--command CMD] [-- BENCH ARGS...]
#   sudo benchmarks/emulated_cluster.sh [--ranks N] [--rate RATE] --exec -- PROGRAM [ARGS...]
#
#   --ranks N     ranks, one namespace each (default 4)
#   --ranks-per-node K  K consecutive ranks share one namespace (a "node"; default 1): they
#                 talk over the namespace's loopback, unlimited, and to other nodes over the
#                 node's one tc-limited link (N must be a multiple of K)
#   --rate RATE   tc rate of every link, both directions (default 1gbit; at 10gbit the 2 cores,
#                 not the links, are the bottleneck here)
#   --burst SIZE  tc tbf burst of every link (default 512kb). Messages below it pass at memory
#                 speed after an idle spell: 512kb suits TCP at 1 Gbit/s, but at 100 Mbit/s it
#                 is 42 ms of link time, so small-message timings there need a smaller one
#                 (64kb; tbf wants at least rate / HZ)
#   --bench PATH  the gradzip-bench binary (default build/bin/gradzip-bench)
#   --command CMD the gradzip-bench command to run: allreduce (default) or overlap
#   --mtu BYTES   MTU of the links (default 1500; 9000 = jumbo frames, as HPC Ethernet often
#                 runs: a sixth of the packets, so far less kernel CPU per byte on this host)
#   --exec -- PROGRAM ARGS  run PROGRAM ARGS as every rank instead of gradzip-bench (e.g.
#                 /usr/bin/python3 benchmarks/peers/ddp_peers.py); each rank's environment also
#                 has MASTER_ADDR=198.18.0.1 (rank 0) and GLOO_SOCKET_IFNAME=gzn<rank> (its link),
#                 so that torch.distributed's gloo talks over the emulated links too
#   BENCH ARGS    arguments of `gradzip-bench allreduce` (default: --size 67108864 and the
#                 default codecs none, fp16, qsgd:bits=4, qsgd:bits=8, sign, topk:ratio=0.01,
#                 randk:ratio=0.01)
#
# The recipe:
# - one bridge gzbr0 in the root namespace at 198.18.0.254/24 (the benchmarking range; nothing
#   else is addressed), one namespace per node gzns0 .. gzns{N/K-1}, node i at 198.18.0.(i+1)
#   on a veth pair (gzh<i> on the bridge, gzn<i> inside the namespace);
# - `tc qdisc ... tbf rate RATE burst BURST latency 20ms` on both ends of every pair;
# - mpirun with the TCP BTL on 198.18.0.0/24, ORTE's out-of-band and PMIx on the bridge, and
#   a wrapper that runs rank $OMPI_COMM_WORLD_RANK inside namespace gzns<rank / K> (K ranks per
#   node, 1 by default: a namespace per rank).
# Everything created is deleted again on exit: success, failure or Ctrl-C.
set -euo pipefail

ranks=4
rate=1gbit
burst=512kb
ranks_per_node=1
root_dir="$(cd "$(dirname "$0")/.." && pwd)"
bench="$root_dir/build/bin/gradzip-bench"
bench_args=()
command=allreduce
mtu=1500
program=()  # --exec: what every rank runs instead of gradzip-bench
exec_mode=0

# The comment block above, without the '#'.
usage() { sed -n '2,/^set -euo pipefail/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

while (($#)); do
  case "$1" in
    --ranks) ranks="${2:?--ranks needs a value}"; shift 2 ;;
    --rate) rate="${2:?--rate needs a value}"; shift 2 ;;
    --burst) burst="${2:?--burst needs a value}"; shift 2 ;;
    --ranks-per-node) ranks_per_node="${2:?--ranks-per-node needs a value}"; shift 2 ;;
    --bench) bench="${2:?--bench needs a value}"; shift 2 ;;
    --command) command="${2:?--command needs a value}"; shift 2 ;;
    --mtu) mtu="${2:?--mtu needs a value}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --exec) exec_mode=1; shift; [[ "${1:-}" == -- ]] && shift; program=("$@"); break ;;
    --) shift; bench_args=("$@"); break ;;
    *) bench_args=("$@"); break ;;
  esac
done
if ! [[ "$ranks_per_node" =~ ^[1-9][0-9]*$ ]] || ((ranks % ranks_per_node != 0)); then
  echo "emulated_cluster: --ranks-per-node $ranks_per_node must be a positive divisor of --ranks $ranks" >&2
  exit 2
fi
nodes=$((ranks / ranks_per_node))
if ((exec_mode && ${#program[@]} == 0)); then
  echo "emulated_cluster: --exec needs a program: --exec -- PROGRAM [ARGS...]" >&2
  exit 2
fi
if ((${#program[@]} == 0 && ${#bench_args[@]} == 0)) && [[ "$command" == allreduce ]]; then
  bench_args=(--size 67108864)
  for spec in none fp16 qsgd:bits=4 qsgd:bits=8 sign topk:ratio=0.01 randk:ratio=0.01; do
    bench_args+=(--codec "$spec")
  done
fi

if ! [[ "$ranks" =~ ^[0-9]+$ ]] || ((ranks < 1 || ranks > 253)); then
  echo "emulated_cluster: --ranks must be 1..253 (one address each in 198.18.0.0/24)" >&2
  exit 2
fi
if ! [[ "$mtu" =~ ^[0-9]+$ ]] || ((mtu < 576 || mtu > 65535)); then
  echo "emulated_cluster: --mtu must be 576..65535" >&2
  exit 2
fi
if [[ $(id -u) -ne 0 ]]; then
  echo "emulated_cluster: needs root (network namespaces, bridge, tc); run it with sudo" >&2
  exit 2
fi
for tool in ip tc mpirun; do
  command -v "$tool" >/dev/null || { echo "emulated_cluster: '$tool' not found" >&2; exit 2; }
done
if ((${#program[@]} == 0)) && [[ ! -x "$bench" ]]; then
  echo "emulated_cluster: $bench not found; build first (scripts/configure-and-build.sh)" >&2
  exit 2
fi

bridge=gzbr0
workdir="$(mktemp -d /tmp/gradzip-cluster.XXXXXX)"

mpirun_pid=
teardown() {
  local status=$?
  trap - EXIT INT TERM
  if [[ -n "$mpirun_pid" ]] && kill -0 "$mpirun_pid" 2>/dev/null; then
    kill -TERM "$mpirun_pid" 2>/dev/null || true  # mpirun takes its ranks down with it
    wait "$mpirun_pid" 2>/dev/null || true
  fi
  for ((i = 0; i < nodes; ++i)); do
    # Deleting the namespace deletes its veth end, and with it the peer on the bridge.
    ip netns delete "gzns$i" 2>/dev/null || true
    ip link delete "gzh$i" 2>/dev/null || true
  done
  ip link delete "$bridge" 2>/dev/null || true
  rm -rf "$workdir"
  echo "emulated_cluster: torn down (bridge $bridge, namespaces gzns0..gzns$((nodes - 1)))" >&2
  exit "$status"
}
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Leftovers of a run that was killed hard (SIGKILL skips the trap) would make `ip` fail below.
if ip link show "$bridge" >/dev/null 2>&1 || ip netns list | grep -q '^gzns'; then
  echo "emulated_cluster: removing leftovers of an earlier run" >&2
  for ns in $(ip netns list | awk '/^gzns/ {print $1}'); do ip netns delete "$ns"; done
  ip link delete "$bridge" 2>/dev/null || true
fi

echo "emulated_cluster: bridge $bridge at 198.18.0.254/24, nodes at 198.18.0.1..$nodes in namespaces" \
  "gzns0..gzns$((nodes - 1)) ($ranks_per_node rank(s) each), tbf $rate (burst $burst) on both ends" \
  "of every link, MTU $mtu" >&2
ip link add "$bridge" mtu "$mtu" type bridge
ip addr add 198.18.0.254/24 dev "$bridge"
ip link set "$bridge" up
for ((i = 0; i < nodes; ++i)); do
  ns="gzns$i"
  ip netns add "$ns"
  ip link add "gzh$i" mtu "$mtu" type veth peer name "gzn$i" mtu "$mtu"
  ip link set "gzn$i" netns "$ns"
  ip link set "gzh$i" master "$bridge"
  ip link set "gzh$i" up
  ip -n "$ns" link set lo up
  ip -n "$ns" addr add "198.18.0.$((i + 1))/24" dev "gzn$i"
  ip -n "$ns" link set "gzn$i" up
  tc qdisc add dev "gzh$i" root tbf rate "$rate" burst "$burst" latency 20ms
  ip netns exec "$ns" tc qdisc add dev "gzn$i" root tbf rate "$rate" burst "$burst" latency 20ms
done

cat >"$workdir/in_namespace.sh" <<'EOF'
#!/usr/bin/env bash
# Runs one MPI rank inside its node's namespace (gloo: rank 0's address, this node's link).
node=$((OMPI_COMM_WORLD_RANK / GZ_RANKS_PER_NODE))
export MASTER_ADDR=198.18.0.1 GLOO_SOCKET_IFNAME="gzn$node"
exec ip netns exec "gzns$node" "$@"
EOF
chmod +x "$workdir/in_namespace.sh"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Without this, ranks inside the namespaces fail in MPI_Init ("OPAL ERROR: Unreachable").
export PMIX_MCA_ptl_tcp_if_include="$bridge"
export GZ_RANKS_PER_NODE="$ranks_per_node"
if ((${#program[@]} == 0)); then
  program=("$bench" "$command" "${bench_args[@]}")
fi
echo "emulated_cluster: $ranks ranks, $rate links, ${program[*]}" >&2
# mpirun runs in the background and the script waits for it, so that INT / TERM reach the
# traps at once (bash runs traps only between commands) and teardown can stop it first.
mpirun -np "$ranks" --oversubscribe --bind-to none \
  --mca btl tcp,self --mca btl_tcp_if_include 198.18.0.0/24 \
  --mca oob_tcp_if_include "$bridge" -x PMIX_MCA_ptl_tcp_if_include -x GZ_RANKS_PER_NODE \
  "$workdir/in_namespace.sh" "${program[@]}" &
mpirun_pid=$!
wait "$mpirun_pid"
