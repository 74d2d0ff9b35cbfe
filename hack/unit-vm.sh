#!/usr/bin/env bash
# The host agent's package and systemd unit under a real systemd: an emulated Debian 12 VM
# (QEMU without hardware acceleration) on the lab network installs the project's .deb with dpkg,
# its unit enrols the host, runs a bootstrap that checks what kubeadm needs of the system under
# the unit's hardening, and resets the host on release. See e2e/src/bin/unit_vm.rs.
#
#   hack/unit-vm.sh    (as root; hack/test.sh runs it)
#
# It installs what it needs: QEMU and the VM image (hack/vm-image, cached), the lab's packages
# and programs (hack/lab-packages, hack/labbin), the workspace's binaries and the agent's .deb
# (hack/package). It writes target/e2e/unit-vm.json. Nothing on the machine outside the run's
# folders changes; `target/debug/bootsman-lab down` removes what a crashed run left.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; STEP_START=$SECONDS; }
done_step() { printf '    (%ss)\n' "$((SECONDS - STEP_START))"; }

if [[ $(id -u) -ne 0 || $(uname -s) != Linux ]]; then
  echo "hack/unit-vm.sh: the VM needs root on Linux (a tap device in the lab's network namespace)" >&2
  exit 1
fi

step "the VM image (hack/vm-image: Debian 12 with systemd, QEMU; cached)"
hack/vm-image
echo "    using $(hack/vm-image --print-dir)"
done_step

step "the lab (hack/lab-packages, hack/labbin; cached)"
hack/lab-packages
hack/labbin >/dev/null
done_step

step "Bootsman binaries (cargo build --bins) and the agent's .deb (hack/package)"
cargo build --quiet --locked --bins
hack/package >/dev/null
done_step

step "bootsman-unit-vm (the agent's unit under systemd in an emulated VM)"
target/debug/bootsman-lab down
target/debug/bootsman-unit-vm
done_step
