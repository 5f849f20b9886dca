#!/usr/bin/env bash
# Measures one edge node with the load tool, each part in its own process:
# redis-server, nats-server (built from the module's dependency, with
# monitoring on), a fresh `presenced node`, and presence-load. Loopback
# only; everything it starts is stopped on exit. Ports are the first free
# ones from 6391 (Redis), 4231 (NATS), 8231 (NATS monitoring) and 8091
# (node), so two runs on one machine do not share a server.
#
#   scripts/load.sh idle         15,000 idle sessions: node RSS per session;
#                                node, Redis and NATS CPU per 10k sessions
#   scripts/load.sh latency      1,000 joins/s for 10 s: join -> online on
#                                NATS and on a watcher's WebSocket; fails if
#                                any online is missing, replaced by a resync
#                                or refused
#   scripts/load.sh latency-hog  the same with a 2-goroutine CPU hog beside
#                                the node (presence-load hog)
#   scripts/load.sh sweep        latency at 250,500,1000,1500,2000 joins/s
#   scripts/load.sh storm        1,000 joins at once into a room of 10,000
#   scripts/load.sh bigroom      big rooms (docs/PROTOCOL.md "Big rooms"): fill
#                                a room of 15,000 members taking `events`,
#                                churn it at 500 joins/s + 500 leaves/s for
#                                60 s, check sampled members' views, then a
#                                storm of 1,000 joins
#   scripts/load.sh bigroom-count  15,000 count-only watchers of a room of
#                                15,000 under the same churn
#   scripts/load.sh bigroom-watch  15,000 watchers of 50 users each of a
#                                room of 15,000 under the same churn
#   scripts/load.sh reconnect-storm  the reconnect storm: 200,000 sessions held
#                                by nodes that die, back within 60 s on this
#                                one Redis, through stand-ins for 14 nodes
#                                that use the node's join limiter and
#                                extender on the store (presence-load
#                                reconnect; no presenced is started):
#                                convergence, transitions on NATS, refusals,
#                                retry hints, Redis CPU. STORM_FLAGS or
#                                further arguments go to presence-load, e.g.
#                                --join-rate -1 --extend=false for the code
#                                before the limiter and the extender.
#   scripts/load.sh centrifugo   the side by side, in one run: Centrifugo
#                                v6.9.1 (built from the Go module proxy into
#                                the run's temp dir; CENTRIFUGO_BIN skips the
#                                build) with a channel of 15,000 subscribers
#                                taking join/leave pushes, filled, then churned
#                                at CF_RATES (default 2,5,10,20,50) joins/s +
#                                as many leaves/s, 20 s each, until it breaks;
#                                Centrifugo is then stopped and the bigroom
#                                members scenario runs against our nodes at
#                                each of BIG_RATES (default "20 500") for 20 s,
#                                no storm. Further arguments go to the
#                                Centrifugo run; BIG_FLAGS to the bigroom runs.
#
#   scripts/load.sh versus       the side by side as one table: presence (as
#                                idle and latency above: 15,000 sessions,
#                                1,000 joins/s), then Centrifugo v6.9.1 (as
#                                in centrifugo: built, or CENTRIFUGO_BIN;
#                                Redis engine on the same redis-server, JWT
#                                clients, join_leave) measured the same way
#                                (presence-load cf-idle, cf-latency), and
#                                once more with Centrifugo's joiners also
#                                asking for presence (cf-latency
#                                --cf-presence: the member list a join's
#                                snapshot gives); the latency runs are
#                                repeated, interleaved, VERSUS_REPEAT times
#                                (default 3); then
#                                join -> event p50/p99, RSS per idle session,
#                                CPU per 10k idle sessions and their ratios
#                                (presence-load versus); further flags go to
#                                the latency runs and the table, e.g.
#                                --rate 2000 --duration 5s. Latency and CPU
#                                mean something only on a quiet machine: the
#                                load average is printed with the table.
#
#   scripts/load.sh cluster      a region on a local Redis Cluster of MASTERS
#                                masters (default 3; 1 is a one-master
#                                cluster holding every slot), driven directly
#                                on the store by DRIVERS (default 4) processes
#                                standing in for nodes (presence-load region):
#                                seed SESSIONS (default 1,000,000) sessions,
#                                refresh them flat out for 20 s (throughput),
#                                then keep them alive on the node's heartbeat
#                                at the default timing, with every driver's
#                                reaper, 1 % churn a minute, the region's
#                                global publisher and an aggregator, and report
#                                Redis CPU per master, the longest gap between
#                                two refreshes of a session, the reaper's and
#                                the publisher's lag. No node is started.
#
# The bigroom modes start a second node of the same region (node B) for
# the room's population (bigroom-count, bigroom-watch) and the churners
# (all three): the measured node (A) then holds only what is measured, and
# each node stays under its connection limit and the 20,000 open files a
# process may hold (15,000 watchers + 15,000 members + churners do not fit
# on one node). A is started with --max-connections 17000 (15,000 members
# + 1,000 storm joiners + the truth reader), B with 18000 (under the 20,000 open files with its Redis, NATS and listeners).
#
# Further arguments go to presence-load and override its flags, e.g.
#   scripts/load.sh sweep --rates 250,500 --duration 5s
#   scripts/load.sh latency --rate 500
# Node B's population is a stand-in whose frames nobody measures: it runs
# with a small fan-out budget (NODEB_FLAGS, default --fanout-budget 2000)
# so that its count frames to 15,000 members, and to the churners (10,000
# a second at a budget of 10,000), neither starve its joins nor take the
# cores the measured node shares.
# LOAD_NATS=embedded (idle, latency, latency-hog, sweep, versus) runs
# the node on its embedded nats-server, one process as in a single-node
# deployment, instead of on a nats-server of its own; the stream's CPU is
# then in the node's. (Not PRESENCE_NATS: presenced reads every flag from
# PRESENCE_<FLAG>, and that one is --nats.)
# NODE_FLAGS adds flags to the measured node, e.g. NODE_FLAGS="--fanout-tick
# 250ms" scripts/load.sh bigroom. The node's log is checked for panics; on failure it and the other logs
# are kept and their path printed (KEEP_LOGS=1 keeps them always).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-idle}
shift || true
case $mode in
idle | latency | latency-hog | sweep | storm | bigroom | bigroom-count | bigroom-watch | centrifugo | versus | cluster | reconnect-storm) ;;
*)
	echo "usage: $0 idle|latency|latency-hog|sweep|storm|bigroom|bigroom-count|bigroom-watch|centrifugo|versus|cluster|reconnect-storm [presence-load flags]" >&2
	exit 2
	;;
esac

work=$(mktemp -d "${TMPDIR:-/tmp}/presence-load.XXXXXX")
bin=$work/bin
mkdir -p "$bin"
pids=()
ok=0
# stop PID: SIGTERM, then up to 10 s for it to exit, then SIGKILL.
stop() {
	kill "$1" 2>/dev/null || return 0
	for _ in $(seq 100); do
		kill -0 "$1" 2>/dev/null || break
		sleep 0.1
	done
	kill -9 "$1" 2>/dev/null || true
	wait "$1" 2>/dev/null || true
}
cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	# Stop exactly what this script started, one at a time in reverse
	# order: the node before the servers it uses.
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do stop "${pids[i]}"; done
	if [[ $ok == 1 && $rc == 0 && -z ${KEEP_LOGS:-} ]]; then
		rm -rf "$work"
	else
		echo "logs kept in $work (node log: $work/node.log)" >&2
		rm -rf "$bin"
	fi
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
	local p=$1
	while (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; do p=$((p + 1)); done
	echo "$p"
}
fail() {
	echo "load.sh: $*" >&2
	exit 1
}
# wait_for NAME PID CMD...: polls CMD until it succeeds (10 s at most),
# failing early if the process died.
wait_for() {
	local name=$1 pid=$2
	shift 2
	for _ in $(seq 100); do
		"$@" >/dev/null 2>&1 && return 0
		kill -0 "$pid" 2>/dev/null || fail "$name exited at startup; see $work/$name.log"
		sleep 0.1
	done
	fail "$name did not become ready in 10s; see $work/$name.log"
}

embedded_nats=0
case ${LOAD_NATS:-} in
'') ;;
embedded)
	case $mode in
	idle | latency | latency-hog | sweep | versus) embedded_nats=1 ;;
	*) fail "LOAD_NATS=embedded is for idle, latency, latency-hog, sweep and versus, not $mode" ;;
	esac
	;;
*) fail "LOAD_NATS must be empty or embedded, got '$LOAD_NATS'" ;;
esac

[[ $mode == cluster ]] || nice -n 10 go build -o "$bin/presenced" ./cmd/presenced
nice -n 10 go build -C cmd/presence-load -o "$bin/presence-load" .
nice -n 10 go build -o "$bin/nats-server" github.com/nats-io/nats-server/v2
if [[ $mode == centrifugo || $mode == versus ]]; then
	# Centrifugo v6 from the Go module proxy, into this run's temp dir (not
	# the repository). Its own go.mod decides its dependencies.
	if [[ -n ${CENTRIFUGO_BIN:-} ]]; then
		cp "$CENTRIFUGO_BIN" "$bin/centrifugo"
		echo "centrifugo: $CENTRIFUGO_BIN (CENTRIFUGO_BIN; not built)"
	else
		t0=$(date +%s)
		(cd "$work" && GOBIN=$bin GOFLAGS=-mod=mod nice -n 10 go install github.com/centrifugal/centrifugo/v6@v6.9.1) >"$work/centrifugo-build.log" 2>&1 ||
			fail "building centrifugo v6.9.1 failed; see $work/centrifugo-build.log"
		echo "centrifugo v6.9.1 built from the module proxy in $(($(date +%s) - t0))s"
	fi
fi

if [[ $mode == cluster ]]; then
	# MASTERS cluster-enabled redis-servers (no persistence), each with its
	# own cluster bus port; --cluster create needs three masters at least,
	# so a one-master cluster takes every slot with CLUSTER ADDSLOTSRANGE.
	masters=${MASTERS:-3}
	addrs=()
	port=6391
	for ((i = 0; i < masters; i++)); do
		port=$(free_port "$port")
		bus=$(free_port $((port + 100)))
		redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" --loglevel warning \
			--cluster-enabled yes --cluster-config-file "nodes-$port.conf" --cluster-port "$bus" >"$work/redis-$port.log" 2>&1 &
		pids+=($!)
		wait_for "redis-$port" $! redis-cli -h 127.0.0.1 -p "$port" ping
		addrs+=("127.0.0.1:$port")
		port=$((port + 1))
	done
	if ((masters >= 3)); then
		redis-cli --cluster create "${addrs[@]}" --cluster-replicas 0 --cluster-yes >"$work/cluster-create.log" 2>&1 ||
			fail "redis-cli --cluster create failed; see $work/cluster-create.log"
	else
		((masters == 1)) || fail "MASTERS must be 1 or at least 3"
		redis-cli -h 127.0.0.1 -p "${addrs[0]##*:}" cluster addslotsrange 0 16383 >/dev/null
	fi
	for a in "${addrs[@]}"; do
		wait_for "redis-${a##*:}" "${pids[0]}" bash -c "redis-cli -h 127.0.0.1 -p ${a##*:} cluster info | grep -q cluster_state:ok"
	done
	nport=$(free_port 4231)
	mport=$(free_port 8231)
	"$bin/nats-server" -a 127.0.0.1 -p "$nport" -m "$mport" -js -sd "$work/js" >"$work/nats.log" 2>&1 &
	pids+=($!)
	wait_for nats $! curl -sf "http://127.0.0.1:$mport/healthz"
	echo "tree: $(git rev-parse --short HEAD 2>/dev/null || echo '?') with $(git status --porcelain 2>/dev/null | wc -l) changed paths; $(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg)"
	echo "redis cluster: ${addrs[*]} (pids ${pids[*]:0:masters}); nats-server on :$nport"
	cluster=$(IFS=,; echo "${addrs[*]}")
	"$bin/presence-load" region --cluster "$cluster" --nats "nats://127.0.0.1:$nport" \
		--sessions "${SESSIONS:-1000000}" --drivers "${DRIVERS:-4}" "$@"
	ok=1
	exit 0
fi


rport=$(free_port 6391)
redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" --loglevel warning >"$work/redis.log" 2>&1 &
redis_pid=$!
pids+=("$redis_pid")
wait_for redis "$redis_pid" redis-cli -h 127.0.0.1 -p "$rport" ping

nport=$(free_port 4231)
mport=$(free_port 8231)
if ((embedded_nats)); then
	# The node's own, on nport; its JetStream under the run's temp dir.
	nats_pid=""
	natsarg=(--nats-port "$nport" --nats-store-dir "$work/js")
else
	"$bin/nats-server" -a 127.0.0.1 -p "$nport" -m "$mport" -js -sd "$work/js" >"$work/nats.log" 2>&1 &
	nats_pid=$!
	pids+=("$nats_pid")
	wait_for nats "$nats_pid" curl -sf "http://127.0.0.1:$mport/healthz"
	natsarg=(--nats "nats://127.0.0.1:$nport")
fi

if [[ $mode == reconnect-storm ]]; then
	echo "tree: $(git rev-parse --short HEAD 2>/dev/null || echo '?') with $(git status --porcelain 2>/dev/null | wc -l) changed paths; $(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg)"
	echo "redis pid $redis_pid on :$rport; nats-server pid $nats_pid on :$nport"
	rc=0
	"$bin/presence-load" reconnect --redis "127.0.0.1:$rport" --nats "nats://127.0.0.1:$nport" ${STORM_FLAGS:-} "$@" || rc=$?
	echo "redis: $(redis-cli -p "$rport" info memory | grep -E '^used_memory_human' | tr -d '\r')"
	[[ $rc == 0 ]] || { echo "load.sh: $mode FAILED (exit $rc)" >&2; exit "$rc"; }
	ok=1
	exit 0
fi

# Clients authenticate with HS256 tokens, as in production (each open
# connection then holds its token's expiry timer).
secret=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
lport=$(free_port 8091)
maxconn=()
[[ $mode == bigroom* || $mode == centrifugo ]] && maxconn=(--max-connections 17000)
"$bin/presenced" node --jwt-secret "$secret" --region load --redis "127.0.0.1:$rport" \
	"${natsarg[@]}" --listen "127.0.0.1:$lport" --log-level warn "${maxconn[@]}" ${NODE_FLAGS:-} \
	${PPROF:+--pprof-listen 127.0.0.1:6061} >"$work/node.log" 2>&1 &
node_pid=$!
pids+=("$node_pid")
wait_for node "$node_pid" curl -sf "http://127.0.0.1:$lport/healthz"
if [[ $mode == bigroom* || $mode == centrifugo ]]; then
	# Node B: the room's population and the churners.
	bport=$(free_port $((lport + 1)))
	"$bin/presenced" node --jwt-secret "$secret" --region load --redis "127.0.0.1:$rport" \
		--nats "nats://127.0.0.1:$nport" --listen "127.0.0.1:$bport" --log-level warn --max-connections 18000 ${PPROF:+--pprof-listen 127.0.0.1:6062} ${NODEB_FLAGS---fanout-budget 2000} \
		>"$work/nodeB.log" 2>&1 &
	nodeb_pid=$!
	pids+=("$nodeb_pid")
	wait_for nodeB "$nodeb_pid" curl -sf "http://127.0.0.1:$bport/healthz"
	echo "node B pid $nodeb_pid on 127.0.0.1:$bport (population and churners)"
fi

echo "tree: $(git rev-parse --short HEAD 2>/dev/null || echo '?') with $(git status --porcelain 2>/dev/null | wc -l) changed paths; $(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg)"
if ((embedded_nats)); then
	echo "node pid $node_pid on 127.0.0.1:$lport with its embedded nats-server on :$nport; redis pid $redis_pid on :$rport"
else
	echo "node pid $node_pid on 127.0.0.1:$lport; redis pid $redis_pid on :$rport; nats-server pid $nats_pid on :$nport (monitor :$mport)"
fi

common=(--addr "127.0.0.1:$lport" --jwt-secret "$secret")
cpu=(--redis "127.0.0.1:$rport" ${nats_pid:+--nats-pid "$nats_pid"})
lat=(--nats "nats://127.0.0.1:$nport" --region load)
# start_centrifugo ENGINE: Centrifugo on a free port (cport; its pid in
# cf_pid), ENGINE its engine's JSON; HS256 client tokens with the nodes'
# secret (the same tokens, "sub" the user); presence and join/leave in
# channels without a namespace, pushed to subscribers that ask with
# "join_leave":true.
start_centrifugo() {
	cport=$(free_port 8391)
	cat >"$work/centrifugo.json" <<EOF
{
  "http_server": {"address": "127.0.0.1", "port": $cport},
  "log": {"level": "warn"},
  "engine": $1,
  "health": {"enabled": true},
  "usage_stats": {"disabled": true},
  "client": {"token": {"hmac_secret_key": "$secret"}},
  "channel": {"without_namespace": {"presence": true, "join_leave": true,
    "allow_subscribe_for_client": true, "allow_presence_for_subscriber": true}}
}
EOF
	"$bin/centrifugo" --config "$work/centrifugo.json" >"$work/centrifugo.log" 2>&1 &
	cf_pid=$!
	pids+=("$cf_pid")
	wait_for centrifugo "$cf_pid" curl -sf "http://127.0.0.1:$cport/health"
}
# stop_centrifugo: the run fails if Centrifugo exited during it.
stop_centrifugo() {
	kill -0 "$cf_pid" 2>/dev/null || { echo "load.sh: centrifugo exited during the run; log: $work/centrifugo.log" >&2; rc=1; }
	stop "$cf_pid"
}
rc=0
case $mode in
idle) "$bin/presence-load" idle "${common[@]}" "${cpu[@]}" --sessions 15000 --hold 60s "$@" || rc=$? ;;
latency) "$bin/presence-load" latency "${common[@]}" "${cpu[@]}" "${lat[@]}" --rate 1000 --duration 10s "$@" || rc=$? ;;
latency-hog) "$bin/presence-load" latency "${common[@]}" "${cpu[@]}" "${lat[@]}" --rate 1000 --duration 10s --hog 2 "$@" || rc=$? ;;
sweep) "$bin/presence-load" sweep "${common[@]}" "${cpu[@]}" "${lat[@]}" --rates 250,500,1000,1500,2000 --duration 10s "$@" || rc=$? ;;
storm) "$bin/presence-load" storm "${common[@]}" --members 10000 --joiners 1000 "$@" || rc=$? ;;
bigroom*)
	scenario=members
	[[ $mode == bigroom-count ]] && scenario=count
	[[ $mode == bigroom-watch ]] && scenario=watch
	"$bin/presence-load" bigroom "${common[@]}" "${cpu[@]}" "${lat[@]}" --scenario "$scenario" --deflate="${BIG_DEFLATE:-true}" \
		--pop-addr "127.0.0.1:$bport" --node-pid "$node_pid" --pop-pid "$nodeb_pid" "$@" || rc=$?
	;;
centrifugo)
	start_centrifugo '{"type": "memory"}'
	echo "centrifugo pid $cf_pid on 127.0.0.1:$cport (config $work/centrifugo.json)"
	echo "=== Centrifugo v6.9.1"
	"$bin/presence-load" centrifugo --addr "127.0.0.1:$cport" --jwt-secret "$secret" --node-pid "$cf_pid" \
		--rates "${CF_RATES:-2,5,10,20,50}" "$@" || rc=$?
	stop_centrifugo
	for rate in ${BIG_RATES:-20 500}; do
		echo "=== presence bigroom members at $rate joins/s + $rate leaves/s"
		"$bin/presence-load" bigroom "${common[@]}" "${cpu[@]}" "${lat[@]}" --scenario members \
			--pop-addr "127.0.0.1:$bport" --node-pid "$node_pid" --pop-pid "$nodeb_pid" \
			--churn-rate "$rate" --churn-for 20s --storm 0 ${BIG_FLAGS:-} || rc=$?
	done
	;;
versus)
	# presence's idle first (a fresh node), then Centrifugo's on the same
	# Redis; then VERSUS_REPEAT (default 3) repetitions of the latency runs,
	# interleaved: presence (which waits for its users' offlines, so that
	# none falls in Centrifugo's run), Centrifugo, and Centrifugo with its
	# joiners asking for presence, as a client listing who is in the room
	# must (the work of a join's snapshot). Each run's log is kept for the
	# table.
	reps=${VERSUS_REPEAT:-3}
	[[ $reps =~ ^[1-9][0-9]*$ ]] || fail "VERSUS_REPEAT must be a positive integer, got '$reps'"
	"$bin/presence-load" idle "${common[@]}" "${cpu[@]}" --sessions 15000 --hold 60s | tee "$work/pr-idle.log" || rc=1
	start_centrifugo '{"type": "redis", "redis": {"address": "127.0.0.1:'"$rport"'"}}'
	echo "=== Centrifugo v6.9.1 pid $cf_pid on 127.0.0.1:$cport (Redis engine on :$rport)"
	cf=(--addr "127.0.0.1:$cport" --jwt-secret "$secret")
	"$bin/presence-load" cf-idle "${cf[@]}" --node-pid "$cf_pid" --sessions 15000 --hold 60s | tee "$work/cf-idle.log" || rc=1
	pr_logs=() cf_logs=() cfp_logs=()
	for ((i = 1; i <= reps; i++)); do
		echo "=== latency, run $i of $reps: presence"
		"$bin/presence-load" latency "${common[@]}" "${cpu[@]}" "${lat[@]}" --rate 1000 --duration 10s --quiesce 90s "$@" | tee "$work/pr-latency-$i.log" || rc=1
		echo "=== latency, run $i of $reps: Centrifugo"
		"$bin/presence-load" cf-latency "${cf[@]}" --node-pid "$cf_pid" --redis "127.0.0.1:$rport" --rate 1000 --duration 10s "$@" | tee "$work/cf-latency-$i.log" || rc=1
		echo "=== latency, run $i of $reps: Centrifugo, joiners reading presence"
		"$bin/presence-load" cf-latency "${cf[@]}" --node-pid "$cf_pid" --redis "127.0.0.1:$rport" --rate 1000 --duration 10s --cf-presence "$@" | tee "$work/cf-latency-presence-$i.log" || rc=1
		pr_logs+=("$work/pr-latency-$i.log") cf_logs+=("$work/cf-latency-$i.log") cfp_logs+=("$work/cf-latency-presence-$i.log")
	done
	stop_centrifugo
	echo "=== side by side: $reps latency runs a side, $(nproc) cores, load average now $(cut -d' ' -f1-3 /proc/loadavg)"
	rate=1000 # the table's: the last --rate given, as the runs read it
	args=("$@")
	for ((i = 0; i < ${#args[@]}; i++)); do
		[[ ${args[i]} == --rate ]] && rate=${args[i + 1]:-$rate}
		[[ ${args[i]} == --rate=* ]] && rate=${args[i]#--rate=}
	done
	list() { local IFS=,; echo "$*"; }
	"$bin/presence-load" versus --rate "$rate" --idle "$work/pr-idle.log" --latency "$(list "${pr_logs[@]}")" \
		--cf-idle "$work/cf-idle.log" --cf-latency "$(list "${cf_logs[@]}")" --cf-latency-presence "$(list "${cfp_logs[@]}")" || rc=1
	;;
esac

# The node must still be up, stop cleanly (SIGTERM: it drains), and leave
# a log free of panics and races.
if ! kill -0 "$node_pid" 2>/dev/null; then
	echo "load.sh: the node exited during the run; log: $work/node.log" >&2
	rc=1
fi
stop "$node_pid"
if [[ -n ${nodeb_pid:-} ]]; then
	kill -0 "$nodeb_pid" 2>/dev/null || { echo "load.sh: node B exited during the run; log: $work/nodeB.log" >&2; rc=1; }
	stop "$nodeb_pid"
fi
for log in "$work"/node*.log; do
	if grep -nE '^panic:|fatal error:|WARNING: DATA RACE|^goroutine [0-9]+ \[' "$log" >&2; then
		echo "load.sh: a node's log has a panic; log: $log" >&2
		rc=1
	fi
done
if [[ $rc != 0 ]]; then
	echo "load.sh: $mode FAILED (exit $rc); node log: $work/node.log" >&2
	exit "$rc"
fi
ok=1
