//! Layered settings for every Primus service, and the typed settings themselves.
//!
//! Each service's settings type lives here ([`MasterSettings`], [`PsSettings`], ...), not in
//! the service, so the master builds an executor's settings file from the same type the
//! executor loads it with.
//!
//! Layers, later wins: the service's built-in defaults, then a YAML, TOML or JSON
//! file given by `--config`, then `PRIMUS_<SECTION>__<KEY>` environment variables
//! (`PRIMUS_SERVER__GRPC_ADDR=0.0.0.0:7000` sets `server.grpc_addr`). A wrong type or an
//! unknown key fails the load with an error naming the key and the layer it came from.

#![warn(missing_docs)]

mod data_executor;
mod load;
mod master;
mod ps;
mod secret;
mod serving_sync;
mod settings;
mod trainer;

pub use data_executor::*;
pub use load::{
    ConfigError, ENV_PREFIX, is_settings_variable, load, load_from_process, to_toml,
    to_toml_redacted,
};
pub use master::*;
pub use ps::*;
pub use secret::{REDACTED, Secret, redacting};
pub use serving_sync::*;
pub use settings::*;
pub use trainer::*;

use serde::Serialize;
use serde::de::DeserializeOwned;

/// A settings type a service can be launched with.
pub trait ServiceSettings: Serialize + DeserializeOwned + Send + 'static {
    /// The logs and traces section.
    fn telemetry(&self) -> &TelemetrySettings;
}

impl ServiceSettings for NodeSettings {
    fn telemetry(&self) -> &TelemetrySettings {
        &self.telemetry
    }
}

impl ServiceSettings for ApiServerSettings {
    fn telemetry(&self) -> &TelemetrySettings {
        &self.telemetry
    }
}

/// A URL fit for logs and errors: credentials (`user:password@`) replaced by `***@`.
pub fn redact_url(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => match rest.split_once('/') {
            Some((authority, path)) => format!("{scheme}://{}/{path}", redact_authority(authority)),
            None => format!("{scheme}://{}", redact_authority(rest)),
        },
        None => url.to_owned(),
    }
}

/// The bearer tokens in a token file (`auth.token_file`, the CLI's `token_file`): the first
/// word of each line (what follows it is the token's scope and labels, which the server
/// reads), blank lines and `#` comments skipped.
pub fn tokens_in(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|token| !token.starts_with('#'))
}

fn redact_authority(authority: &str) -> String {
    match authority.rsplit_once('@') {
        Some((_, host)) => format!("***@{host}"),
        None => authority.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::{redact_url, tokens_in};

    #[test]
    fn token_files_skip_comments_and_blank_lines() {
        let tokens: Vec<&str> = tokens_in("# ops\n\n  alpha  \nbeta read team=ads\n").collect();
        assert_eq!(tokens, ["alpha", "beta"]);
    }

    #[test]
    fn credentials_never_reach_logs() {
        assert_eq!(
            redact_url("redis://:s3cret@10.0.0.5:6379/0"),
            "redis://***@10.0.0.5:6379/0"
        );
        assert_eq!(
            redact_url("nats://user:pw@nats:4222"),
            "nats://***@nats:4222"
        );
        assert_eq!(redact_url("nats://127.0.0.1:4222"), "nats://127.0.0.1:4222");
        assert_eq!(redact_url("s3://bucket/a@b"), "s3://bucket/a@b");
    }

    #[test]
    fn secrets_are_written_for_executors_and_redacted_everywhere_else() {
        let mut settings = super::MasterSettings::default();
        settings.storage.s3.secret_access_key = Some("planted-key-81f2".into());
        settings.nats.url = "nats://user:planted-pw@nats:4222".into();
        settings.redis.url = "redis://:planted-pw@redis:6379/0".into();
        let full = super::to_toml(&settings).expect("toml");
        assert!(
            full.contains("planted-key-81f2") && full.contains("planted-pw"),
            "{full}"
        );
        let loaded: super::MasterSettings = toml::from_str(&full).expect("loads back");
        assert_eq!(loaded, settings);
        let shown = super::to_toml_redacted(&settings).expect("toml");
        assert!(!shown.contains("planted"), "{shown}");
        assert!(
            shown.contains("secret_access_key = \"<redacted>\""),
            "{shown}"
        );
        assert!(shown.contains("nats://***@nats:4222"), "{shown}");
        let debug = format!("{settings:?}");
        assert!(!debug.contains("planted-key"), "{debug}");
        // Redaction ends with the call: the next settings file is whole again.
        assert_eq!(super::to_toml(&settings).expect("toml"), full);
    }
}
