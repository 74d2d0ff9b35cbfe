//! Validate: the CRD's CEL rules checked again in Rust, plus rules CEL cannot express, before
//! anything is rendered. An object stored before a rule existed (or written around admission)
//! is caught here: it gets `Stalled=True` with the violation and nothing is applied.

use std::net::IpAddr;

use ipnet::IpNet;

use bootsman_api::v1alpha1::{
    BootsmanClusterSpec, Cni, DEFAULT_IMAGE_GC_PERCENT, EVICTION_SIGNALS, Isolation, MetalLbMode,
};

/// One broken rule: the field and a message naming the rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// Path of the offending field, e.g. `spec.controlPlane.replicas`.
    pub field: String,
    /// What is wrong, ending with `(rule: <name>)`.
    pub message: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

fn v(field: impl Into<String>, message: impl Into<String>) -> Violation {
    Violation {
        field: field.into(),
        message: message.into(),
    }
}

/// Longest BootsmanCluster name: `<name>-control-plane` must fit a 63-character label value.
pub const MAX_NAME: usize = 49;

/// Every rule the BootsmanCluster `name` with `spec` breaks, in field order; empty when valid.
pub fn validate(name: &str, spec: &BootsmanClusterSpec) -> Vec<Violation> {
    let mut out = Vec::new();
    if name.len() > MAX_NAME {
        out.push(v(
            "metadata.name",
            format!(
                "metadata.name must be at most {MAX_NAME} characters (it has {}): the kubeadm control \
                 plane is named <name>-control-plane, and Cluster API puts that name in a label of at \
                 most 63 characters (rule: cluster-name-length)",
                name.len()
            ),
        ));
    }
    for (i, w) in spec.workers.iter().enumerate() {
        if name.len() + w.name.len() > 62 {
            out.push(v(
                format!("spec.workers[{i}].name"),
                "metadata.name and each spec.workers[].name together must be at most 62 characters: \
                 the pool's MachineDeployment is named <name>-<pool>, and Cluster API puts that name \
                 in a label of at most 63 characters (rule: worker-pool-name-length)",
            ));
        }
    }
    if !is_version(&spec.kubernetes_version) {
        out.push(v(
            "spec.kubernetesVersion",
            "kubernetesVersion must look like vX.Y.Z, e.g. v1.33.4 (rule: version-format)",
        ));
    }
    let cp = &spec.control_plane;
    if cp.replicas != 3 && cp.replicas != 5 {
        out.push(v(
            "spec.controlPlane.replicas",
            "controlPlane.replicas must be 3 or 5: etcd needs an odd number of members, and 3 or 5 \
             keep quorum when 1 or 2 fail (rule: control-plane-replicas-3-or-5)",
        ));
    }
    if cp.endpoint.host.trim().is_empty() {
        out.push(v(
            "spec.controlPlane.endpoint.host",
            "endpoint host must not be empty (rule: endpoint-host-required)",
        ));
    }
    if !(1..=65535).contains(&cp.endpoint.port) {
        out.push(v(
            "spec.controlPlane.endpoint.port",
            "endpoint port must be between 1 and 65535 (rule: endpoint-port-range)",
        ));
    }
    if spec.workers.is_empty() || spec.workers.len() > 32 {
        out.push(v(
            "spec.workers",
            "there must be between 1 and 32 worker pools (rule: worker-pools-count)",
        ));
    }
    let pool_names: Vec<&str> = spec.workers.iter().map(|w| w.name.as_str()).collect();
    check_names(
        &mut out,
        &pool_names,
        "spec.workers",
        "worker pool name must be a DNS-1123 label: lower-case letters, digits and '-', \
         starting and ending with a letter or digit (rule: worker-pool-name-dns1123)",
        "worker pool names must be unique (rule: worker-pool-names-unique)",
    );
    for (i, w) in spec.workers.iter().enumerate() {
        if !(0..=1000).contains(&w.replicas) {
            out.push(v(
                format!("spec.workers[{i}].replicas"),
                "worker pool replicas must be between 0 and 1000 (rule: worker-replicas-range)",
            ));
        }
    }
    let total: i64 = spec.workers.iter().map(|w| i64::from(w.replicas)).sum();
    if total < 3 && !(spec.control_plane.schedulable && total == 0) {
        out.push(v(
            "spec.workers",
            "the worker pools must have at least 3 replicas in total, or none when controlPlane.schedulable is \
             true (rule: worker-replicas-min-3)",
        ));
    }
    let net = &spec.network;
    let pod = parse_cidr(&net.pod_cidr);
    let svc = parse_cidr(&net.service_cidr);
    if pod.is_none() {
        out.push(v(
            "spec.network.podCIDR",
            "network.podCIDR must be a CIDR such as 10.244.0.0/16 (rule: pod-cidr-format)",
        ));
    }
    if svc.is_none() {
        out.push(v(
            "spec.network.serviceCIDR",
            "network.serviceCIDR must be a CIDR such as 10.96.0.0/12 (rule: service-cidr-format)",
        ));
    }
    if let Some(s) = svc
        && s.prefix_len() < if s.addr().is_ipv4() { 12 } else { 108 }
    {
        out.push(v(
            "spec.network.serviceCIDR",
            "network.serviceCIDR may be at most a /12 (IPv4) or a /108 (IPv6): kube-apiserver \
             refuses larger service ranges (rule: service-cidr-size)",
        ));
    }
    if let (Some(p), Some(s)) = (pod, svc)
        && p.addr().is_ipv4() != s.addr().is_ipv4()
    {
        out.push(v(
            "spec.network",
            "network.podCIDR and network.serviceCIDR must be of one address family; dual-stack is \
             not supported (rule: network-cidrs-same-family)",
        ));
    }
    if let (Some(p), Some(s)) = (pod, svc)
        && overlaps(&p, &s)
    {
        out.push(v(
            "spec.network",
            "network.podCIDR and network.serviceCIDR must not overlap (rule: network-cidrs-disjoint)",
        ));
    }
    // Not expressible in the CRD: the endpoint VIP must be reachable on the hosts' network, so
    // it cannot lie inside the cluster's own pod or service network.
    if let Ok(ip) = cp.endpoint.host.parse::<IpAddr>() {
        for (c, field) in [(pod, "podCIDR"), (svc, "serviceCIDR")] {
            if c.is_some_and(|c| c.contains(&ip)) {
                out.push(v(
                    "spec.controlPlane.endpoint.host",
                    format!(
                        "endpoint host {ip} lies inside network.{field}; the endpoint must be an \
                         address on the hosts' network (rule: endpoint-outside-cluster-networks)"
                    ),
                ));
            }
        }
    }
    if let Some(iso) = &net.isolation {
        validate_isolation(&mut out, iso, net.cni, pod);
    }
    if let Some(repo) = &spec.image_repository
        && !is_image_repository(repo)
    {
        out.push(v(
            "spec.imageRepository",
            "imageRepository must be a registry host (with an optional port) and an optional path, \
             without a scheme or a trailing '/', e.g. registry.example.internal/k8s (rule: image-repository-format)",
        ));
    }
    for (i, c) in spec.nodes.ignore_preflight_errors.iter().enumerate() {
        let named = c.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && c.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-');
        if !named || c.eq_ignore_ascii_case("all") {
            out.push(v(
                format!("spec.nodes.ignorePreflightErrors[{i}]"),
                "each ignorePreflightErrors entry must name one kubeadm preflight check, e.g. NumCPU; \
                 'all' is refused (rule: preflight-check-names)",
            ));
        }
    }
    let kubelet = &spec.nodes.kubelet;
    for (signal, threshold) in &kubelet.eviction_hard {
        let field = format!("spec.nodes.kubelet.evictionHard[{signal}]");
        if !EVICTION_SIGNALS.contains(&signal.as_str()) {
            out.push(v(
                field.clone(),
                "each evictionHard key must be a kubelet eviction signal: memory.available, \
                 allocatableMemory.available, nodefs.available, nodefs.inodesFree, imagefs.available, \
                 imagefs.inodesFree, containerfs.available, containerfs.inodesFree or pid.available \
                 (rule: eviction-signal)",
            ));
        }
        if !is_eviction_threshold(threshold) {
            out.push(v(
                field,
                "each evictionHard threshold must be a percentage from 0% to 100% or a positive \
                 quantity such as 500Mi (rule: eviction-threshold)",
            ));
        }
    }
    let (high, low) = DEFAULT_IMAGE_GC_PERCENT;
    let high = kubelet.image_gc_high_threshold_percent.unwrap_or(high);
    let low = kubelet.image_gc_low_threshold_percent.unwrap_or(low);
    if low >= high {
        out.push(v(
            "spec.nodes.kubelet",
            "imageGCLowThresholdPercent must be below imageGCHighThresholdPercent (the kubelet's \
             defaults are 80 and 85 when one is not set) (rule: image-gc-thresholds)",
        ));
    }
    let mlb = &spec.load_balancer.metallb;
    if mlb.mode != MetalLbMode::Bgp {
        out.push(v(
            "spec.loadBalancer.metallb.mode",
            "metallb.mode must be BGP: L2 mode is refused because one node answers for each \
             service IP, making it a traffic bottleneck and a slow failover point (rule: metallb-bgp-only)",
        ));
    }
    if mlb.enabled && (mlb.bgp_peers.is_empty() || mlb.address_pools.is_empty()) {
        out.push(v(
            "spec.loadBalancer.metallb",
            "metallb.enabled needs at least one bgpPeers entry and one addressPools entry (rule: metallb-bgp-config)",
        ));
    }
    for (i, peer) in mlb.bgp_peers.iter().enumerate() {
        if peer.peer_address.parse::<IpAddr>().is_err() {
            out.push(v(
                format!("spec.loadBalancer.metallb.bgpPeers[{i}].peerAddress"),
                "bgpPeers[].peerAddress must be an IP address such as 10.0.0.1 (rule: metallb-peer-address)",
            ));
        }
    }
    let pool_names: Vec<&str> = mlb.address_pools.iter().map(|p| p.name.as_str()).collect();
    check_names(
        &mut out,
        &pool_names,
        "spec.loadBalancer.metallb.addressPools",
        "address pool name must be a DNS-1123 label (rule: address-pool-name-dns1123)",
        "address pool names must be unique (rule: address-pool-names-unique)",
    );
    let endpoint = cp.endpoint.host.parse::<IpAddr>().ok();
    for (i, pool) in mlb.address_pools.iter().enumerate() {
        let field = format!("spec.loadBalancer.metallb.addressPools[{i}].addresses");
        if pool.addresses.is_empty() {
            out.push(v(
                &field,
                "an address pool needs at least one addresses entry (rule: address-pool-addresses)",
            ));
        }
        for a in &pool.addresses {
            let overlaps = match (parse_cidr(a), parse_range(a)) {
                (Some(c), _) => {
                    [pod, svc].iter().flatten().any(|n| overlaps(n, &c))
                        || endpoint.is_some_and(|ip| c.contains(&ip))
                }
                (None, Some((first, last))) => {
                    if first > last {
                        out.push(v(
                            &field,
                            format!(
                                "{a:?}: a range must go from the lower address to the higher \
                                 (rule: address-pool-range-order)"
                            ),
                        ));
                    }
                    [pod, svc]
                        .iter()
                        .flatten()
                        .any(|n| range_overlaps(n, first, last))
                        || endpoint.is_some_and(|ip| in_range(ip, first, last))
                }
                (None, None) => {
                    out.push(v(
                        &field,
                        format!(
                            "{a:?}: each addresses entry must be a CIDR such as 10.0.10.0/24 or a range \
                             first-last of two IP addresses of one family, such as 10.0.10.5-10.0.10.9 \
                             (rule: address-pool-addresses)"
                        ),
                    ));
                    false
                }
            };
            if overlaps {
                out.push(v(
                    &field,
                    format!(
                        "{a:?} overlaps network.podCIDR, network.serviceCIDR or the control-plane \
                         endpoint; service IPs must come from the hosts' network, apart from both \
                         (rule: address-pool-overlap)"
                    ),
                ));
            }
        }
    }
    out
}

/// `first-last`: two IP addresses of one family (spaces around either allowed).
fn parse_range(s: &str) -> Option<(IpAddr, IpAddr)> {
    let (a, b) = s.split_once('-')?;
    let (a, b): (IpAddr, IpAddr) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
    (a.is_ipv4() == b.is_ipv4()).then_some((a, b))
}

/// The rules of `spec.network.isolation`.
fn validate_isolation(out: &mut Vec<Violation>, iso: &Isolation, cni: Cni, pod: Option<IpNet>) {
    let names: Vec<&str> = iso.projects.iter().map(|p| p.name.as_str()).collect();
    check_names(
        out,
        &names,
        "spec.network.isolation.projects",
        "network.isolation project name must be a DNS-1123 label (rule: isolation-project-name-dns1123)",
        "network.isolation project names must be unique (rule: isolation-project-names-unique)",
    );
    let mut seen: Vec<&str> = Vec::new();
    for (i, p) in iso.projects.iter().enumerate() {
        let field = format!("spec.network.isolation.projects[{i}].namespaces");
        for n in &p.namespaces {
            if !bootsman_api::identity::is_dns_label(n) {
                out.push(v(
                    &field,
                    "network.isolation namespaces must be DNS-1123 labels (rule: isolation-namespace-dns1123)",
                ));
            }
            if ["kube-system", "kube-public", "kube-node-lease", "ingress-nginx"].contains(&n.as_str()) {
                out.push(v(
                    &field,
                    "network.isolation cannot isolate kube-system, kube-public, kube-node-lease or \
                     ingress-nginx: the cluster's own components live there (rule: isolation-namespace-reserved)",
                ));
            }
            if seen.contains(&n.as_str()) {
                out.push(v(
                    "spec.network.isolation",
                    "a namespace belongs to one project of network.isolation (rule: isolation-namespace-once)",
                ));
            }
            seen.push(n);
        }
    }
    if cni != Cni::Cilium && iso.host_networks.is_empty() {
        out.push(v(
            "spec.network",
            "network.isolation.hostNetworks must list the hosts' networks when the CNI is not \
             cilium: NetworkPolicies admit a hostNetwork ingress controller and the kubelets' \
             probes by address (rule: isolation-host-networks-required)",
        ));
    }
    for c in &iso.host_networks {
        match parse_cidr(c) {
            None => out.push(v(
                "spec.network.isolation.hostNetworks",
                "network.isolation.hostNetworks entries must be CIDRs such as 10.0.0.0/24 \
                 (rule: isolation-host-networks-format)",
            )),
            Some(c) if pod.is_some_and(|p| overlaps(&p, &c)) => out.push(v(
                "spec.network",
                "network.isolation.hostNetworks must not overlap network.podCIDR: every pod would \
                 be admitted into every project (rule: isolation-host-networks-outside-pods)",
            )),
            Some(_) => {}
        }
    }
}

/// Each name must be a DNS-1123 label and unique within `names`.
fn check_names(out: &mut Vec<Violation>, names: &[&str], list: &str, bad: &str, dup: &str) {
    for (i, n) in names.iter().enumerate() {
        if !bootsman_api::identity::is_dns_label(n) {
            out.push(v(format!("{list}[{i}].name"), bad));
        }
        if names[..i].contains(n) {
            out.push(v(format!("{list}[{i}].name"), dup));
        }
    }
}

fn is_version(s: &str) -> bool {
    let Some(rest) = s.strip_prefix('v') else {
        return false;
    };
    let parts: Vec<&str> = rest.split('.').collect();
    parts.len() == 3
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// `host[:port][/path...]`: lower-case DNS labels or an IPv4 address, an optional port of up to
/// five digits, path components of `[a-z0-9._-]` starting and ending alphanumerically.
fn is_image_repository(s: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let component = |c: &str, extra: &[u8]| {
        let b = c.as_bytes();
        !b.is_empty()
            && alnum(b[0])
            && alnum(b[b.len() - 1])
            && b.iter().all(|x| alnum(*x) || extra.contains(x))
    };
    let mut parts = s.split('/');
    let host_port = parts.next().unwrap_or_default();
    let (host, port) = match host_port.split_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (host_port, None),
    };
    bootsman_api::identity::is_dns_subdomain(host)
        && port.is_none_or(|p| (1..=5).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit()))
        && parts.all(|c| component(c, b"._-"))
}

/// A CIDR block such as `10.244.0.0/16` (host bits may be set, as Kubernetes allows).
fn parse_cidr(s: &str) -> Option<IpNet> {
    s.parse().ok()
}

/// Whether two CIDR blocks share an address (one holds the other).
fn overlaps(a: &IpNet, b: &IpNet) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

/// Whether `ip` lies in the range `first-last` (of one family).
fn in_range(ip: IpAddr, first: IpAddr, last: IpAddr) -> bool {
    ip.is_ipv4() == first.is_ipv4() && first <= ip && ip <= last
}

/// Whether the range `first-last` shares an address with the block `n`.
fn range_overlaps(n: &IpNet, first: IpAddr, last: IpAddr) -> bool {
    n.network().is_ipv4() == first.is_ipv4() && first <= n.broadcast() && n.network() <= last
}

/// A kubelet eviction threshold: `N%` with N from 0 to 100, or a positive Kubernetes quantity.
fn is_eviction_threshold(t: &str) -> bool {
    if let Some(pct) = t.strip_suffix('%') {
        let (whole, frac) = pct.split_once('.').unwrap_or((pct, "0"));
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        return whole.len() <= 3
            && digits(whole)
            && digits(frac)
            && pct.parse::<f64>().is_ok_and(|p| p <= 100.0);
    }
    is_positive_quantity(t)
}

/// A Kubernetes quantity (`<sign><digits>[.<digits>]<suffix>`, the suffix a binary SI suffix
/// `Ki`…`Ei`, a decimal SI suffix `n u m k M G T P E`, or an exponent `e3`) above zero.
fn is_positive_quantity(q: &str) -> bool {
    let unsigned = q.strip_prefix('+').unwrap_or(q);
    let number_end = unsigned
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(unsigned.len());
    let (number, suffix) = unsigned.split_at(number_end);
    let digits = number.bytes().filter(u8::is_ascii_digit).count();
    let well_formed_number = digits > 0 && number.matches('.').count() <= 1;
    let exponent = |s: &str| {
        let s = s.strip_prefix(['+', '-']).unwrap_or(s);
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
    };
    let well_formed_suffix = matches!(
        suffix,
        "" | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" | "n" | "u" | "m" | "k" | "M" | "G" | "T" | "P" | "E"
    ) || suffix.strip_prefix(['e', 'E']).is_some_and(exponent);
    well_formed_number && well_formed_suffix && number.bytes().any(|b| (b'1'..=b'9').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> BootsmanClusterSpec {
        serde_json::from_value(serde_json::json!({
            "kubernetesVersion": "v1.33.4",
            "controlPlane": {"replicas": 3, "endpoint": {"host": "10.0.0.10", "port": 6443}},
            "workers": [{"name": "a", "replicas": 3}],
        }))
        .unwrap()
    }

    fn rules(spec: &BootsmanClusterSpec) -> Vec<String> {
        validate("demo", spec)
            .into_iter()
            .map(|v| {
                v.message
                    .rsplit("(rule: ")
                    .next()
                    .unwrap()
                    .trim_end_matches(')')
                    .to_string()
            })
            .collect()
    }

    #[test]
    fn isolation_rules_are_reported_by_name() {
        let with = |cni: &str, iso: serde_json::Value| {
            let mut s = sample();
            s.network = serde_json::from_value(serde_json::json!({"cni": cni, "isolation": iso})).unwrap();
            rules(&s)
        };
        let p = |name: &str, ns: &[&str]| serde_json::json!({"name": name, "namespaces": ns});
        assert!(
            with(
                "cilium",
                serde_json::json!({"projects": [p("a", &["x"]), p("b", &["y"])]})
            )
            .is_empty()
        );
        assert!(
            with(
                "kube-router",
                serde_json::json!({"projects": [p("a", &["x"])], "hostNetworks": ["10.0.0.0/24"]})
            )
            .is_empty()
        );
        assert_eq!(
            with(
                "cilium",
                serde_json::json!({"projects": [p("a", &["x"]), p("a", &["y"])]})
            ),
            ["isolation-project-names-unique"]
        );
        assert_eq!(
            with(
                "cilium",
                serde_json::json!({"projects": [p("a", &["x"]), p("b", &["x"])]})
            ),
            ["isolation-namespace-once"]
        );
        assert_eq!(
            with(
                "cilium",
                serde_json::json!({"projects": [p("a", &["kube-system", "X"])]})
            ),
            ["isolation-namespace-reserved", "isolation-namespace-dns1123"]
        );
        assert_eq!(
            with("kube-router", serde_json::json!({"projects": [p("a", &["x"])]})),
            ["isolation-host-networks-required"]
        );
        assert_eq!(
            with(
                "kube-router",
                serde_json::json!({"projects": [p("a", &["x"])], "hostNetworks": ["10.0.0.0/8", "nope"]})
            ),
            [
                "isolation-host-networks-outside-pods",
                "isolation-host-networks-format"
            ]
        );
    }

    #[test]
    fn sample_is_valid() {
        assert!(validate("demo", &sample()).is_empty());
    }

    #[test]
    fn each_rule_is_reported_by_name() {
        let mut s = sample();
        s.control_plane.replicas = 4;
        assert_eq!(rules(&s), ["control-plane-replicas-3-or-5"]);

        let mut s = sample();
        s.workers[0].replicas = 2;
        assert_eq!(rules(&s), ["worker-replicas-min-3"]);

        let mut s = sample();
        s.workers.push(s.workers[0].clone());
        assert_eq!(rules(&s), ["worker-pool-names-unique"]);

        let mut s = sample();
        s.network.pod_cidr = "10.96.0.0/16".into();
        assert_eq!(rules(&s), ["network-cidrs-disjoint"]);

        let mut s = sample();
        s.network.service_cidr = "10.96.0.0/33".into();
        assert_eq!(rules(&s), ["service-cidr-format"]);

        let mut s = sample();
        s.control_plane.endpoint.host = "10.244.1.1".into();
        assert_eq!(rules(&s), ["endpoint-outside-cluster-networks"]);

        let mut s = sample();
        s.kubernetes_version = "1.33".into();
        assert_eq!(rules(&s), ["version-format"]);

        for (repo, ok) in [
            ("registry.example.internal/k8s", true),
            ("10.20.0.5:5000", true),
            ("172.31.77.1:5000/mirror/registry.k8s.io", true),
            ("https://registry.example.internal", false),
            ("registry.example.internal/", false),
            ("Registry.Example", false),
            ("reg:port", false),
        ] {
            let mut s = sample();
            s.image_repository = Some(repo.into());
            let want: &[&str] = if ok { &[] } else { &["image-repository-format"] };
            assert_eq!(rules(&s), want, "{repo}");
        }

        for bad in ["all", "ALL", "two words", "-x"] {
            let mut s = sample();
            s.nodes.ignore_preflight_errors = vec![bad.into()];
            assert_eq!(rules(&s), ["preflight-check-names"], "{bad}");
        }

        let mut s = sample();
        s.load_balancer.metallb.enabled = true;
        assert_eq!(rules(&s), ["metallb-bgp-config"]);
    }

    #[test]
    fn network_blocks_and_service_address_pools_stay_apart() {
        let mut s = sample();
        s.network.service_cidr = "172.0.0.0/11".into();
        assert_eq!(rules(&s), ["service-cidr-size"]);
        let mut s = sample();
        s.network.pod_cidr = "fd00:10::/56".into();
        assert_eq!(rules(&s), ["network-cidrs-same-family"]);
        // Host bits may be set, as kube-apiserver accepts.
        let mut s = sample();
        s.network.pod_cidr = "10.244.3.7/16".into();
        assert!(rules(&s).is_empty());

        let with_pool = |addresses: &str| {
            let mut s = sample();
            s.load_balancer.metallb = serde_json::from_value(serde_json::json!({
                "enabled": true,
                "bgpPeers": [{"peerAddress": "10.0.0.1", "peerASN": 64512, "myASN": 64513}],
                "addressPools": [{"name": "lb", "addresses": [addresses]}],
            }))
            .unwrap();
            rules(&s)
        };
        assert!(with_pool("10.0.10.0/24").is_empty());
        assert!(with_pool("10.0.10.5-10.0.10.9").is_empty());
        assert_eq!(with_pool("10.244.0.0/24"), ["address-pool-overlap"]);
        assert_eq!(
            with_pool("10.0.0.0/8"),
            ["address-pool-overlap"],
            "holds the pod network"
        );
        assert_eq!(
            with_pool("10.0.0.5-10.0.0.20"),
            ["address-pool-overlap"],
            "holds the endpoint"
        );
        // A range whose ends lie outside a network but which spans it.
        assert_eq!(with_pool("10.243.0.1-10.245.0.1"), ["address-pool-overlap"]);
        assert!(
            with_pool("fd00::1-fd00::9").is_empty(),
            "another family overlaps nothing"
        );
        assert_eq!(with_pool("10.0.10.9-10.0.10.5"), ["address-pool-range-order"]);
    }

    #[test]
    fn kubelet_thresholds_are_signals_with_percentages_or_quantities() {
        for (signal, threshold, want) in [
            ("nodefs.available", "2Gi", &[][..]),
            ("imagefs.available", "0%", &[]),
            ("memory.available", "100.0%", &[]),
            ("memory.available", "7.5%", &[]),
            ("pid.available", "1000", &[]),
            ("memory.available", "+500M", &[]),
            ("memory.available", "1e9", &[]),
            ("memory.available", ".5Gi", &[]),
            ("disk.available", "1Gi", &["eviction-signal"]),
            ("memory.available", "101%", &["eviction-threshold"]),
            ("memory.available", "1000%", &["eviction-threshold"]),
            ("memory.available", ".5%", &["eviction-threshold"]),
            ("memory.available", "0", &["eviction-threshold"]),
            ("memory.available", "0Gi", &["eviction-threshold"]),
            ("memory.available", "-1Gi", &["eviction-threshold"]),
            ("memory.available", "1GB", &["eviction-threshold"]),
            ("memory.available", "lots", &["eviction-threshold"]),
            ("memory.available", "", &["eviction-threshold"]),
            ("disk", "x", &["eviction-signal", "eviction-threshold"]),
        ] {
            let mut s = sample();
            s.nodes.kubelet.eviction_hard = [(signal.to_string(), threshold.to_string())].into();
            assert_eq!(rules(&s), want, "{signal}={threshold}");
        }
    }

    #[test]
    fn image_gc_low_stays_below_high_counting_the_kubelets_defaults() {
        for (high, low, ok) in [
            (None, None, true),
            (Some(100), Some(95), true),
            (Some(90), None, true),
            (Some(80), None, false),
            (None, Some(84), true),
            (None, Some(85), false),
            (Some(70), Some(70), false),
        ] {
            let mut s = sample();
            s.nodes.kubelet.image_gc_high_threshold_percent = high;
            s.nodes.kubelet.image_gc_low_threshold_percent = low;
            let want: &[&str] = if ok { &[] } else { &["image-gc-thresholds"] };
            assert_eq!(rules(&s), want, "{high:?}/{low:?}");
        }
    }
}
