#!/usr/bin/env bash
# The end-to-end test on real nodes: a Bootsman site on nine lab hosts (Linux namespaces running
# containerd, kubelet and kubeadm, with byoh-agent installed from the project's .deb), the sample
# BootsmanCluster built into a 3 + 3 cluster, a workload behind a Service, workers scaled 3 -> 4,
# the control plane 3 -> 5, a worker host killed and booted again, and the cluster deleted with
# every host reset and Available again. See e2e/src/main.rs for what each phase checks. Then
# `bootsmanctl install` on six lab hosts: the bootstrap control plane, enrolment with the printed
# tokens, the infrastructure cluster built to three Ready Nodes with the install killed (SIGKILL)
# half-way and resumed, Cluster API and Bootsman as Pods in it, the pivot into it (killed during
# and after it) and the bootstrap side's teardown, then a child cluster built by the
# infrastructure cluster from the three free hosts (e2e/src/bin/install.rs).
#
#   hack/e2e.sh        (as root; hack/test.sh runs it)
#
# It installs what it needs: the lab's Debian packages (hack/lab-packages), the lab's programs
# and images built from Go modules (hack/labbin, cached), the workspace's binaries and the
# agent's .deb (hack/package). It writes target/e2e/summary.json, target/e2e/nodes.json and
# target/e2e/install.json.
# Nothing on the machine outside the run's folders changes; `target/debug/bootsman-lab down`
# removes what a crashed run left.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; STEP_START=$SECONDS; }
done_step() { printf '    (%ss)\n' "$((SECONDS - STEP_START))"; }

if [[ $(id -u) -ne 0 || $(uname -s) != Linux ]]; then
  echo "hack/e2e.sh: lab hosts need root on Linux (network, mount and PID namespaces, overlay mounts)" >&2
  exit 1
fi

step "Debian packages of the lab hosts (hack/lab-packages)"
hack/lab-packages
done_step

step "lab programs and images (hack/labbin: kubelet, kubeadm, registry, CoreDNS, kube-router, ...; cached)"
hack/labbin >/dev/null
echo "    using $(hack/labbin --print-dir)"
done_step

step "Bootsman binaries (cargo build --bins) and the agent's .deb (hack/package)"
cargo build --quiet --locked --bins
hack/package >/dev/null
ls target/package/*.deb | sed 's/^/    /'
done_step

step "bootsman-e2e (lab hosts, real nodes)"
target/debug/bootsman-lab down
target/debug/bootsman-e2e
done_step

step "bootsman-e2e-install (bootsmanctl install on lab hosts: killed and resumed, pivot, child cluster)"
target/debug/bootsman-lab down
target/debug/bootsman-e2e-install
done_step
