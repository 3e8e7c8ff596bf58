//! The committed CustomResourceDefinitions (k8s/crds/primus.dev.yaml) are what the types
//! generate; `PRIMUS_BLESS=1 cargo test --workspace --test crds` writes them again.

const COMMITTED: &str = "k8s/crds/primus.dev.yaml";

#[test]
fn the_committed_definitions_are_what_the_types_generate() {
    let generated = primus_kube_resources::crd::definitions_yaml().expect("the definitions");
    let path = primus_testkit::repo_root().join(COMMITTED);
    #[expect(
        clippy::disallowed_methods,
        reason = "PRIMUS_BLESS writes the definitions"
    )]
    let bless = std::env::var_os("PRIMUS_BLESS").is_some();
    if bless {
        std::fs::write(&path, &generated).expect("write the definitions");
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{COMMITTED} is not what the Job, Dataset, Metric and status types generate: \
         run `PRIMUS_BLESS=1 cargo test --workspace --test crds` (or `primus crds > {COMMITTED}`)"
    );
}

#[test]
fn every_kind_has_a_status_subresource_and_its_columns() {
    for definition in primus_kube_resources::crd::definitions().expect("the definitions") {
        let version = &definition.spec.versions[0];
        let name = &definition.spec.names.kind;
        assert!(
            version
                .subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some(),
            "{name}: status subresource"
        );
        let columns: Vec<&str> = (version.additional_printer_columns.iter().flatten())
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(columns.last(), Some(&"Age"), "{name}: {columns:?}");
        if name == "PrimusJob" {
            assert_eq!(
                columns,
                ["Phase", "Progress", "Samples", "Samples/s", "AUC", "Age"]
            );
        }
    }
}
