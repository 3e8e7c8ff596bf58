//! What the end-to-end benchmarks in `benches/` (`cargo bench -p primus-benches`) share.

use std::path::{Path, PathBuf};

/// The value of environment variable `name` (a bench's size knob), or `default` when it is
/// unset or does not parse.
#[expect(clippy::disallowed_methods, reason = "a bench's size knobs")]
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The binaries of the bench's own profile (`target/<profile>`: a bench runs from its
/// `deps`), which the master of a bench starts as its executors.
pub fn service_bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the bench's path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>")
        .to_path_buf()
}

/// Exits 2, saying what to build (and `otherwise`, how to run without them), unless the
/// executor binaries are in `bin_dir`.
pub fn require_service_binaries(bin_dir: &Path, otherwise: &str) {
    for binary in ["primus-data-executor", "primus-ps", "primus-trainer"] {
        if !bin_dir.join(binary).is_file() {
            eprintln!(
                "{} is missing: build the binaries with the bench's profile first (`cargo build --release --bins`){otherwise}",
                bin_dir.join(binary).display()
            );
            std::process::exit(2);
        }
    }
}
