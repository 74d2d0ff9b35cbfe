//! Two provider processes, leader election off, racing for the same pool: every host is claimed
//! by exactly one machine and every machine by exactly one host, run after run.

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
    tokio::process::Command::new(env!("CARGO_BIN_EXE_bootsman-provider"))
        .args([
            "--namespace",
            &site.ns,
            "--leader-elect=false",
            "--metrics-bind-address",
            "127.0.0.1:0",
        ])
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
