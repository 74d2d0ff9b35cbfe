//! `bootsman-operator`: see the crate documentation and the README for flags, metrics and Events.

fn main() {
    println!("bootsman-operator {}", env!("CARGO_PKG_VERSION"));
}
