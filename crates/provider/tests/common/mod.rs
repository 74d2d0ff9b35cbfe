//! A site for provider tests: the shared [`bootsman_fixtures::site`] (a pool namespace, hosts
//! played by the test, CAPI objects as CAPI writes them) with the provider run in-process.

#![allow(dead_code, unused_imports, clippy::unwrap_used)] // shared by several test binaries

pub use bootsman_fixtures::capi::{
    condition, create_byo_cluster, create_cluster, create_machine, create_machine_with_data, role,
};
pub use bootsman_fixtures::site::{Host, Site};
pub use bootsman_fixtures::{WAIT, meta};
use bootsman_provider::Config;

/// The provider on a [`Site`].
pub trait ProviderSite {
    /// Provider settings scoped to the site's namespace.
    fn config(&self) -> Config;
    /// Starts a provider instance with its own client and pool index; it runs until the site
    /// stops.
    fn start_provider(&mut self, config: Config) -> impl std::future::Future<Output = ()>;
}

impl ProviderSite for Site {
    fn config(&self) -> Config {
        Config::namespaced(&self.ns)
    }

    async fn start_provider(&mut self, config: Config) {
        self.spawn(|client, stop| async move {
            let metrics = std::sync::Arc::new(bootsman_runtime::metrics::Metrics::new().unwrap());
            bootsman_provider::run(client, config, metrics, stop)
                .await
                .unwrap();
        })
        .await;
    }
}
