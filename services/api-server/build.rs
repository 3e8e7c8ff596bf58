//! Bundles uPlot (MIT, github.com/leeoniya/uPlot), the dashboard's chart library, into the
//! binary from the npm package `scripts/install-deps.sh` installs under `.tools/web`
//! (`PRIMUS_UPLOT_DIR` names another folder holding its `dist` files).

#![expect(
    clippy::disallowed_methods,
    reason = "a build script reads cargo's variables and the one naming uPlot's folder"
)]

use std::path::PathBuf;

const FILES: [(&str, &str); 2] = [
    ("uPlot.iife.min.js", "uplot.js"),
    ("uPlot.min.css", "uplot.css"),
];

fn main() {
    println!("cargo:rerun-if-env-changed=PRIMUS_UPLOT_DIR");
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let dir = match std::env::var_os("PRIMUS_UPLOT_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => manifest.join("../../.tools/web/node_modules/uplot/dist"),
    };
    let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default());
    for (from, to) in FILES {
        let source = dir.join(from);
        println!("cargo:rerun-if-changed={}", source.display());
        if let Err(e) = std::fs::copy(&source, out.join(to)) {
            eprintln!(
                "the API server's dashboard bundles uPlot, and {} cannot be read: {e}. \
                 Run scripts/install-deps.sh (it installs the npm package uplot under .tools/web), \
                 or set PRIMUS_UPLOT_DIR to a folder holding uPlot's dist files.",
                source.display()
            );
            std::process::exit(1);
        }
    }
}
