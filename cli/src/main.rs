use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use primus_api_client::ApiClient;
use primus_cli::cluster::ClusterArgs;
use primus_cli::connection::{ConnectionArgs, resolve};
use primus_cli::datagen::{DatagenCommand, datagen};
use primus_cli::import::{ImportCommand, import};
use primus_cli::output::Format;
use primus_cli::replay::{ReplayArgs, replay};
use primus_cli::resources::{self, Source, parse_kind, parse_selector, read_resources};
use primus_cli::simulate::{SimulateArgs, run_simulation};
use primus_cli::up::{UpOptions, up};
use primus_cli::{Failure, print_table, probe, services, watch};

/// Primus: train recommendation models from batch files and live streams, serve them fresh.
///
/// Exit codes: 0 ok; 1 server or connection error (or a watched job failed); 2 bad input.
#[derive(Parser)]
#[command(name = "primus", version)]
struct Cli {
    #[command(flatten)]
    connection: Connection,
    #[command(subcommand)]
    command: Commands,
}

/// Where the API server is (flags, then PRIMUS_* environment, then the CLI config file).
#[derive(Args)]
struct Connection {
    /// API server address, http://host:port or https://host:port.
    #[arg(long, env = "PRIMUS_SERVER", global = true)]
    server: Option<String>,
    /// Bearer token for the API server.
    #[arg(long, env = "PRIMUS_TOKEN", global = true, hide_env_values = true)]
    token: Option<String>,
    /// File holding the bearer token (e.g. .primus/token of `primus up`).
    #[arg(long, env = "PRIMUS_TOKEN_FILE", global = true)]
    token_file: Option<PathBuf>,
    /// apply, get, describe and delete Primus's custom resources in Kubernetes
    /// (PrimusJob, PrimusDataset, PrimusMetric) instead of the API server's resources.
    #[arg(long, env = "PRIMUS_KUBERNETES", global = true)]
    kubernetes: bool,
    /// The kubeconfig of --kubernetes (default: KUBECONFIG, ~/.kube/config, in-cluster).
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,
    /// The namespace of --kubernetes (default: the kubeconfig's).
    #[arg(long, short = 'n', global = true)]
    namespace: Option<String>,
    /// CA certificate (PEM) that signed the API server's TLS certificate.
    #[arg(long, env = "PRIMUS_CA_FILE", global = true)]
    ca_file: Option<PathBuf>,
    /// CLI config file with server, token or token_file, ca_file
    /// (default: ~/.config/primus/config.yaml when it exists).
    #[arg(long, env = "PRIMUS_CLI_CONFIG", global = true)]
    cli_config: Option<PathBuf>,
}

#[derive(Subcommand)]
enum Commands {
    /// Create or update the resources in files (several per file, `---` separated; `-` is stdin).
    Apply {
        #[arg(short = 'f', long = "filename", required = true)]
        files: Vec<PathBuf>,
    },
    /// List resources of a kind, or show one.
    Get {
        /// job, dataset or metric (plural works too).
        kind: String,
        name: Option<String>,
        #[arg(short, long, value_enum, default_value_t = Format::Table)]
        output: Format,
        /// Only resources with this label (key=value; repeatable).
        #[arg(short = 'l', long = "selector")]
        selector: Vec<String>,
    },
    /// Show one resource in detail: metadata, status with conditions, spec.
    Describe { kind: String, name: String },
    /// Delete a resource.
    Delete {
        kind: String,
        name: String,
        /// Delete only if the resource is still at this version.
        #[arg(long, default_value_t = 0)]
        if_version: u64,
    },
    /// Show the current state, then every change live (a job: until it ends).
    Watch { kind: String, name: Option<String> },
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
    /// Write a synthetic data set as time-partitioned Parquet (zstd).
    Datagen {
        #[command(subcommand)]
        command: DatagenCommand,
    },
    /// Publish a Parquet data set onto a JetStream subject, in time order, at a given rate.
    Replay(ReplayArgs),
    /// Write a stored Parquet data set again with each session's rows together (RecD's
    /// clustering), and print the storage ratio it achieved.
    Cluster(ClusterArgs),
    /// Import a public data set (fetched by scripts/install-deps.sh) as time-partitioned Parquet.
    Import {
        #[command(subcommand)]
        command: ImportCommand,
    },
    /// Simulate a cluster under each resource policy (static, Primus, DLRover-RM) on a
    /// seeded trace of Jobs, and compare their JCT, completion rate and utilisation.
    Simulate(SimulateArgs),
    /// Print the CustomResourceDefinitions of PrimusJob, PrimusDataset and PrimusMetric
    /// (what `kubectl apply -k k8s/crds` installs), as YAML.
    Crds,
    /// gRPC health of services (default: the standalone services on their default local ports).
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
        Err(failure) => {
            eprintln!(
                "error: {}",
                primus_telemetry::error_chain(failure.error.as_ref())
            );
            ExitCode::from(failure.exit_code)
        }
    }
}

impl Connection {
    async fn client(&self) -> Result<ApiClient, Failure> {
        let settings = resolve(&ConnectionArgs {
            server: self.server.clone(),
            token: self.token.clone(),
            token_file: self.token_file.clone(),
            ca_file: self.ca_file.clone(),
            cli_config: self.cli_config.clone(),
        })?;
        Ok(ApiClient::connect(&settings).await?)
    }

    /// The API server, or with --kubernetes the cluster's custom resources.
    async fn source(&self) -> Result<Source, Failure> {
        if !self.kubernetes {
            return Ok(Source::ApiServer(self.client().await?));
        }
        #[cfg(not(feature = "kubernetes"))]
        return Err(primus_cli::without_kubernetes("--kubernetes"));
        #[cfg(feature = "kubernetes")]
        {
            let custom = primus_kube_resources::client::CustomResources::connect(
                self.kubeconfig.as_deref(),
                self.namespace.as_deref(),
            )
            .await
            .map_err(resources::kube_failure)?;
            Ok(Source::Kubernetes(custom))
        }
    }
}

async fn run(cli: Cli) -> Result<ExitCode, Failure> {
    let connection = cli.connection;
    match cli.command {
        Commands::Apply { files } => {
            // Every file is read and validated before the first call.
            let resources = read_resources(&files)?;
            resources::apply(&connection.source().await?, &resources).await?;
        }
        Commands::Get {
            kind,
            name,
            output,
            selector,
        } => {
            let kind = parse_kind(&kind)?;
            let selector = parse_selector(&selector)?;
            let source = connection.source().await?;
            resources::get(&source, kind, name.as_deref(), selector, output).await?;
        }
        Commands::Describe { kind, name } => {
            let kind = parse_kind(&kind)?;
            resources::describe(&connection.source().await?, kind, &name).await?;
        }
        Commands::Delete {
            kind,
            name,
            if_version,
        } => {
            let kind = parse_kind(&kind)?;
            resources::delete(&connection.source().await?, kind, &name, if_version).await?;
        }
        Commands::Watch { kind, name } => {
            let kind = parse_kind(&kind)?;
            if connection.kubernetes {
                return Err(no_kubernetes_watch(kind));
            }
            watch::watch(&connection.client().await?, kind, name.as_deref()).await?;
        }
        Commands::Up {
            data_dir,
            bin_dir,
            nats_port,
            redis_port,
            check,
        } => {
            let bin_dir = match bin_dir {
                Some(dir) => dir,
                None => own_dir().map_err(Failure::server)?,
            };
            up(UpOptions {
                data_dir,
                bin_dir,
                nats_port,
                redis_port,
                check,
            })
            .await
            .map_err(Failure::server)?;
        }
        Commands::Datagen { command } => datagen(command).await?,
        Commands::Import { command } => import(command).await?,
        Commands::Replay(args) => replay(args).await?,
        Commands::Cluster(args) => primus_cli::cluster::run(args).await?,
        Commands::Simulate(args) => run_simulation(args)?,
        Commands::Crds => primus_cli::print_crds()?,
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
            if !rows.iter().all(|r| r.serving()) {
                return Ok(ExitCode::from(1));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn own_dir() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    exe.parent()
        .map(PathBuf::from)
        .ok_or_else(|| anyhow::anyhow!("cannot tell the folder of {}", exe.display()))
}

/// `watch --kubernetes`: the custom resources are watched with kubectl.
#[cfg(feature = "kubernetes")]
fn no_kubernetes_watch(kind: primus_spec::Kind) -> Failure {
    Failure::input(anyhow::anyhow!(
        "watch follows the API server's Watch; with --kubernetes use `kubectl get {} -w`",
        primus_kube_resources::CustomKind::of(kind).plural
    ))
}

/// `watch --kubernetes` in a `primus` built without Kubernetes.
#[cfg(not(feature = "kubernetes"))]
fn no_kubernetes_watch(_kind: primus_spec::Kind) -> Failure {
    primus_cli::without_kubernetes("--kubernetes")
}
