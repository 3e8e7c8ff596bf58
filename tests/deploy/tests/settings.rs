//! Every setting the compose file and the Kubernetes manifests give a service exists in
//! that service's settings type, with a value of the right type where the file holds one.
use std::path::PathBuf;

use primus_deploy_check::{EnvSetting, Launch, Service, compose_launches, kubernetes_launches};

/// Found at run time (Cargo sets the package folder for tests too): the compile-time path
/// goes stale when a shared target folder serves a checkout at another path.
#[expect(
    clippy::disallowed_methods,
    reason = "Cargo sets the package's folder at run time; the compile-time path goes stale under a shared target folder"
)]
fn repo() -> PathBuf {
    let package = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
    package.join("../..")
}

fn check_all(launches: &[Launch]) {
    let failures: Vec<String> = launches
        .iter()
        .filter_map(|l| l.check().err().map(|e| e.to_string()))
        .collect();
    assert!(failures.is_empty(), "{failures:#?}");
}

fn configured(launches: &[Launch], service: Service) -> Vec<&Launch> {
    launches
        .iter()
        .filter(|l| l.service == service && l.config.is_some())
        .collect()
}

#[test]
fn the_compose_files_settings_load_in_every_service() {
    let launches = compose_launches(&repo()).expect("compose file");
    for service in [Service::ApiServer, Service::Master, Service::ServingSync] {
        assert_eq!(
            configured(&launches, service).len(),
            1,
            "{service:?} runs once with a settings file: {launches:#?}"
        );
    }
    let master = configured(&launches, Service::Master)[0];
    assert!(
        master
            .env
            .iter()
            .any(|v| v.name == "PRIMUS_STORAGE__S3__ACCESS_KEY_ID"),
        "{master:?}"
    );
    check_all(&launches);
}

#[test]
fn the_kubernetes_manifests_settings_load_in_every_service() {
    let launches = kubernetes_launches(&repo()).expect("manifests");
    assert_eq!(configured(&launches, Service::ApiServer).len(), 1);
    // The base's master, and the prod overlay's sharded command.
    assert_eq!(configured(&launches, Service::Master).len(), 2);
    // The base's file and the prod overlay's replacement.
    assert_eq!(configured(&launches, Service::ServingSync).len(), 2);
    let names: Vec<&str> = launches
        .iter()
        .flat_map(|l| l.env.iter().map(|v| v.name.as_str()))
        .collect();
    for expected in [
        "PRIMUS_SERVER__ADVERTISE_IP",
        "PRIMUS_KUBERNETES__IMAGE",
        "PRIMUS_MASTER__SHARD",
    ] {
        assert!(names.contains(&expected), "{expected} in {names:?}");
    }
    check_all(&launches);
}

#[test]
fn an_unknown_setting_or_a_wrong_value_is_caught() {
    let dir = tempfile::tempdir().expect("tempdir");
    let launch = |config: &str, env: Vec<EnvSetting>| {
        let path = dir.path().join("master.yaml");
        std::fs::write(&path, config).expect("write");
        Launch {
            origin: "test".into(),
            service: Service::Master,
            config: Some(path),
            env,
        }
    };
    let good = "local:\n  executor_ip: 10.0.0.7\n";
    assert!(launch(good, Vec::new()).check().is_ok());
    let renamed = launch("local:\n  executor_address: 10.0.0.7\n", Vec::new());
    let error = renamed.check().expect_err("unknown key").to_string();
    assert!(error.contains("local.executor_address"), "{error}");
    let unknown_env = launch(
        good,
        vec![EnvSetting {
            name: "PRIMUS_MASTER__SHARDS".into(),
            value: None,
        }],
    );
    let error = unknown_env
        .check()
        .expect_err("unknown variable")
        .to_string();
    assert!(error.contains("PRIMUS_MASTER__SHARDS"), "{error}");
    let wrong_value = launch(
        good,
        vec![EnvSetting {
            name: "PRIMUS_LOCAL__EXECUTOR_IP".into(),
            value: Some("master-0".into()),
        }],
    );
    let error = wrong_value.check().expect_err("not an IP").to_string();
    assert!(error.contains("local.executor_ip"), "{error}");
}
