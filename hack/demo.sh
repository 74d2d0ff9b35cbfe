#!/usr/bin/env bash
# The local demo: a Bootsman infrastructure cluster on this machine and a child cluster of real
# nodes on lab hosts.
#
#   hack/demo.sh              run the demo, print what it reached, stop everything
#   hack/demo.sh --keep       leave it running until Ctrl-C, to explore with kubectl and crictl
#   hack/demo.sh --short      the same with a shorter wait
#   hack/demo.sh --simulated  simulated hosts instead of lab hosts (no root needed; see below)
#
# As root on Linux it runs on lab hosts (bootsman-lab demo; crates/lab): Linux namespaces on a
# lab network, each running containerd, a kubelet and kubeadm, with byoh-agent installed from
# the project's .deb; images come from a registry on the lab network. It applies
# config/samples/bootsmancluster.yaml (with the lab's changes, printed) and ends with six Ready
# Nodes of a real child cluster. It installs what it needs first: the Debian packages
# (hack/lab-packages), the lab's programs and images built from Go modules (hack/labbin,
# cached), the workspace's binaries and the agent's .deb (hack/package).
#
# With --simulated (and when not root) it runs the earlier demo: the real control plane of the
# test environment (etcd, kube-apiserver, kube-controller-manager and the Cluster API core,
# kubeadm bootstrap and kubeadm control-plane managers) on loopback, charts/bootsman installed
# with Helm, bootsman-provider and bootsman-operator with the chart's ServiceAccount tokens, 8
# byoh-agent processes as simulated hosts (3 control-plane, 5 workers; each with --root in its
# own folder, a one-time token from `bootsmanctl hosts token`, and a stand-in kubeadm that records
# its arguments), then the sample BootsmanCluster and its progress.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO="$PWD"

keep=0 wait_secs=240 simulated=0 lab_timeout=1200
for a in "$@"; do
  case "$a" in
    --keep) keep=1 ;;
    --short) wait_secs=120; lab_timeout=900 ;;
    --simulated) simulated=1 ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "unknown argument $a (see --help)" >&2; exit 2 ;;
  esac
done

if ((!simulated)) && [[ $(id -u) -ne 0 || $(uname -s) != Linux ]]; then
  echo "lab hosts need root on Linux; running the demo with simulated hosts (--simulated)" >&2
  simulated=1
fi

if ((!simulated)); then
  printf '\n\033[1m==> %s\033[0m\n' "what the lab needs: Debian packages, the lab's programs and images (cached), Bootsman binaries"
  hack/lab-packages
  hack/labbin >/dev/null
  cargo build --quiet --locked --bins
  hack/package >/dev/null
  args=(demo --timeout "$lab_timeout")
  ((keep)) && args+=(--keep)
  exec target/debug/bootsman-lab "${args[@]}"
fi

say() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
DEMO="${BOOTSMAN_DEMO_DIR:-$(mktemp -d /tmp/bootsman-demo.XXXXXX)}"
mkdir -p "$DEMO/logs"
PIDS=()
cleanup() {
  say "stopping (logs stay in $DEMO/logs)"
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "control-plane binaries and Bootsman binaries"
hack/testbin >/dev/null
BIN="$(hack/testbin --print-dir)/bin"
export PATH="$BIN:$PATH"
cargo build --quiet --locked -p bootsman-testenv -p bootsman-provider -p bootsman-operator -p byoh-agent -p bootsmanctl --bins
T="$REPO/target/debug"

say "control plane (etcd, kube-apiserver, kube-controller-manager, Cluster API managers)"
"$T/testenv" up --capi >"$DEMO/logs/testenv.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 300); do
  grep -q "control plane ready" "$DEMO/logs/testenv.log" && break
  kill -0 "${PIDS[0]}" 2>/dev/null || { cat "$DEMO/logs/testenv.log"; echo "the control plane did not start" >&2; exit 1; }
  sleep 1
done
grep -q "control plane ready" "$DEMO/logs/testenv.log" || { echo "the control plane did not start in 300 s" >&2; exit 1; }
export KUBECONFIG="$(sed -n 's/^  export KUBECONFIG=//p' "$DEMO/logs/testenv.log")"
SERVER="$(kubectl config view --raw --minify -o jsonpath='{.clusters[0].cluster.server}')"
echo "    API server $SERVER, KUBECONFIG=$KUBECONFIG"

say "helm install bootsman charts/bootsman (CRDs are already installed by the test environment)"
helm install bootsman charts/bootsman --namespace bootsman-system --create-namespace --skip-crds >"$DEMO/logs/helm.log"
kubectl -n bootsman-system get serviceaccounts,clusterrolebindings -l app.kubernetes.io/part-of=bootsman --no-headers 2>/dev/null | sed 's/^/    /' || true

# A kubeconfig with a token of the chart's ServiceAccount: the controllers get exactly the
# chart's RBAC, as they would in a Pod.
sa_kubeconfig() {
  local sa=$1 out="$DEMO/$1.kubeconfig"
  local token ca
  token="$(kubectl -n bootsman-system create token "$sa" --duration 24h)"
  ca="$(kubectl config view --raw --minify --flatten -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')"
  cat >"$out" <<KC
apiVersion: v1
kind: Config
clusters: [{name: demo, cluster: {server: "$SERVER", certificate-authority-data: "$ca"}}]
users: [{name: $sa, user: {token: "$token"}}]
contexts: [{name: $sa, context: {cluster: demo, user: $sa}}]
current-context: $sa
KC
  echo "$out"
}

say "bootsman-provider and bootsman-operator with the chart's ServiceAccount tokens"
KUBECONFIG="$(sa_kubeconfig bootsman-provider)" POD_NAMESPACE=bootsman-system \
  "$T/bootsman-provider" --metrics-bind-address 127.0.0.1:18080 --release-timeout 2m \
  >"$DEMO/logs/provider.log" 2>&1 &
PIDS+=($!)
KUBECONFIG="$(sa_kubeconfig bootsman-operator)" POD_NAMESPACE=bootsman-system \
  "$T/bootsman-operator" --metrics-bind-address 127.0.0.1:18081 \
  >"$DEMO/logs/operator.log" 2>&1 &
PIDS+=($!)
echo "    metrics: http://127.0.0.1:18080/metrics (provider), http://127.0.0.1:18081/metrics (operator)"

say "8 simulated hosts enrol with one-time tokens (bootsmanctl hosts token), each reporting its role as host.bootsman.io/role"
for i in 1 2 3 4 5 6 7 8; do
  name="host-$i"
  role=worker; ((i <= 3)) && role=control-plane
  dir="$DEMO/hosts/$name"
  mkdir -p "$dir/root/etc" "$dir/root/usr/bin" "$dir/state"
  printf 'ID=debian\nPRETTY_NAME="Simulated host (Bootsman demo)"\n' >"$dir/root/etc/os-release"
  printf '%032x\n' "$i" >"$dir/root/etc/machine-id"
  printf 'root:x:0:0:root:/root:/bin/sh\n' >"$dir/root/etc/passwd"
  printf 'root:x:0:\n' >"$dir/root/etc/group"
  echo "$name" >"$dir/root/etc/hostname"
  # The stand-in kubeadm records how the bootstrap data called it; a real host runs kubeadm.
  cat >"$dir/root/usr/bin/kubeadm" <<'SH'
#!/bin/sh
echo "kubeadm $*" >> "${BYOH_ROOT:-}/var/log/kubeadm-calls.log"
SH
  chmod +x "$dir/root/usr/bin/kubeadm"
  mkdir -p "$dir/root/var/log"
  "$T/bootsmanctl" hosts token --namespace default --name "$name" --ttl 30m >"$dir/bootstrap-kubeconfig"
  # CAPI's bootstrap commands use absolute paths (/run/cluster-api, /etc/kubernetes). As root,
  # each simulated host gets a private mount namespace whose /run and /etc are its own, and a
  # UTS namespace with its own host name (the Node name kubeadm would register).
  mkdir -p "$dir/root/run"
  wrap=()
  if [[ $(id -u) -eq 0 ]] && command -v unshare >/dev/null; then
    cp /etc/ld.so.cache /etc/nsswitch.conf /etc/hosts "$dir/root/etc/" 2>/dev/null || true
    wrap=(unshare --mount --uts --propagation private -- sh -c \
      'cat "$0/etc/hostname" >/proc/sys/kernel/hostname && mount --bind "$0/run" /run && mount --bind "$0/etc" /etc && exec "$@"' "$dir/root")
  fi
  "${wrap[@]}" "$T/byoh-agent" --namespace default --name "$name" --label "role=$role" \
    --bootstrap-kubeconfig "$dir/bootstrap-kubeconfig" --kubeconfig "$dir/state/kubeconfig" \
    --root "$dir/root" --state-dir "$dir/state" --heartbeat-interval 5s \
    --metrics-bind-address "127.0.0.1:$((19440 + i))" --log-format json \
    >"$DEMO/logs/$name.log" 2>&1 &
  PIDS+=($!)
done
for _ in $(seq 1 90); do
  n="$(kubectl -n default get byohosts --no-headers 2>/dev/null | wc -l)"
  ((n >= 8)) && break
  sleep 1
done
# Placement labels are the admin's: a host labels itself only under host.bootsman.io/.
say "the admin labels each host with its role (kubectl label byohost)"
for i in 1 2 3 4 5 6 7 8; do
  role=worker; ((i <= 3)) && role=control-plane
  kubectl -n default label byohost "host-$i" "role=$role" --overwrite >/dev/null
done
kubectl -n default get byohosts -L role,host.bootsman.io/role

# The sample's endpoint is an address on the hosts' network that kube-vip would hold. Here the
# stand-in control plane (below) serves it on a loopback address instead.
ENDPOINT_HOST=127.0.0.10
say "kubectl apply -f config/samples/bootsmancluster.yaml (3 control-plane, 3 workers; endpoint host $ENDPOINT_HOST)"
sed "s/^\(      host: \)[0-9.]*/\1$ENDPOINT_HOST/" config/samples/bootsmancluster.yaml | kubectl apply -f -

# Simulated hosts run the bootstrap data, but their kubeadm starts nothing. Once the first
# control-plane host has run `kubeadm init`, a stand-in control plane (real etcd and
# kube-apiserver with the cluster CA Cluster API generated) answers at the endpoint and registers
# a Node for each bootstrapped host, as the hosts' kubelets would.
"$T/testenv" workload --namespace default --cluster demo --dir "$DEMO/workload" \
  >"$DEMO/logs/workload.log" 2>&1 &
PIDS+=($!)

say "progress (up to ${wait_secs}s)"
last=""
stable=0
for ((t = 0; t < wait_secs; t += 3)); do
  machines="$(kubectl -n default get machines --no-headers 2>/dev/null | wc -l)"
  bound="$(kubectl -n default get byohosts -o jsonpath='{range .items[?(@.spec.machineRef)]}{.metadata.name}{"\n"}{end}' 2>/dev/null | grep -c . || true)"
  done_="$(kubectl -n default get byohosts -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="BootstrapSucceeded")].status}{"\n"}{end}' 2>/dev/null | grep -c True || true)"
  provisioned="$(kubectl -n default get machines -o jsonpath='{range .items[*]}{.status.phase}{"\n"}{end}' 2>/dev/null | grep -cE 'Provisioned|Running' || true)"
  running="$(kubectl -n default get machines -o jsonpath='{range .items[*]}{.status.phase}{"\n"}{end}' 2>/dev/null | grep -c Running || true)"
  nodes="$(grep -c "registered" "$DEMO/logs/workload.log" 2>/dev/null || true)"
  line="machines ${machines}, hosts claimed ${bound}/8, bootstrap executed on ${done_}, Nodes ${nodes}, machines Provisioned ${provisioned} (Running ${running})"
  if [[ "$line" != "$last" ]]; then printf '    [%3ss] %s\n' "$t" "$line"; last="$line"; stable=0; else stable=$((stable + 1)); fi
  # Everything a simulated site can reach (README, "What the demo's hosts do not do"): every
  # Machine bound, bootstrapped and Running, unchanged for 15 s.
  if ((machines > 1 && bound == machines && done_ == bound && running == machines && stable >= 5)); then break; fi
  sleep 3
done

say "where it got"
kubectl -n default get bootsmanclusters,clusters,kubeadmcontrolplanes,machinedeployments,machines 2>&1 | sed 's/^/    /'
kubectl -n default get byohosts -L role 2>&1 | sed 's/^/    /'
echo
echo "    BootsmanCluster conditions:"
kubectl -n default get bootsmancluster demo -o jsonpath='{range .status.conditions[*]}      {.type}={.status} {.reason}: {.message}{"\n"}{end}' 2>&1 || true
for h in "$DEMO"/hosts/*; do
  [[ -s "$h/root/var/log/kubeadm-calls.log" ]] && echo "    $(basename "$h"): $(tail -1 "$h/root/var/log/kubeadm-calls.log" | cut -c1-120)"
done
if [[ -s "$DEMO/workload/workload-admin.kubeconfig" ]]; then
  echo
  echo "    Nodes of the child cluster (stand-in control plane at https://$ENDPOINT_HOST):"
  kubectl --kubeconfig "$DEMO/workload/workload-admin.kubeconfig" get nodes -o wide 2>&1 | sed 's/^/      /'
fi

# What a simulated site reaches (README, "What the demo's hosts do not do"): every host enrols;
# the first control-plane Machine and the three workers are bound to distinct hosts that ran
# their `kubeadm init` / `kubeadm join` bootstrap data, and are Running with a Node. The kubeadm
# control-plane manager then waits for etcd members and static Pods no simulated host runs.
ok=1
enrolled="$(kubectl -n default get byohosts --no-headers 2>/dev/null | wc -l)"
((enrolled == 8)) || { echo "    FAILED: $enrolled of 8 hosts enrolled" >&2; ok=0; }
((machines >= 4)) || { echo "    FAILED: $machines Machines (expected the first control-plane Machine and 3 workers)" >&2; ok=0; }
((bound == machines && done_ == bound)) || { echo "    FAILED: $bound of $machines Machines bound to a host, bootstrap data executed on $done_" >&2; ok=0; }
owners="$(kubectl -n default get byohosts -o jsonpath='{range .items[?(@.spec.machineRef)]}{.spec.machineRef.name}{"\n"}{end}' | sort)"
[[ "$(uniq <<<"$owners")" == "$owners" ]] || { echo "    FAILED: a machine holds two hosts" >&2; ok=0; }

cat <<TXT

Explore (while it runs):
  export KUBECONFIG=$KUBECONFIG PATH=$BIN:\$PATH
  kubectl get bootsmanclusters,machines,byohosts -A
  kubectl describe bootsmancluster demo
  ls $DEMO/hosts/host-1/root        # what a host's bootstrap wrote
  kubectl --kubeconfig $DEMO/workload/workload-admin.kubeconfig get nodes   # the child cluster
  tail -f $DEMO/logs/provider.log
TXT

if ((keep)); then
  say "running until Ctrl-C"
  wait "${PIDS[0]}"
fi
((ok)) || exit 1
