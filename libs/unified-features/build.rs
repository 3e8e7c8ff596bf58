//! Nothing to build: the build dependencies are here for their features alone (see
//! Cargo.toml).

fn main() {}
