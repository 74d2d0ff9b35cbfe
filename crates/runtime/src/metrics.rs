//! One Prometheus registry per process, with the reconcile metrics every controller shares.
//!
//! Every metric in the registry is prefixed `bootsman_`. Controllers record
//!
//! - `bootsman_reconcile_total{controller}`: reconciles started;
//! - `bootsman_reconcile_errors_total{controller,error}`: failed reconciles, `error` being the
//!   error's short static label (such as [`crate::Error::label`]);
//! - `bootsman_reconcile_duration_seconds{controller}`: how long reconciles took (0.005 s to 60 s).
//!
//! Labels are low-cardinality by rule: a controller name, an error label. Never put an object's
//! name or namespace in a label; log it instead. Crates register metrics of their own into
//! [`Metrics::registry`] (names there get the `bootsman_` prefix too).
//!
//! ```
//! let metrics = bootsman_runtime::metrics::Metrics::new()?;
//! {
//!     let _timer = metrics.reconcile_timer("byomachine"); // counted now, timed until dropped
//!     metrics.reconcile_failed("byomachine", "get_host");
//! }
//! assert!(metrics.encode().contains("bootsman_reconcile_total{controller=\"byomachine\"} 1"));
//! # Ok::<(), bootsman_runtime::Error>(())
//! ```

use prometheus::{
    Encoder as _, HistogramOpts, HistogramTimer, HistogramVec, IntCounterVec, Opts, Registry, TextEncoder,
};

use crate::Error;

/// The prefix of every metric in the registry.
pub const PREFIX: &str = "bootsman";

/// Histogram buckets of the reconcile duration, in seconds.
pub const RECONCILE_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// The process's registry and the shared reconcile metrics.
#[derive(Clone, Debug)]
pub struct Metrics {
    registry: Registry,
    reconciles: IntCounterVec,
    errors: IntCounterVec,
    duration: HistogramVec,
}

impl Metrics {
    /// A fresh registry (prefix `bootsman`) with the reconcile metrics registered.
    pub fn new() -> Result<Self, Error> {
        let registry =
            Registry::new_custom(Some(PREFIX.into()), None).map_err(|source| Error::RegisterMetric {
                metric: "registry",
                source,
            })?;
        let reconciles = IntCounterVec::new(
            Opts::new("reconcile_total", "Reconciles started, per controller."),
            &["controller"],
        )
        .map_err(register_error("reconcile_total"))?;
        let errors = IntCounterVec::new(
            Opts::new(
                "reconcile_errors_total",
                "Reconciles that failed, per controller and error label.",
            ),
            &["controller", "error"],
        )
        .map_err(register_error("reconcile_errors_total"))?;
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "reconcile_duration_seconds",
                "How long reconciles took, per controller.",
            )
            .buckets(RECONCILE_BUCKETS.to_vec()),
            &["controller"],
        )
        .map_err(register_error("reconcile_duration_seconds"))?;

        registry
            .register(Box::new(reconciles.clone()))
            .map_err(register_error("reconcile_total"))?;
        registry
            .register(Box::new(errors.clone()))
            .map_err(register_error("reconcile_errors_total"))?;
        registry
            .register(Box::new(duration.clone()))
            .map_err(register_error("reconcile_duration_seconds"))?;

        Ok(Self {
            registry,
            reconciles,
            errors,
            duration,
        })
    }

    /// The registry, for crates that register metrics of their own.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Counts one reconcile of `controller` and returns a guard that records its duration when
    /// dropped. Keep the guard alive for the whole reconcile.
    pub fn reconcile_timer(&self, controller: &str) -> ReconcileTimer {
        self.reconciles.with_label_values(&[controller]).inc();
        ReconcileTimer(self.duration.with_label_values(&[controller]).start_timer())
    }

    /// Counts one failed reconcile of `controller`. `error` is a short static label (an error
    /// variant's `label()`), never a message or an object name.
    pub fn reconcile_failed(&self, controller: &str, error: &'static str) {
        self.errors.with_label_values(&[controller, error]).inc();
    }

    /// Everything in the registry, in the Prometheus text exposition format
    /// ([`prometheus::TEXT_FORMAT`]).
    pub fn try_encode(&self) -> Result<String, Error> {
        let encoder = TextEncoder::new();
        let mut buf = Vec::new();
        encoder
            .encode(&self.registry.gather(), &mut buf)
            .map_err(Error::EncodeMetrics)?;
        String::from_utf8(buf).map_err(|e| Error::EncodeMetrics(prometheus::Error::Msg(e.to_string())))
    }

    /// Like [`Self::try_encode`]; a failure is logged and yields an empty exposition.
    pub fn encode(&self) -> String {
        self.try_encode().unwrap_or_else(|e| {
            tracing::error!(error = %e, source = ?std::error::Error::source(&e), "encoding metrics");
            String::new()
        })
    }
}

fn register_error(metric: &'static str) -> impl FnOnce(prometheus::Error) -> Error {
    move |source| Error::RegisterMetric { metric, source }
}

/// Times one reconcile: records the elapsed time into
/// `bootsman_reconcile_duration_seconds` when dropped.
#[derive(Debug)]
#[must_use = "the duration is recorded when the timer is dropped; bind it to a variable"]
pub struct ReconcileTimer(HistogramTimer);

impl ReconcileTimer {
    /// Records the duration now instead of at drop and returns it in seconds.
    pub fn observe(self) -> f64 {
        self.0.stop_and_record()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_has_names_and_labels_after_a_timer_and_a_failure() {
        let metrics = Metrics::new().expect("metrics");
        {
            let _timer = metrics.reconcile_timer("byomachine");
        }
        let timer = metrics.reconcile_timer("byomachine");
        assert!(timer.observe() >= 0.0);
        metrics.reconcile_failed("byomachine", "claim_conflict");

        let text = metrics.encode();
        assert!(text.contains("# TYPE bootsman_reconcile_total counter"), "{text}");
        assert!(
            text.contains("bootsman_reconcile_total{controller=\"byomachine\"} 2"),
            "{text}"
        );
        assert!(
            text.contains(
                "bootsman_reconcile_errors_total{controller=\"byomachine\",error=\"claim_conflict\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains("bootsman_reconcile_duration_seconds_count{controller=\"byomachine\"} 2"),
            "{text}"
        );
        assert!(
            text.contains(
                "bootsman_reconcile_duration_seconds_bucket{controller=\"byomachine\",le=\"0.005\"}"
            ),
            "{text}"
        );
        assert!(
            text.contains("bootsman_reconcile_duration_seconds_bucket{controller=\"byomachine\",le=\"60\"}"),
            "{text}"
        );
    }

    #[test]
    fn other_crates_register_into_the_same_registry_with_the_prefix() {
        let metrics = Metrics::new().expect("metrics");
        let hosts = prometheus::IntGauge::new("pool_free_hosts", "Free hosts.").expect("gauge");
        metrics
            .registry()
            .register(Box::new(hosts.clone()))
            .expect("register");
        hosts.set(3);
        assert!(metrics.encode().contains("bootsman_pool_free_hosts 3"));
    }

    #[test]
    fn registering_twice_is_an_error_with_a_label() {
        let metrics = Metrics::new().expect("metrics");
        let again =
            IntCounterVec::new(Opts::new("reconcile_total", "again"), &["controller"]).expect("counter");
        let err = metrics
            .registry()
            .register(Box::new(again))
            .map_err(register_error("reconcile_total"))
            .expect_err("duplicate");
        assert_eq!(err.label(), "register_metric");
    }

    #[test]
    fn nothing_recorded_means_no_series() {
        let metrics = Metrics::new().expect("metrics");
        assert!(!metrics.encode().contains("controller="));
    }
}
