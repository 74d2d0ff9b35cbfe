# hack/lib/versions.sh — the pinned versions of everything built from Go modules. Sourced by
# hack/testbin and hack/labbin; changing one changes the cache key of what depends on it.

# The test control plane (hack/testbin).
K8S_VERSION=1.36.3     # k8s.io/kubernetes; staging modules at v0.36.3 (derived)
ETCD_VERSION=3.6.16    # go.etcd.io/etcd/server/v3
HELM_VERSION=4.3.2     # helm.sh/helm/v4
CAPI_VERSION=1.13.6    # sigs.k8s.io/cluster-api (v1.13: root main, no replace; v1.14.x also handled)

# Lab hosts and their images (hack/labbin). kubelet, kubeadm, kube-scheduler and kube-proxy are
# K8S_VERSION; the etcd, CoreDNS and pause images are at the versions kubeadm K8S_VERSION asks
# for (read from its constants, never pinned here).
CRI_TOOLS_VERSION=1.37.0      # sigs.k8s.io/cri-tools (crictl)
DISTRIBUTION_VERSION=3.1.2    # github.com/distribution/distribution/v3 (the registry)
CRANE_VERSION=0.22.1          # github.com/google/go-containerregistry (crane)
KUBE_ROUTER_VERSION=2.1.0     # github.com/cloudnativelabs/kube-router/v2 (the lab's CNI: routes, NetworkPolicy)
