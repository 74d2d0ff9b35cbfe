//! The pool of hosts as pure decisions: which hosts are healthy, which may be chosen for a
//! machine, and the phase a host is in. No API calls here; the controllers feed these functions
//! from their reflector stores.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};

use bootsman_api::condition::types;
use bootsman_api::labels::ZONE;
use bootsman_api::pools::POOL_LABEL;
use bootsman_api::v1beta1::{ByoHost, HostPhase};
use bootsman_runtime::conditions;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use kube::core::{Selector, SelectorExt};

/// Whether the host's heartbeat Lease is current at `now`.
pub fn lease_fresh(lease: Option<&Lease>, now: Timestamp) -> bool {
    lease_expiry(lease).is_some_and(|expiry| expiry > now)
}

/// When the Lease expires unless renewed.
pub fn lease_expiry(lease: Option<&Lease>) -> Option<Timestamp> {
    let spec = lease?.spec.as_ref()?;
    let renewed = spec.renew_time.as_ref().or(spec.acquire_time.as_ref())?.0;
    let secs = i64::from(spec.lease_duration_seconds?);
    renewed.checked_add(SignedDuration::from_secs(secs)).ok()
}

/// Why a host cannot be chosen for a new machine, or `None` when it can.
pub fn unavailable(host: &ByoHost, lease_fresh: bool) -> Option<&'static str> {
    if host.metadata.deletion_timestamp.is_some() {
        Some("being deleted")
    } else if host.spec.machine_ref.is_some() {
        Some("claimed")
    } else if host.spec.release.is_some() {
        Some("releasing")
    } else if host.spec.quarantine.is_some() {
        Some("quarantined")
    } else if host.spec.maintenance == Some(true) {
        Some("in maintenance")
    } else if !lease_fresh {
        Some("offline")
    } else {
        None
    }
}

/// Whether the agent reported `type_` as True for the host's current spec (`observedGeneration`
/// not older than the host's generation), so a result from an earlier claim never counts.
pub fn reported_for_current_spec(host: &ByoHost, type_: &str) -> bool {
    let Some(status) = &host.status else { return false };
    conditions::get(&status.conditions, type_).is_some_and(|c| {
        c.status == "True" && c.observed_generation.unwrap_or(0) >= host.metadata.generation.unwrap_or(0)
    })
}

/// The lifecycle phase of a host, derived from its spec, its agent's reports and its Lease.
pub fn phase(host: &ByoHost, lease_fresh: bool) -> HostPhase {
    if host.spec.quarantine.is_some() {
        HostPhase::Quarantined
    } else if !lease_fresh {
        HostPhase::Offline
    } else if host.spec.release.is_some() {
        HostPhase::Releasing
    } else if host.spec.machine_ref.is_some() {
        if host.spec.bootstrap_secret.is_some() && reported_for_current_spec(host, types::BOOTSTRAP_SUCCEEDED)
        {
            HostPhase::Provisioned
        } else if host.spec.bootstrap_secret.is_some() {
            HostPhase::Bootstrapping
        } else {
            HostPhase::Claimed
        }
    } else if host.spec.maintenance == Some(true) {
        HostPhase::Maintenance
    } else {
        HostPhase::Available
    }
}

/// The labels a host selector is matched against: the host's own, and [`POOL_LABEL`] set to
/// its namespace (whatever the host's labels say under that key).
fn labels_with_pool(host: &ByoHost) -> BTreeMap<String, String> {
    let mut labels = host.metadata.labels.clone().unwrap_or_default();
    labels.insert(POOL_LABEL.to_string(), host.namespace().unwrap_or_default());
    labels
}

/// What selection found for a machine.
#[derive(Debug, PartialEq)]
pub enum Choice<'a> {
    /// Hosts that may be claimed, in the order to try them.
    Candidates(Vec<&'a ByoHost>),
    /// Hosts match the selector, but none is free and healthy right now.
    WaitingForHost {
        /// How many hosts match the selector.
        matching: usize,
    },
    /// No host in the allowed pools matches the selector.
    NoMatchingHost,
    /// The selector itself is invalid.
    InvalidSelector(String),
}

/// What a machine asks of a host.
pub struct Wanted<'s> {
    /// UID of the ByoMachine (spreads machines over candidates; stable across retries).
    pub machine_uid: &'s str,
    /// Namespaces the machine may draw from.
    pub pools: &'s [String],
    /// `ByoMachine.spec.selector`.
    pub selector: Option<&'s LabelSelector>,
    /// `Machine.spec.failureDomain`: only hosts in that zone qualify.
    pub failure_domain: Option<&'s str>,
}

/// Chooses hosts for a machine from `hosts`. `fresh(host)` says whether its Lease is current.
/// Candidates are ordered starting at a position derived from the machine's uid, so machines
/// choosing at the same moment try different hosts first and rarely collide.
pub fn choose<'a>(
    hosts: &[&'a ByoHost],
    wanted: &Wanted<'_>,
    fresh: impl Fn(&ByoHost) -> bool,
) -> Choice<'a> {
    let selector: Selector = match wanted.selector.cloned().map(Selector::try_from).transpose() {
        Ok(s) => s.unwrap_or_default(),
        Err(e) => return Choice::InvalidSelector(e.to_string()),
    };
    let mut matching: Vec<&ByoHost> = hosts
        .iter()
        .copied()
        .filter(|h| h.namespace().is_some_and(|ns| wanted.pools.contains(&ns)))
        .filter(|h| selector.matches(&labels_with_pool(h)))
        .filter(|h| {
            wanted
                .failure_domain
                .is_none_or(|fd| h.labels().get(ZONE).map(String::as_str) == Some(fd))
        })
        .collect();
    if matching.is_empty() {
        return Choice::NoMatchingHost;
    }
    let n = matching.len();
    matching.retain(|h| unavailable(h, fresh(h)).is_none());
    if matching.is_empty() {
        return Choice::WaitingForHost { matching: n };
    }
    matching.sort_by_key(|h| (h.namespace(), h.name_any()));
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    wanted.machine_uid.hash(&mut hasher);
    let start = (hasher.finish() % matching.len() as u64) as usize;
    matching.rotate_left(start);
    Choice::Candidates(matching)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bootsman_api::v1beta1::{ByoHostSpec, MachineRef, Quarantine};
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};

    fn host(ns: &str, name: &str, labels: &[(&str, &str)]) -> ByoHost {
        let mut h = ByoHost::new(name, ByoHostSpec::default());
        h.metadata.namespace = Some(ns.into());
        h.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        h
    }

    fn wanted<'a>(pools: &'a [String], selector: Option<&'a LabelSelector>) -> Wanted<'a> {
        Wanted {
            machine_uid: "uid-1",
            pools,
            selector,
            failure_domain: None,
        }
    }

    fn role(r: &str) -> LabelSelector {
        LabelSelector {
            match_labels: Some([("role".to_string(), r.to_string())].into()),
            ..Default::default()
        }
    }

    #[test]
    fn lease_freshness() {
        let now = Timestamp::from_second(1000).unwrap();
        let lease = |renew: i64, dur: i32| Lease {
            spec: Some(LeaseSpec {
                renew_time: Some(MicroTime(Timestamp::from_second(renew).unwrap())),
                lease_duration_seconds: Some(dur),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(lease_fresh(Some(&lease(995, 10)), now));
        assert!(!lease_fresh(Some(&lease(985, 10)), now));
        assert!(!lease_fresh(None, now));
        assert!(!lease_fresh(Some(&Lease::default()), now));
    }

    #[test]
    fn only_free_healthy_hosts_in_allowed_pools_matching_the_selector() {
        let pools = vec!["team".to_string(), "rack".to_string()];
        let cp = host("team", "cp1", &[("role", "control-plane")]);
        let w1 = host("rack", "w1", &[("role", "worker")]);
        let other_pool = host("elsewhere", "w2", &[("role", "worker")]);
        let mut claimed = host("team", "w3", &[("role", "worker")]);
        claimed.spec.machine_ref = Some(MachineRef {
            namespace: "team".into(),
            name: "m".into(),
            uid: "u".into(),
        });
        let mut maint = host("team", "w4", &[("role", "worker")]);
        maint.spec.maintenance = Some(true);
        let mut quarantined = host("team", "w5", &[("role", "worker")]);
        quarantined.spec.quarantine = Some(Quarantine {
            reason: "r".into(),
            since: Time(Timestamp::now()),
        });
        let mut deleting = host("team", "w6", &[("role", "worker")]);
        deleting.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
        let offline = host("team", "w7", &[("role", "worker")]);
        let all = [
            &cp,
            &w1,
            &other_pool,
            &claimed,
            &maint,
            &quarantined,
            &deleting,
            &offline,
        ];
        let fresh = |h: &ByoHost| h.name_any() != "w7";

        let sel = role("worker");
        match choose(&all, &wanted(&pools, Some(&sel)), fresh) {
            Choice::Candidates(c) => assert_eq!(c.iter().map(|h| h.name_any()).collect::<Vec<_>>(), ["w1"]),
            other => panic!("{other:?}"),
        }
        let sel = role("control-plane");
        match choose(&all, &wanted(&pools, Some(&sel)), fresh) {
            Choice::Candidates(c) => assert_eq!(c.iter().map(|h| h.name_any()).collect::<Vec<_>>(), ["cp1"]),
            other => panic!("{other:?}"),
        }
        let unhealthy = [&claimed, &maint, &quarantined, &deleting, &offline];
        assert_eq!(
            choose(&unhealthy, &wanted(&pools, Some(&role("worker"))), fresh),
            Choice::WaitingForHost { matching: 5 }
        );
        assert_eq!(
            choose(&all, &wanted(&pools, Some(&role("gpu"))), fresh),
            Choice::NoMatchingHost
        );
    }

    #[test]
    fn the_pool_label_selects_by_namespace_and_cannot_be_forged() {
        let pools = vec!["rack-a".to_string(), "rack-b".to_string()];
        let a = host("rack-a", "a", &[]);
        // A label claiming another pool changes nothing: the namespace decides.
        let b = host("rack-b", "b", &[(POOL_LABEL, "rack-a")]);
        let outside = host("rack-c", "c", &[]);
        let sel = LabelSelector {
            match_labels: Some([(POOL_LABEL.to_string(), "rack-a".to_string())].into()),
            ..Default::default()
        };
        match choose(&[&a, &b, &outside], &wanted(&pools, Some(&sel)), |_| true) {
            Choice::Candidates(c) => assert_eq!(c.iter().map(|h| h.name_any()).collect::<Vec<_>>(), ["a"]),
            other => panic!("{other:?}"),
        }
        // Naming a pool the machine may not use reaches nothing.
        let sel = LabelSelector {
            match_labels: Some([(POOL_LABEL.to_string(), "rack-c".to_string())].into()),
            ..Default::default()
        };
        assert_eq!(
            choose(&[&a, &b, &outside], &wanted(&pools, Some(&sel)), |_| true),
            Choice::NoMatchingHost
        );
    }

    #[test]
    fn failure_domain_restricts_to_the_zone() {
        let pools = vec!["p".to_string()];
        let a = host("p", "a", &[(ZONE, "z1")]);
        let b = host("p", "b", &[(ZONE, "z2")]);
        let w = Wanted {
            machine_uid: "u",
            pools: &pools,
            selector: None,
            failure_domain: Some("z2"),
        };
        match choose(&[&a, &b], &w, |_| true) {
            Choice::Candidates(c) => assert_eq!(c.iter().map(|h| h.name_any()).collect::<Vec<_>>(), ["b"]),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn machines_start_at_different_hosts() {
        let pools = vec!["p".to_string()];
        let hosts: Vec<ByoHost> = (0..20).map(|i| host("p", &format!("h{i:02}"), &[])).collect();
        let refs: Vec<&ByoHost> = hosts.iter().collect();
        let firsts: std::collections::BTreeSet<String> = (0..20)
            .map(|m| {
                let uid = format!("machine-{m}");
                let w = Wanted {
                    machine_uid: &uid,
                    pools: &pools,
                    selector: None,
                    failure_domain: None,
                };
                match choose(&refs, &w, |_| true) {
                    Choice::Candidates(c) => c[0].name_any(),
                    other => panic!("{other:?}"),
                }
            })
            .collect();
        assert!(
            firsts.len() > 5,
            "20 machines should not all start at the same few hosts: {firsts:?}"
        );
    }

    #[test]
    fn phases() {
        let mut h = host("p", "h", &[]);
        assert_eq!(phase(&h, true), HostPhase::Available);
        assert_eq!(phase(&h, false), HostPhase::Offline);
        h.spec.maintenance = Some(true);
        assert_eq!(phase(&h, true), HostPhase::Maintenance);
        h.spec.maintenance = None;
        h.spec.machine_ref = Some(MachineRef {
            namespace: "p".into(),
            name: "m".into(),
            uid: "u".into(),
        });
        assert_eq!(phase(&h, true), HostPhase::Claimed);
        h.spec.bootstrap_secret = Some(bootsman_api::v1beta1::SecretRef {
            name: "s".into(),
            namespace: None,
        });
        assert_eq!(phase(&h, true), HostPhase::Bootstrapping);
        h.metadata.generation = Some(3);
        let mut status = bootsman_api::v1beta1::ByoHostStatus::default();
        conditions::set(
            &mut status.conditions,
            types::BOOTSTRAP_SUCCEEDED,
            conditions::Status::True,
            "Done",
            "",
            Some(2),
            conditions::now(),
        );
        h.status = Some(status.clone());
        assert_eq!(
            phase(&h, true),
            HostPhase::Bootstrapping,
            "a report for an older spec does not count"
        );
        conditions::set(
            &mut status.conditions,
            types::BOOTSTRAP_SUCCEEDED,
            conditions::Status::True,
            "Done",
            "",
            Some(3),
            conditions::now(),
        );
        h.status = Some(status);
        assert_eq!(phase(&h, true), HostPhase::Provisioned);
        h.spec.quarantine = Some(Quarantine {
            reason: "r".into(),
            since: Time(Timestamp::now()),
        });
        assert_eq!(phase(&h, true), HostPhase::Quarantined);
    }
}
