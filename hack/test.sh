#!/usr/bin/env bash
# The one command that runs every check of the project: formatting, lints, and all tests
# (unit tests and the integration tests against a real control plane).
#
#   hack/test.sh
#
# It installs what it needs by itself: the control-plane binaries are built from Go modules into
# a cache outside the repository (see hack/testbin) the first time, and reused afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; STEP_START=$SECONDS; }
done_step() { printf '    (%ss)\n' "$((SECONDS - STEP_START))"; }

step "toolchain: $(cargo --version), $(go version 2>/dev/null || echo 'go: missing')"
command -v cargo >/dev/null || { echo "cargo is required" >&2; exit 1; }
done_step

step "host tools: setpriv and unshare (no component outlives a test; namespaces of their own)"
missing=()
{ command -v setpriv >/dev/null && command -v unshare >/dev/null; } || missing+=(util-linux)
if ((${#missing[@]})); then
  echo "    installing ${missing[*]}"
  if [[ $(id -u) -eq 0 ]]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
  else
    echo "missing ${missing[*]}: install them (Debian packages) and rerun" >&2
    exit 1
  fi
fi
done_step

step "control-plane binaries (hack/testbin; built from Go modules on first use, cached afterwards)"
hack/testbin
BOOTSMAN_TESTBIN="$(hack/testbin --print-dir)"
export BOOTSMAN_TESTBIN
echo "    using $BOOTSMAN_TESTBIN"
done_step

step "lab hosts: Debian packages (hack/lab-packages), programs and images from Go modules (hack/labbin; cached)"
if [[ $(id -u) -eq 0 ]]; then
  hack/lab-packages
  hack/labbin
  echo "    using $(hack/labbin --print-dir)"
else
  echo "lab hosts need root: run hack/test.sh as root (CI does)" >&2
  exit 1
fi
done_step

step "packaging tools (hack/tools: cargo-deb, cargo-generate-rpm, rpm; cached afterwards)"
hack/tools >/dev/null
done_step

step "cargo fmt --check"
cargo fmt --all -- --check
done_step

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings
done_step

step "host agent packages (hack/package: the agent build profile, .deb and .rpm under target/package)"
hack/package
done_step

step "cargo test (unit and integration tests)"
cargo test --workspace --all-targets --locked --no-fail-fast
done_step

step "the agent's package and unit under a real systemd (hack/unit-vm.sh: an emulated Debian VM; writes target/e2e/unit-vm.json)"
hack/unit-vm.sh
done_step

step "end-to-end test on real nodes (hack/e2e.sh: 9 lab hosts; writes target/e2e/summary.json)"
hack/e2e.sh
done_step

step "the demo, short mode (hack/demo.sh --short: 6 lab hosts, the sample BootsmanCluster, 6 Ready Nodes)"
hack/demo.sh --short
done_step

printf '\nall checks passed\n'
