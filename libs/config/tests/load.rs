use std::io::Write;
use std::path::Path;

use primus_config::{ApiServerSettings, ConfigError, LogFormat, NodeSettings, load};

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn file(ext: &str, body: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::Builder::new()
        .suffix(ext)
        .tempfile()
        .expect("temp file");
    f.write_all(body.as_bytes()).expect("write");
    f
}

#[test]
fn defaults_apply_without_file_or_env() {
    let defaults = NodeSettings::on_port(7071);
    let loaded: NodeSettings = load(&defaults, None, env(&[])).expect("load");
    assert_eq!(loaded, defaults);
}

#[test]
fn file_overrides_defaults_and_env_overrides_file() {
    let f = file(
        ".yaml",
        "server:\n  grpc_addr: 127.0.0.1:9000\nnats:\n  url: nats://10.0.0.1:4222\n  connect_attempts: 3\ntelemetry:\n  log_format: json\n",
    );
    let loaded: NodeSettings = load(
        &NodeSettings::on_port(7071),
        Some(f.path()),
        env(&[
            ("PRIMUS_NATS__URL", "nats://127.0.0.1:5555"),
            ("PRIMUS_TELEMETRY__OTLP_ENDPOINT", "http://127.0.0.1:4317"),
        ]),
    )
    .expect("load");
    assert_eq!(loaded.server.grpc_addr.port(), 9000);
    assert_eq!(loaded.nats.url, "nats://127.0.0.1:5555");
    assert_eq!(loaded.nats.connect_attempts, 3);
    assert_eq!(
        loaded.nats.subject_prefix, "primus",
        "untouched keys keep defaults"
    );
    assert_eq!(loaded.telemetry.log_format, LogFormat::Json);
    assert_eq!(
        loaded.telemetry.otlp_endpoint.as_deref(),
        Some("http://127.0.0.1:4317")
    );
}

#[test]
fn toml_files_load_too() {
    let f = file(".toml", "[redis]\nurl = \"redis://127.0.0.1:6400\"\n");
    let loaded: ApiServerSettings =
        load(&ApiServerSettings::default(), Some(f.path()), env(&[])).expect("load");
    assert_eq!(loaded.redis.url, "redis://127.0.0.1:6400");
}

#[test]
fn unknown_key_in_file_names_key_and_file() {
    let f = file(".yaml", "server:\n  grpc_adr: 127.0.0.1:9000\n");
    let err = load(&NodeSettings::on_port(1), Some(f.path()), env(&[])).expect_err("must fail");
    match &err {
        ConfigError::UnknownKey { key, origin } => {
            assert_eq!(key, "server.grpc_adr");
            assert_eq!(origin, &f.path().display().to_string(), "{err}");
        }
        other => panic!("expected UnknownKey, got {other}"),
    }
}

#[test]
fn unknown_key_in_env_names_the_environment() {
    let err = load(
        &NodeSettings::on_port(1),
        None,
        env(&[("PRIMUS_NATS__URLL", "nats://x")]),
    )
    .expect_err("must fail");
    let text = err.to_string();
    assert!(
        text.contains("nats.urll") && text.contains("environment"),
        "{text}"
    );
}

#[test]
fn wrong_type_names_key_and_origin() {
    let f = file(".yaml", "nats:\n  connect_attempts: many\n");
    let err = load(&NodeSettings::on_port(1), Some(f.path()), env(&[])).expect_err("must fail");
    let text = err.to_string();
    assert!(matches!(err, ConfigError::Invalid { .. }), "{text}");
    assert!(text.contains("nats.connect_attempts"), "{text}");
    assert!(text.contains(&*f.path().to_string_lossy()), "{text}");

    let err = load(
        &NodeSettings::on_port(1),
        None,
        env(&[("PRIMUS_SERVER__GRPC_ADDR", "not-an-address")]),
    )
    .expect_err("must fail");
    let text = err.to_string();
    assert!(
        text.contains("server.grpc_addr") && text.contains("environment"),
        "{text}"
    );
}

#[test]
fn non_settings_env_vars_are_ignored() {
    // PRIMUS_TOKEN (no section) belongs to the CLI, not to a service's settings.
    let loaded: NodeSettings = load(
        &NodeSettings::on_port(1),
        None,
        env(&[("PRIMUS_TOKEN", "secret"), ("HOME", "/root")]),
    )
    .expect("load");
    assert_eq!(loaded, NodeSettings::on_port(1));
}

#[test]
fn missing_or_unsupported_file_is_a_clear_error() {
    let err = load(
        &NodeSettings::on_port(1),
        Some(Path::new("/nonexistent/primus.yaml")),
        env(&[]),
    )
    .expect_err("must fail");
    assert!(
        err.to_string().contains("/nonexistent/primus.yaml"),
        "{err}"
    );

    let f = file(".ini", "x=1");
    let err = load(&NodeSettings::on_port(1), Some(f.path()), env(&[])).expect_err("must fail");
    assert!(err.to_string().contains("unsupported extension"), "{err}");
}

#[test]
fn malformed_yaml_names_the_file() {
    let f = file(".yaml", "server: [unclosed\n");
    let err = load(&NodeSettings::on_port(1), Some(f.path()), env(&[])).expect_err("must fail");
    assert!(matches!(err, ConfigError::File { .. }), "{err}");
}

#[test]
fn printed_settings_load_back_unchanged() {
    let mut settings = ApiServerSettings::default();
    settings.telemetry.otlp_endpoint = Some("http://127.0.0.1:4317".into());
    let text = primus_config::to_toml(&settings).expect("toml");
    let f = file(".toml", &text);
    let loaded: ApiServerSettings =
        load(&ApiServerSettings::default(), Some(f.path()), env(&[])).expect("load");
    assert_eq!(loaded, settings);
}

#[test]
fn unknown_section_names_the_file() {
    let f = file(".yaml", "redis:\n  url: redis://127.0.0.1:6379\n");
    let err = load(&NodeSettings::on_port(1), Some(f.path()), env(&[])).expect_err("must fail");
    let text = err.to_string();
    assert!(text.contains("`redis`"), "{text}");
    assert!(text.contains(&*f.path().to_string_lossy()), "{text}");
}
