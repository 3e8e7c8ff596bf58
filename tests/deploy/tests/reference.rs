//! The reference pages under `docs/reference/` are what the types say now. With
//! `PRIMUS_BLESS=1` the test writes them instead of comparing.

use primus_deploy_check::reference::{BLESS, pages};

#[test]
#[expect(
    clippy::disallowed_methods,
    reason = "PRIMUS_BLESS rewrites the reference pages"
)]
fn the_reference_pages_match_the_job_dataset_and_settings_types() {
    let root = primus_testkit::repo_root().join("docs/reference");
    let bless = std::env::var_os("PRIMUS_BLESS").is_some();
    let mut stale = Vec::new();
    for page in pages() {
        let path = root.join(&page.file);
        if bless {
            if let Some(folder) = path.parent() {
                std::fs::create_dir_all(folder).expect("docs/reference folder");
            }
            std::fs::write(&path, &page.text).expect("write the page");
            continue;
        }
        let current = std::fs::read_to_string(&path).unwrap_or_default();
        if current != page.text {
            stale.push(page.file);
        }
    }
    assert!(
        stale.is_empty(),
        "docs/reference pages do not match the types: {stale:?}; write them again with `{BLESS}`"
    );
}
