//! What every reconcile of the provider shares: the client, the reflector stores that form the
//! in-memory pool index, the machines waiting for a host, Events, metrics and settings.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use bootsman_api::v1beta1::{ByoHost, ByoMachine};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::events::{Event, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};

use crate::config::Config;
use crate::metrics::Metrics;
use crate::pool;

/// Shared state of the controllers.
pub struct Context {
    /// Client of the infrastructure cluster.
    pub client: kube::Client,
    /// Settings.
    pub config: Config,
    /// Every ByoHost the provider watches: the pool index.
    pub hosts: Store<ByoHost>,
    /// Every heartbeat Lease the provider watches (named after its host).
    pub leases: Store<Lease>,
    /// ByoMachines waiting for a free host; woken when a host arrives or changes.
    pub waiting: Mutex<HashSet<ObjectRef<ByoMachine>>>,
    /// Publishes Events.
    pub recorder: Recorder,
    /// Metrics.
    pub metrics: Metrics,
}

impl Context {
    /// Builds the context.
    pub fn new(
        client: kube::Client,
        config: Config,
        hosts: Store<ByoHost>,
        leases: Store<Lease>,
        metrics: Metrics,
    ) -> Arc<Self> {
        let reporter = Reporter {
            controller: config.instance.clone(),
            instance: std::env::var("POD_NAME").ok(),
        };
        let recorder = Recorder::new(client.clone(), reporter);
        Arc::new(Self {
            client,
            config,
            hosts,
            leases,
            waiting: Mutex::new(HashSet::new()),
            recorder,
            metrics,
        })
    }

    /// The heartbeat Lease of a host.
    pub fn lease_of(&self, host: &ByoHost) -> Option<Arc<Lease>> {
        let ns = host.namespace()?;
        self.leases.get(&ObjectRef::new(&host.name_any()).within(&ns))
    }

    /// Whether the host's agent is alive right now.
    pub fn is_fresh(&self, host: &ByoHost) -> bool {
        pool::lease_fresh(self.lease_of(host).as_deref(), Timestamp::now())
    }

    /// Publishes an Event about `obj`; failures are logged, never fatal.
    pub async fn event<K: kube::Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        warning: bool,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let ev = Event {
            type_: if warning {
                kube::runtime::events::EventType::Warning
            } else {
                kube::runtime::events::EventType::Normal
            },
            reason: reason.into(),
            note: Some(note),
            action: action.into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, &obj.object_ref(&())).await {
            tracing::warn!(error = %e, reason, "cannot publish Event");
        }
    }

    /// The retry of a failed reconcile of `obj` by `controller`: counted, quick after a lost race
    /// or while waiting, logged and retried after a pause otherwise.
    pub fn requeue_after_error<K: kube::Resource>(
        &self,
        controller: &'static str,
        obj: &K,
        err: &crate::error::Error,
    ) -> kube::runtime::controller::Action {
        self.metrics.failed(controller, err.label());
        if let Some(after) = crate::error::retry_after(err) {
            return kube::runtime::controller::Action::requeue(after);
        }
        let meta = obj.meta();
        tracing::warn!(controller, name = ?meta.name, namespace = ?meta.namespace, error = %err, "reconcile failed");
        kube::runtime::controller::Action::requeue(std::time::Duration::from_secs(5))
    }

    /// Marks a machine as waiting for a host (or not).
    pub fn set_waiting(&self, machine: ObjectRef<ByoMachine>, waiting: bool) {
        if let Ok(mut w) = self.waiting.lock() {
            if waiting {
                w.insert(machine);
            } else {
                w.remove(&machine);
            }
        }
    }

    /// The machines currently waiting for a host.
    pub fn waiting_machines(&self) -> Vec<ObjectRef<ByoMachine>> {
        self.waiting
            .lock()
            .map(|w| w.iter().cloned().collect())
            .unwrap_or_default()
    }
}
