//! A control plane started again from its folder is the same cluster: the same CA (so every
//! kubeconfig and enrolled host still trusts it), the same ports, the same objects.

use std::path::PathBuf;

use bootsman_controlplane::pki::Pki;
use bootsman_controlplane::{Bundle, ControlPlane, Spec};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::PostParams;

/// The bundle `hack/testbin` built (`$BOOTSMAN_TESTBIN`, else what it reports).
fn bundle() -> Bundle {
    let dir = std::env::var_os("BOOTSMAN_TESTBIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../hack/testbin");
            let out = std::process::Command::new(&script)
                .arg("--print-dir")
                .output()
                .unwrap_or_else(|e| panic!("{}: {e}", script.display()));
            assert!(
                out.status.success(),
                "the control-plane binaries are not built: run hack/testbin (hack/test.sh does)"
            );
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        });
    Bundle::open(dir).unwrap_or_else(|e| panic!("{e}"))
}

fn spec(dir: &std::path::Path, pki: &Pki) -> Spec {
    Spec {
        name: "restart-control-plane".into(),
        dir: dir.join("cp"),
        bundle: bundle(),
        pki: pki.files().clone(),
        address: None,
        port: None,
        capi: false,
        crds: bootsman_api::crdgen::all(),
        signing_duration: None,
        durable: true,
        isolation: bootsman_controlplane::Isolation::Namespaces,
    }
}

#[tokio::test]
async fn a_restarted_control_plane_keeps_its_ca_ports_and_objects() {
    let tmp = tempdir();
    let pki_dir = tmp.join("pki");

    let pki = Pki::open(&pki_dir, "restart", &[]).expect("PKI");
    let ca_before = std::fs::read(&pki.files().server_ca.cert).expect("server CA");
    let cp = ControlPlane::start(&spec(&tmp, &pki)).await.expect("first start");
    let ports = *cp.ports();
    let kubeconfig = std::fs::read_to_string(cp.kubeconfig()).expect("kubeconfig");
    let cms: Api<ConfigMap> = Api::namespaced(cp.client().await.expect("client"), "default");
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("kept".into());
    cm.data = Some([("k".to_string(), "v".to_string())].into());
    cms.create(&PostParams::default(), &cm).await.expect("create");
    let pid = cp.component("kube-apiserver").and_then(|c| c.pid()).expect("pid");
    drop(cp);
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z")),
        "kube-apiserver still runs after the control plane was dropped"
    );

    // Opened again: the CA is the one the first start made; the serving certificate is new.
    let pki = Pki::open(&pki_dir, "restart", &[]).expect("PKI again");
    assert_eq!(
        std::fs::read(&pki.files().server_ca.cert).expect("server CA"),
        ca_before,
        "the CA changed on a second open"
    );
    let cp = ControlPlane::start(&spec(&tmp, &pki))
        .await
        .expect("second start");
    assert_eq!(*cp.ports(), ports, "the ports changed between starts");
    assert_eq!(
        std::fs::read_to_string(cp.kubeconfig()).expect("kubeconfig"),
        kubeconfig,
        "the admin kubeconfig changed"
    );
    // The kubeconfig of the first start (its CA, its admin certificate) works unchanged, and the
    // object written before the restart is there.
    let cms: Api<ConfigMap> = Api::namespaced(cp.client().await.expect("client"), "default");
    let got = cms.get("kept").await.expect("the ConfigMap survived the restart");
    assert_eq!(
        got.data.unwrap_or_default().get("k").map(String::as_str),
        Some("v")
    );
    // Pods reach the API server at the `kubernetes` Service's address: its certificate names it.
    let mut as_pod = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(cp.kubeconfig()).expect("kubeconfig"),
        &Default::default(),
    )
    .await
    .expect("config");
    as_pod.tls_server_name = Some(bootsman_controlplane::KUBERNETES_SERVICE_IP.into());
    let as_pod = kube::Client::try_from(as_pod).expect("client");
    Api::<ConfigMap>::namespaced(as_pod, "default")
        .get("kept")
        .await
        .expect("the serving certificate names the kubernetes Service's address");
    // Bootsman's CRDs are served.
    let hosts: Api<bootsman_api::v1beta1::ByoHost> = Api::all(cp.client().await.expect("client"));
    hosts
        .list(&Default::default())
        .await
        .expect("ByoHosts are served");
    drop(cp);
    let _ = std::fs::remove_dir_all(&tmp);
}

fn tempdir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "bootsman-controlplane-test-{}-{}",
        std::process::id(),
        bootsman_controlplane::unique_suffix()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}
