//! Where the API server is and which token to send: flags, then `PRIMUS_*` environment
//! (clap reads both), then the CLI config file, then the local default.

use std::path::{Path, PathBuf};

use primus_api_client::ClientSettings;
use serde::Deserialize;

use crate::Failure;

/// The CLI's own config file (`~/.config/primus/config.yaml` unless `--cli-config`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CliConfig {
    pub server: Option<String>,
    pub token: Option<String>,
    /// A file holding the token (first non-comment line), e.g. `.primus/token`.
    pub token_file: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
}

/// What the user gave on the command line or in the environment.
#[derive(Debug, Default, Clone)]
pub struct ConnectionArgs {
    pub server: Option<String>,
    pub token: Option<String>,
    pub token_file: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
    pub cli_config: Option<PathBuf>,
}

#[expect(
    clippy::disallowed_methods,
    reason = "the CLI's config file lives where XDG says"
)]
pub fn default_config_path() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".config")))?;
    Some(base.join("primus").join("config.yaml"))
}

/// Merges the layers; a missing token is bad input (exit 2) that says where to put one.
pub fn resolve(args: &ConnectionArgs) -> Result<ClientSettings, Failure> {
    let config = match &args.cli_config {
        // Named explicitly: it must exist.
        Some(path) => read_config(path)?,
        None => match default_config_path() {
            Some(path) if path.is_file() => read_config(&path)?,
            _ => CliConfig::default(),
        },
    };
    let server = args.server.clone().or(config.server).unwrap_or_else(|| {
        format!(
            "http://127.0.0.1:{}",
            primus_config::DEFAULT_PORTS.api_server
        )
    });
    let token = match (&args.token, &args.token_file) {
        (Some(token), _) => token.clone(),
        (None, Some(file)) => read_token(file)?,
        (None, None) => match (config.token, config.token_file) {
            (Some(token), _) => token,
            (None, Some(file)) => read_token(&file)?,
            (None, None) => {
                return Err(Failure::input(anyhow::anyhow!(
                    "no API token: pass --token or --token-file, set PRIMUS_TOKEN, or put `token:` in {}",
                    default_config_path().map_or("~/.config/primus/config.yaml".into(), |p| p
                        .display()
                        .to_string())
                )));
            }
        },
    };
    Ok(ClientSettings {
        server,
        token: token.into(),
        ca_file: args.ca_file.clone().or(config.ca_file),
    })
}

fn read_config(path: &Path) -> Result<CliConfig, Failure> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Failure::input(anyhow::anyhow!("cannot read {}: {e}", path.display())))?;
    if text.trim().is_empty() {
        return Ok(CliConfig::default());
    }
    serde_yaml_ng::from_str(&text)
        .map_err(|e| Failure::input(anyhow::anyhow!("CLI config {}: {e}", path.display())))
}

fn read_token(path: &Path) -> Result<String, Failure> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Failure::input(anyhow::anyhow!(
            "cannot read token file {}: {e}",
            path.display()
        ))
    })?;
    primus_config::tokens_in(&text)
        .next()
        .map(str::to_owned)
        .ok_or_else(|| {
            Failure::input(anyhow::anyhow!(
                "token file {} holds no token",
                path.display()
            ))
        })
}
