//! The harness every Primus service binary runs in.
//!
//! [`main`] parses `--config`/`--help`/`--version`, loads the service's settings
//! (defaults, file, `PRIMUS_*` env), starts the tokio runtime and telemetry, turns SIGTERM
//! and SIGINT into a [`Shutdown`], runs the service, and flushes traces before exiting.
//! [`Node`] is the service's gRPC listener: it serves the [`Services`] it is given and always
//! `grpc.health.v1.Health`, which reports NOT_SERVING while a dependency (NATS, Redis) is
//! unreachable or once draining began, and gRPC reflection describing its services.

#![warn(missing_docs)]

mod auth;
pub mod http;
mod identity;
mod node;
mod services;
mod shutdown;
pub mod usage;

pub use auth::{BearerTokens, Grant, Scope, grant_of, labels_text};
pub use identity::{ExecutorIdentity, setting_or_env};
pub use node::{Node, serve_nats_node};
pub use services::Services;
pub use shutdown::Shutdown;

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;

use anyhow::Context;
use clap::{Arg, ArgAction, Command};
use primus_config::ServiceSettings;

fn command(service: &'static str, about: &'static str) -> Command {
    Command::new(service)
        .about(about)
        .version(env!("CARGO_PKG_VERSION"))
        .arg(
            Arg::new("config")
                .long("config")
                .short('c')
                .value_name("FILE")
                .value_parser(clap::value_parser!(PathBuf))
                .help("Settings file (.yaml, .yml, .toml or .json)"),
        )
        .arg(
            Arg::new("print-settings")
                .long("print-settings")
                .action(ArgAction::SetTrue)
                .help("Print the effective settings as TOML and exit"),
        )
        .after_help(
            "Settings: built-in defaults, then the --config file, then environment variables \
             PRIMUS_<SECTION>__<KEY> (e.g. PRIMUS_NATS__URL=nats://10.0.0.5:4222).\n\
             Unknown keys and wrong types fail at start, naming the key and where it was set.\n\
             SIGTERM or SIGINT: stop accepting work, drain, exit 0.",
        )
}

/// A command-line flag that sets one settings key (it wins over file and environment).
pub struct SettingFlag {
    /// The flag (`--shard`).
    pub long: &'static str,
    /// Dotted settings key, e.g. `master.shard`.
    pub key: &'static str,
    /// Its line in `--help`.
    pub help: &'static str,
}

/// A service's whole life, from binding its ports to the end of its drain. Each service's
/// library boxes its own: the state machine is then compiled once, in that library, not
/// again (optimised) in its binary and in every test binary that runs the service.
pub type ServiceFuture = Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>>;

/// Runs a service binary: `run` gets its settings and a [`Shutdown`] that fires on
/// SIGTERM/SIGINT, and should return once it has drained.
pub fn main<S: ServiceSettings>(
    service: &'static str,
    about: &'static str,
    defaults: S,
    run: fn(S, Shutdown) -> ServiceFuture,
) -> anyhow::Result<()> {
    main_with_flags(service, about, defaults, &[], run)
}

/// [`main`] with service-specific flags that set settings keys.
#[expect(
    clippy::disallowed_methods,
    reason = "the settings' environment layer of every service"
)]
pub fn main_with_flags<S: ServiceSettings>(
    service: &'static str,
    about: &'static str,
    defaults: S,
    flags: &[SettingFlag],
    run: fn(S, Shutdown) -> ServiceFuture,
) -> anyhow::Result<()> {
    let command = flags.iter().fold(command(service, about), |command, flag| {
        command.arg(
            Arg::new(flag.long)
                .long(flag.long)
                .value_name("VALUE")
                .help(format!("{} (settings key `{}`)", flag.help, flag.key)),
        )
    });
    let matches = command.get_matches();
    let file = matches.get_one::<PathBuf>("config");
    // A flag is applied as the environment variable of its key, after the real ones.
    let overrides = flags.iter().filter_map(|flag| {
        let value = matches.get_one::<String>(flag.long)?;
        let name = format!(
            "{}{}",
            primus_config::ENV_PREFIX,
            flag.key.replace('.', "__").to_uppercase()
        );
        Some((name, value.clone()))
    });
    let environment: Vec<(String, String)> = std::env::vars().chain(overrides).collect();
    let settings: S = primus_config::load(&defaults, file.map(PathBuf::as_path), environment)
        .with_context(|| format!("{service}: invalid settings"))?;
    if matches.get_flag("print-settings") {
        return print_settings(&settings);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name(service)
        .build()
        .context("starting the tokio runtime")?;
    runtime.block_on(async move {
        let telemetry = primus_telemetry::init(service, settings.telemetry())?;
        let shutdown = Shutdown::new();
        shutdown.trigger_on_signals()?;
        tracing::info!(service, version = env!("CARGO_PKG_VERSION"), "starting");
        let result = run(settings, shutdown).await;
        match &result {
            Ok(()) => tracing::info!(service, "stopped"),
            Err(e) => tracing::error!(service, error = format!("{e:#}"), "failed"),
        }
        telemetry.shutdown();
        result
    })
}

/// `--print-settings`: the effective settings as TOML, secrets redacted, on stdout.
#[expect(clippy::print_stdout, reason = "--print-settings prints the settings")]
fn print_settings<S: ServiceSettings>(settings: &S) -> anyhow::Result<()> {
    print!("{}", primus_config::to_toml_redacted(settings)?);
    Ok(())
}
