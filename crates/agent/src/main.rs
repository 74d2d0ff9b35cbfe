//! `byoh-agent`: see the crate documentation and the README for flags, metrics and Events.

fn main() {
    println!("byoh-agent {}", env!("CARGO_PKG_VERSION"));
}
