//! `bootsmanctl`: see the crate documentation and the README.

fn main() {
    println!("bootsmanctl {}", env!("CARGO_PKG_VERSION"));
}
