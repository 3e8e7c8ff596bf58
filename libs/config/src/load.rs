use std::collections::HashMap;
use std::path::Path;

use config::{Config, Environment, File, FileFormat, Value};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Environment variables starting with this prefix and holding a `__` are settings.
pub const ENV_PREFIX: &str = "PRIMUS_";
const ENV_SECTION_SEPARATOR: &str = "__";

/// Why settings could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The settings file cannot be read or parsed.
    #[error("settings file {path}: {message}")]
    File {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// A key no setting has.
    #[error("unknown setting `{key}` (set in {origin})")]
    UnknownKey {
        /// The dotted key (`server.grpc_addr`).
        key: String,
        /// Where it was set (the file, or the environment variable).
        origin: String,
    },
    /// A key whose value does not fit its setting.
    #[error("setting `{key}` (set in {origin}): {message}")]
    Invalid {
        /// The dotted key (`server.grpc_addr`).
        key: String,
        /// Where it was set (the file, or the environment variable).
        origin: String,
        /// What is wrong with the value.
        message: String,
    },
    /// Anything else (the message says what).
    #[error("settings: {0}")]
    Other(String),
}

/// Whether an environment variable is a setting (`PRIMUS_<SECTION>__<KEY>`).
pub fn is_settings_variable(name: &str) -> bool {
    name.strip_prefix(ENV_PREFIX)
        .is_some_and(|rest| rest.contains(ENV_SECTION_SEPARATOR))
}

/// Renders settings as TOML, secrets included (a settings file for a process that needs
/// them; loadable as a `--config` file).
pub fn to_toml<T: Serialize>(settings: &T) -> Result<String, ConfigError> {
    toml::to_string(settings).map_err(|e| ConfigError::Other(e.to_string()))
}

/// Renders settings as TOML with every secret written as [`crate::REDACTED`] (what
/// `--print-settings` shows).
pub fn to_toml_redacted<T: Serialize>(settings: &T) -> Result<String, ConfigError> {
    crate::redacting(|| to_toml(settings))
}

/// Loads settings over `defaults` from an optional file and the process environment.
#[expect(
    clippy::disallowed_methods,
    reason = "the settings' environment layer: the one place a service's PRIMUS_* variables are read"
)]
pub fn load_from_process<T: DeserializeOwned + Serialize>(
    defaults: &T,
    file: Option<&Path>,
) -> Result<T, ConfigError> {
    load(defaults, file, std::env::vars())
}

/// Loads settings: `defaults`, then the file (if any), then the given environment.
pub fn load<T: DeserializeOwned + Serialize>(
    defaults: &T,
    file: Option<&Path>,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<T, ConfigError> {
    let defaults = Config::try_from(defaults).map_err(|e| ConfigError::Other(e.to_string()))?;
    let mut builder = Config::builder().add_source(defaults);
    if let Some(path) = file {
        builder = builder.add_source(File::from(path).format(file_format(path)?).required(true));
    }
    // Only PRIMUS_<SECTION>__<KEY> names are settings: a PRIMUS_TOKEN meant for the CLI
    // must not be read as an unknown setting `token`.
    let settings_env: HashMap<String, String> = env
        .into_iter()
        .filter(|(name, _)| is_settings_variable(name))
        .collect();
    builder = builder.add_source(
        Environment::with_prefix(ENV_PREFIX.trim_end_matches('_'))
            .prefix_separator("_")
            .separator(ENV_SECTION_SEPARATOR)
            .try_parsing(true)
            .source(Some(settings_env)),
    );
    let layered = builder.build().map_err(|e| file_error(file, e))?;
    let origins = Origins {
        layered: &layered,
        file,
    };

    let mut unknown = Vec::new();
    let parsed = serde_ignored::deserialize(layered.clone(), |path| unknown.push(path.to_string()))
        .map_err(|e| origins.describe(e))?;
    match unknown.into_iter().next() {
        Some(key) => Err(ConfigError::UnknownKey {
            origin: origins.of_key(&key),
            key,
        }),
        None => Ok(parsed),
    }
}

fn file_format(path: &Path) -> Result<FileFormat, ConfigError> {
    match path.extension().and_then(|e| e.to_str()) {
        Some("yaml" | "yml") => Ok(FileFormat::Yaml),
        Some("toml") => Ok(FileFormat::Toml),
        // JSON is YAML, so the YAML parser reads it.
        Some("json") => Ok(FileFormat::Yaml),
        _ => Err(ConfigError::File {
            path: path.display().to_string(),
            message: "unsupported extension: use .yaml, .yml, .toml or .json".into(),
        }),
    }
}

fn file_error(file: Option<&Path>, error: config::ConfigError) -> ConfigError {
    match file {
        Some(path) => ConfigError::File {
            path: path.display().to_string(),
            message: error.to_string(),
        },
        None => ConfigError::Other(error.to_string()),
    }
}

const DEFAULTS_ORIGIN: &str = "the defaults";
/// What the `config` crate records as the origin of environment values.
const ENV_ORIGIN: &str = "the environment";

/// Names where a value came from: the settings file as the user gave its path (the
/// `config` crate records it relative to the working directory), the environment, or the
/// defaults.
struct Origins<'a> {
    layered: &'a Config,
    file: Option<&'a Path>,
}

impl Origins<'_> {
    fn name(&self, recorded: Option<&str>) -> String {
        match (recorded, self.file) {
            (None, _) => DEFAULTS_ORIGIN.into(),
            (Some(ENV_ORIGIN), _) => ENV_ORIGIN.into(),
            (Some(_), Some(file)) => file.display().to_string(),
            (Some(other), None) => other.into(),
        }
    }

    /// (`Config::get` re-deserializes values and loses their origin, so walk the tree.)
    fn of_key(&self, key: &str) -> String {
        let mut value: Value = self.layered.cache.clone();
        for part in key.split('.') {
            match value.into_table().ok().and_then(|mut t| t.remove(part)) {
                Some(child) => value = child,
                None => return DEFAULTS_ORIGIN.into(),
            }
        }
        self.name(leaf_origin(value).as_deref())
    }

    fn describe(&self, error: config::ConfigError) -> ConfigError {
        let (key, origin, message) = match error {
            config::ConfigError::Type {
                origin,
                unexpected,
                expected,
                key,
            } => (
                key,
                origin,
                format!("expected {expected}, found {unexpected}"),
            ),
            config::ConfigError::At {
                error, origin, key, ..
            } => (key, origin, error.to_string()),
            other => return ConfigError::Other(other.to_string()),
        };
        let key = key.unwrap_or_default();
        let origin = match origin {
            Some(recorded) => self.name(Some(&recorded)),
            None => self.of_key(&key),
        };
        ConfigError::Invalid {
            key,
            origin,
            message,
        }
    }
}

/// A table has no origin of its own: take that of the first value inside it.
fn leaf_origin(value: Value) -> Option<String> {
    if let Some(origin) = value.origin() {
        return Some(origin.to_owned());
    }
    value.into_table().ok()?.into_values().find_map(leaf_origin)
}
