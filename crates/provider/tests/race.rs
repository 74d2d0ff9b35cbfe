//! Two provider processes, leader election off, racing for the same pool (what two leaders
//! overlapping in a hand-over would do, all the time): every host is claimed by exactly one
//! machine and every machine by exactly one host, run after run; and machines deleted while the
//! claims are in flight leave no host claimed for a machine that is gone.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use bootsman_testenv::wait_for;
use common::Site;

const HOSTS: usize = 50;

fn runs() -> usize {
    std::env::var("BOOTSMAN_RACE_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20)
}

fn provider_process(site: &Site) -> tokio::process::Child {
    provider_process_with(site, &[])
}

fn provider_process_with(site: &Site, extra: &[&str]) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_bootsman-provider"))
        .args([
            "--namespace",
            &site.ns,
            "--leader-elect=false",
            "--metrics-bind-address",
            "127.0.0.1:0",
        ])
        .args(extra)
        .env("KUBECONFIG", site.env.kubeconfig())
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

#[tokio::test]
async fn two_providers_never_bind_one_host_twice() {
    for run in 0..runs() {
        let site = Site::new(&format!("race{run}")).await;
        let mut a = provider_process(&site);
        let mut b = provider_process(&site);
        site.cluster("c1", false).await;
        let hosts: Vec<String> = (0..HOSTS).map(|i| format!("h{i:02}")).collect();
        let machines: Vec<String> = (0..HOSTS).map(|i| format!("m{i:02}")).collect();
        futures::future::join_all(hosts.iter().map(|h| site.host_fast(h))).await;
        futures::future::join_all(machines.iter().map(|m| site.machine("c1", m, None))).await;
        let bindings = wait_for(
            &format!("run {run}: every machine to get a providerID"),
            Duration::from_secs(120),
            || async {
                let machines = site
                    .byomachines()
                    .list(&Default::default())
                    .await
                    .map_err(|e| e.to_string())?;
                let ids: Vec<String> = machines
                    .items
                    .iter()
                    .filter_map(|m| m.spec.provider_id.clone())
                    .collect();
                if ids.len() == HOSTS {
                    Ok(machines.items)
                } else {
                    Err(format!("{} of {HOSTS} bound", ids.len()))
                }
            },
        )
        .await;
        for (name, child) in [("a", &mut a), ("b", &mut b)] {
            assert!(
                child.try_wait().unwrap().is_none(),
                "run {run}: provider {name} exited"
            );
        }
        let hosts = site.byohosts().list(&Default::default()).await.unwrap().items;
        // Every machine: exactly one host claims it, and it is the one its providerID names.
        let mut claims_per_machine: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for h in &hosts {
            if let Some(r) = &h.spec.machine_ref {
                claims_per_machine
                    .entry(r.uid.clone())
                    .or_default()
                    .push(h.metadata.name.clone().unwrap());
            }
        }
        let mut seen_hosts = std::collections::BTreeSet::new();
        for m in &bindings {
            let uid = m.metadata.uid.clone().unwrap();
            let claimed = claims_per_machine.get(&uid).cloned().unwrap_or_default();
            assert_eq!(
                claimed.len(),
                1,
                "run {run}: machine {:?} is claimed by {claimed:?}",
                m.metadata.name
            );
            let pid = m.spec.provider_id.clone().unwrap();
            assert_eq!(pid, format!("byoh://{}/{}", site.ns, claimed[0]), "run {run}");
            assert!(
                seen_hosts.insert(claimed[0].clone()),
                "run {run}: host {} bound twice",
                claimed[0]
            );
        }
        assert_eq!(
            seen_hosts.len(),
            HOSTS,
            "run {run}: every host claimed by exactly one machine"
        );
        drop(a);
        drop(b);
        site.stop().await;
    }
}

/// Machines deleted at random moments while two providers claim hosts for them: a machine's
/// cleanup in one provider may meet a claim for it in the other. Whatever lands, no host stays
/// claimed for a machine that is gone (a late claim is released by the orphan sweeper, here after
/// a 2 s grace), every deletion completes, and every machine left holds exactly one host.
#[tokio::test]
async fn machines_deleted_mid_claim_leave_no_host_claimed_for_them() {
    const N: usize = 30;
    let flags = ["--release-timeout", "2s", "--orphan-grace", "2s"];
    for run in 0..runs().min(5) {
        let site = Site::new(&format!("cleanup{run}")).await;
        let mut a = provider_process_with(&site, &flags);
        let mut b = provider_process_with(&site, &flags);
        site.cluster("c1", false).await;
        // Twice as many hosts as machines: a claim that lands after its machine is gone is
        // released by the sweeper, and with no agent to report the reset the host is then
        // quarantined, so one deleted machine can take more than one host out of the pool. The
        // test is about where claims end up, not about running out of hosts.
        let hosts: Vec<String> = (0..2 * N).map(|i| format!("h{i:02}")).collect();
        let machines: Vec<String> = (0..N).map(|i| format!("m{i:02}")).collect();
        futures::future::join_all(hosts.iter().map(|h| site.host_fast(h))).await;
        // Every other machine is deleted a few milliseconds to half a second after it was
        // created, while the providers are claiming.
        futures::future::join_all(machines.iter().enumerate().map(|(i, m)| {
            let site = &site;
            async move {
                site.machine("c1", m, None).await;
                if i % 2 == 0 {
                    tokio::time::sleep(Duration::from_millis((i as u64 * 37) % 500)).await;
                    site.byomachines().delete(m, &Default::default()).await.unwrap();
                }
            }
        }))
        .await;
        let kept: std::collections::BTreeSet<String> = machines
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 2 == 1)
            .map(|(_, m)| m.clone())
            .collect();
        wait_for(
            &format!("run {run}: deletions done, no host claimed for a gone machine, one host per machine"),
            Duration::from_secs(120),
            || async {
                let left = site
                    .byomachines()
                    .list(&Default::default())
                    .await
                    .map_err(|e| e.to_string())?
                    .items;
                let names: std::collections::BTreeSet<String> =
                    left.iter().filter_map(|m| m.metadata.name.clone()).collect();
                if names != kept {
                    return Err(format!("machines left: {names:?}"));
                }
                let uids: BTreeMap<String, String> = left
                    .iter()
                    .map(|m| (m.metadata.uid.clone().unwrap(), m.metadata.name.clone().unwrap()))
                    .collect();
                let mut held: BTreeMap<String, Vec<String>> = BTreeMap::new();
                let all_hosts = site
                    .byohosts()
                    .list(&Default::default())
                    .await
                    .map_err(|e| e.to_string())?
                    .items;
                let out_of_pool = all_hosts
                    .iter()
                    .filter(|h| h.spec.quarantine.is_some() || h.spec.release.is_some())
                    .count();
                for h in &all_hosts {
                    if let Some(r) = &h.spec.machine_ref {
                        let Some(m) = uids.get(&r.uid) else {
                            return Err(format!(
                                "host {:?} is claimed for {} ({}), which is gone",
                                h.metadata.name, r.name, r.uid
                            ));
                        };
                        held.entry(m.clone())
                            .or_default()
                            .push(h.metadata.name.clone().unwrap());
                    }
                }
                match held.iter().find(|(_, hs)| hs.len() != 1) {
                    Some((m, hs)) => Err(format!("machine {m} holds {hs:?}")),
                    None if held.len() != kept.len() => Err(format!(
                        "{} of {} machines hold a host ({} hosts quarantined or releasing)",
                        held.len(),
                        kept.len(),
                        out_of_pool
                    )),
                    None => Ok(()),
                }
            },
        )
        .await;
        for (name, child) in [("a", &mut a), ("b", &mut b)] {
            assert!(
                child.try_wait().unwrap().is_none(),
                "run {run}: provider {name} exited"
            );
        }
        drop(a);
        drop(b);
        site.stop().await;
    }
}
