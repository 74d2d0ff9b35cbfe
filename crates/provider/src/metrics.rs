//! The provider's own metrics, registered into the process registry of [`bootsman_runtime`]
//! (which prefixes every name with `bootsman_` and also counts and times reconciles per
//! controller): pool size by phase and pool, claim conflicts, claims, time to claim,
//! quarantines and orphaned hosts released. Labels are low-cardinality: never an object name.

use std::sync::Arc;

use bootsman_runtime::metrics::{Metrics as RuntimeMetrics, ReconcileTimer};
use prometheus::{Histogram, HistogramOpts, IntGaugeVec, Opts};

/// Metrics of the provider's controllers.
#[derive(Clone, Debug)]
pub struct Metrics {
    /// `bootsman_provider_pool_hosts{pool,phase}`.
    pub pool_hosts: IntGaugeVec,
    /// `bootsman_provider_machines_waiting`: ByoMachines this replica saw find no free host.
    pub machines_waiting: prometheus::IntGauge,
    /// `bootsman_provider_claim_conflicts_total`: claims that lost an optimistic-concurrency race.
    pub claim_conflicts: prometheus::IntCounter,
    /// `bootsman_provider_claims_total`.
    pub claims: prometheus::IntCounter,
    /// `bootsman_provider_time_to_claim_seconds`: from ByoMachine creation to its claim.
    pub time_to_claim: Histogram,
    /// Reconcile counts, errors and durations (`bootsman_reconcile_*{controller}`).
    pub runtime: Arc<RuntimeMetrics>,
    /// `bootsman_provider_hosts_quarantined_total`.
    pub quarantined: prometheus::IntCounter,
    /// `bootsman_provider_orphaned_hosts_released_total`: claimed hosts released because their
    /// machine was gone for the grace period.
    pub orphans_released: prometheus::IntCounter,
}

impl Metrics {
    /// Creates the metrics and registers them into the process registry.
    pub fn register(runtime: Arc<RuntimeMetrics>) -> Result<Self, prometheus::Error> {
        let registry = runtime.registry().clone();
        let m = Self {
            pool_hosts: IntGaugeVec::new(
                Opts::new("provider_pool_hosts", "Hosts by pool namespace and phase"),
                &["pool", "phase"],
            )?,
            machines_waiting: prometheus::IntGauge::new(
                "provider_machines_waiting",
                "ByoMachines waiting for a free host that matches their pools and selector",
            )?,
            claim_conflicts: prometheus::IntCounter::new(
                "provider_claim_conflicts_total",
                "Host claims that lost an optimistic-concurrency race and picked again",
            )?,
            claims: prometheus::IntCounter::new("provider_claims_total", "Hosts claimed for machines")?,
            time_to_claim: Histogram::with_opts(
                HistogramOpts::new(
                    "provider_time_to_claim_seconds",
                    "From ByoMachine creation to its host claim",
                )
                .buckets(vec![
                    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0,
                ]),
            )?,
            quarantined: prometheus::IntCounter::new(
                "provider_hosts_quarantined_total",
                "Hosts quarantined because a release did not finish cleanly",
            )?,
            orphans_released: prometheus::IntCounter::new(
                "provider_orphaned_hosts_released_total",
                "Claimed hosts released because their ByoMachine was gone for the grace period",
            )?,
            runtime,
        };
        registry.register(Box::new(m.pool_hosts.clone()))?;
        registry.register(Box::new(m.machines_waiting.clone()))?;
        registry.register(Box::new(m.claim_conflicts.clone()))?;
        registry.register(Box::new(m.claims.clone()))?;
        registry.register(Box::new(m.time_to_claim.clone()))?;
        registry.register(Box::new(m.quarantined.clone()))?;
        registry.register(Box::new(m.orphans_released.clone()))?;
        Ok(m)
    }

    /// Counts a reconcile of `controller` and times it until the guard drops.
    pub fn reconcile(&self, controller: &str) -> ReconcileTimer {
        self.runtime.reconcile_timer(controller)
    }

    /// Counts a failed reconcile of `controller`.
    pub fn failed(&self, controller: &str, error: &'static str) {
        self.runtime.reconcile_failed(controller, error);
    }
}
