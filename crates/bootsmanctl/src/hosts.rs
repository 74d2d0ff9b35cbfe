//! Listing the hosts of a pool.

use bootsman_api::v1beta1::ByoHost;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::{Api, ResourceExt};

/// One row of `bootsmanctl hosts list` (and one object of its `-o json`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Row {
    /// Namespace (pool) of the host.
    pub namespace: String,
    /// Name of the host.
    pub name: String,
    /// Phase, until the provider has written one `None`.
    pub phase: Option<String>,
    /// `<namespace>/<name>` of the claiming ByoMachine.
    pub machine: Option<String>,
    /// When the ByoHost was created (RFC 3339).
    pub created: Option<String>,
    /// Age, e.g. `3d4h` (the table's column).
    #[serde(skip)]
    pub age: String,
}

/// A compact age: `45s`, `12m`, `5h3m`, `3d4h`.
pub fn age(secs: i64) -> String {
    let s = secs.max(0);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86400 => format!("{}h{}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{}h", s / 86400, s % 86400 / 3600),
    }
}

/// The hosts of `namespace` (all namespaces when `None`), sorted by namespace and name.
pub async fn list(client: &kube::Client, namespace: Option<&str>) -> Result<Vec<Row>, kube::Error> {
    let api: Api<ByoHost> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let now = Timestamp::now();
    let mut rows: Vec<Row> = api
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|h| Row {
            namespace: h.namespace().unwrap_or_default(),
            name: h.name_any(),
            phase: h.status.as_ref().and_then(|s| s.phase).map(|p| format!("{p:?}")),
            machine: h
                .spec
                .machine_ref
                .as_ref()
                .map(|m| format!("{}/{}", m.namespace, m.name)),
            created: h.creation_timestamp().map(|t| t.0.to_string()),
            age: h
                .creation_timestamp()
                .map_or_else(|| "-".to_string(), |t| age(now.as_second() - t.0.as_second())),
        })
        .collect();
    rows.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    Ok(rows)
}

/// Renders rows as an aligned table; the NAMESPACE column only when `all_namespaces`.
pub fn table(rows: &[Row], all_namespaces: bool) -> String {
    let mut lines: Vec<Vec<&str>> = vec![];
    let head = ["NAMESPACE", "NAME", "PHASE", "MACHINE", "AGE"];
    let skip = usize::from(!all_namespaces);
    lines.push(head[skip..].to_vec());
    for r in rows {
        let cells = [
            r.namespace.as_str(),
            r.name.as_str(),
            r.phase.as_deref().unwrap_or("-"),
            r.machine.as_deref().unwrap_or("-"),
            r.age.as_str(),
        ];
        lines.push(cells[skip..].to_vec());
    }
    let cols = lines[0].len();
    let widths: Vec<usize> = (0..cols)
        .map(|c| lines.iter().map(|l| l[c].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for l in &lines {
        let mut line = String::new();
        for (c, cell) in l.iter().enumerate() {
            if c + 1 == cols {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$}   ", w = widths[c]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_and_table() {
        assert_eq!(age(5), "5s");
        assert_eq!(age(125), "2m");
        assert_eq!(age(3 * 3600 + 120), "3h2m");
        assert_eq!(age(2 * 86400 + 7200), "2d2h");
        let rows = vec![Row {
            namespace: "p".into(),
            name: "web-1".into(),
            phase: Some("Available".into()),
            machine: None,
            created: None,
            age: "5s".into(),
        }];
        assert_eq!(
            table(&rows, false),
            "NAME    PHASE       MACHINE   AGE\nweb-1   Available   -         5s\n"
        );
    }
}
