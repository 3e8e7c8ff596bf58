use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use primus_cli::up::{UpOptions, up};
use primus_cli::{print_table, probe, services};

/// Primus: train recommendation models from batch files and live streams, serve them fresh.
#[derive(Parser)]
#[command(name = "primus", version)]
struct Cli {
    #[command(subcommand)]
    command: Commands,
}

#[derive(Subcommand)]
enum Commands {
    /// Start a local cluster: NATS, Redis and every service as processes on this machine.
    Up {
        /// Data and logs of the local cluster.
        #[arg(long, default_value = ".primus")]
        data_dir: PathBuf,
        /// Folder holding the primus-* service binaries (default: next to this binary).
        #[arg(long)]
        bin_dir: Option<PathBuf>,
        #[arg(long, default_value_t = 4222)]
        nats_port: u16,
        #[arg(long, default_value_t = 6379)]
        redis_port: u16,
        /// Stop again as soon as every service is healthy (exit 0 only if all stop cleanly).
        #[arg(long)]
        check: bool,
    },
    /// gRPC health of services (default: the six services on their default local ports).
    Health {
        /// host:port addresses to check.
        addrs: Vec<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: starting the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Commands::Up {
            data_dir,
            bin_dir,
            nats_port,
            redis_port,
            check,
        } => {
            let bin_dir = match bin_dir {
                Some(dir) => dir,
                None => own_dir()?,
            };
            up(UpOptions {
                data_dir,
                bin_dir,
                nats_port,
                redis_port,
                check,
            })
            .await?;
            Ok(ExitCode::SUCCESS)
        }
        Commands::Health { addrs } => {
            let targets: Vec<(String, String)> = if addrs.is_empty() {
                services()
                    .iter()
                    .map(|(name, port)| (name.to_string(), format!("127.0.0.1:{port}")))
                    .collect()
            } else {
                addrs.iter().map(|a| (a.clone(), a.clone())).collect()
            };
            let mut rows = Vec::new();
            for (name, addr) in &targets {
                rows.push(probe(name, addr).await);
            }
            print_table(&rows);
            Ok(if rows.iter().all(|r| r.serving()) {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
    }
}

fn own_dir() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    exe.parent()
        .map(PathBuf::from)
        .ok_or_else(|| anyhow::anyhow!("cannot tell the folder of {}", exe.display()))
}
