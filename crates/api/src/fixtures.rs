//! Test fixtures: the committed samples, parsed.

use std::path::Path;

/// Reads `config/samples/<name>` and returns its YAML documents as JSON values.
pub fn sample_documents(name: &str) -> Vec<serde_json::Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../config/samples")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}
