//! `apply`, `get`, `describe` and `delete`, against the API server or (`--kubernetes`)
//! Primus's custom resources in a Kubernetes namespace.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use primus_api_client::ApiClient;
#[cfg(feature = "kubernetes")]
use primus_kube_resources::client::{Applied, CustomResources, KubeError};
use primus_proto::v1::Resource;
use primus_spec::Kind;

use crate::Failure;
use crate::output::{self, Format};

pub fn parse_kind(text: &str) -> Result<Kind, Failure> {
    Kind::parse(text).ok_or_else(|| {
        Failure::input(anyhow::anyhow!(
            "{text:?} is not a resource kind (job, dataset, metric)"
        ))
    })
}

/// `key=value` pairs of a label selector.
pub fn parse_selector(pairs: &[String]) -> Result<HashMap<String, String>, Failure> {
    pairs
        .iter()
        .map(|pair| {
            pair.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .ok_or_else(|| {
                    Failure::input(anyhow::anyhow!("--selector {pair:?}: expected key=value"))
                })
        })
        .collect()
}

/// Reads and validates every file before anything is sent, so one bad document applies
/// nothing. `-` reads standard input. Relative local paths in the resources are made
/// absolute against the current directory.
pub fn read_resources(files: &[PathBuf]) -> Result<Vec<primus_spec::Resource>, Failure> {
    let here = std::env::current_dir()
        .map_err(|e| Failure::input(anyhow::anyhow!("the current directory: {e}")))?;
    let mut resources = Vec::new();
    for file in files {
        let (name, text) = read_file(file)?;
        let parsed =
            primus_spec::parse_documents(&name, &text).map_err(|e| Failure::input(e.into()))?;
        resources.extend(parsed.into_iter().map(|mut resource| {
            resource.resolve_local_paths(&here);
            resource
        }));
    }
    // Datasets before the Jobs that reference them; otherwise file order.
    resources.sort_by_key(|r| match r.kind() {
        Kind::Dataset => 0,
        Kind::Job => 1,
        Kind::Metric => 2,
    });
    Ok(resources)
}

fn read_file(file: &Path) -> Result<(String, String), Failure> {
    let limit = primus_spec::MAX_DOCUMENT_BYTES as u64;
    if file == Path::new("-") {
        let mut text = String::new();
        // One byte over the limit is enough for the parser to report the size.
        std::io::stdin()
            .take(limit + 1)
            .read_to_string(&mut text)
            .map_err(|e| Failure::input(anyhow::anyhow!("reading standard input: {e}")))?;
        return Ok(("<stdin>".into(), text));
    }
    let name = file.display().to_string();
    let size = std::fs::metadata(file)
        .map_err(|e| Failure::input(anyhow::anyhow!("cannot read {name}: {e}")))?
        .len();
    if size > limit {
        return Err(Failure::input(anyhow::anyhow!(
            "{name}: {size} bytes is over the {limit}-byte limit for a resource file"
        )));
    }
    let text = std::fs::read_to_string(file)
        .map_err(|e| Failure::input(anyhow::anyhow!("cannot read {name}: {e}")))?;
    Ok((name, text))
}

/// Where resources live: the Primus API server, or Primus's custom resources in one
/// Kubernetes namespace (`--kubernetes`).
pub enum Source {
    ApiServer(ApiClient),
    #[cfg(feature = "kubernetes")]
    Kubernetes(CustomResources),
}

/// The field manager of what `primus apply --kubernetes` writes.
#[cfg(feature = "kubernetes")]
const MANAGER: &str = "primus-cli";

/// Applies in order and stops at the first refusal (what came before it stays applied).
pub async fn apply(source: &Source, resources: &[primus_spec::Resource]) -> Result<(), Failure> {
    for resource in resources {
        let id = format!(
            "{}/{}",
            resource.kind().as_str().to_lowercase(),
            resource.name()
        );
        let outcome = match source {
            Source::ApiServer(client) => {
                let response = client
                    .apply(resource, 0)
                    .await
                    .map_err(|e| with_context(e, &id))?;
                let version = response.resource.map_or(0, |r| r.resource_version);
                let verb = match (response.created, response.changed) {
                    (true, _) => "created",
                    (false, true) => "configured",
                    (false, false) => "unchanged",
                };
                format!("{verb} (version {version})")
            }
            #[cfg(feature = "kubernetes")]
            Source::Kubernetes(custom) => {
                let applied = (custom.apply(resource, MANAGER).await)
                    .map_err(|e| kube_failure(e).context(format!("applying {id}")))?;
                let verb = match applied {
                    Applied::Created => "created",
                    Applied::Configured => "configured",
                    Applied::Unchanged => "unchanged",
                };
                format!("{verb} (namespace {})", custom.namespace())
            }
        };
        println!("{id} {outcome}");
    }
    Ok(())
}

pub async fn get(
    source: &Source,
    kind: Kind,
    name: Option<&str>,
    selector: HashMap<String, String>,
    format: Format,
) -> Result<(), Failure> {
    let (resources, single) = match name {
        Some(name) => (vec![one(source, kind, name).await?], true),
        None => match source {
            Source::ApiServer(client) => (client.list(kind, selector).await?.resources, false),
            #[cfg(feature = "kubernetes")]
            Source::Kubernetes(custom) => {
                let listed = custom.list(kind, &selector).await;
                (listed.map_err(kube_failure)?, false)
            }
        },
    };
    let text = output::render(kind, &resources, format, single).map_err(Failure::server)?;
    print!("{text}");
    Ok(())
}

pub async fn describe(source: &Source, kind: Kind, name: &str) -> Result<(), Failure> {
    let resource = one(source, kind, name).await?;
    print!("{}", output::describe(&resource).map_err(Failure::server)?);
    Ok(())
}

/// Resource `name` of `kind`; one that does not exist is a failure (exit 1).
async fn one(source: &Source, kind: Kind, name: &str) -> Result<Resource, Failure> {
    match source {
        Source::ApiServer(client) => Ok(client.get(kind, name).await?),
        #[cfg(feature = "kubernetes")]
        Source::Kubernetes(custom) => match custom.get(kind, name).await {
            Ok(Some(resource)) => Ok(resource),
            Ok(None) => Err(Failure::server(anyhow::anyhow!(
                "{}/{name} not found in namespace {}",
                kind.as_str().to_lowercase(),
                custom.namespace()
            ))),
            Err(e) => Err(kube_failure(e)),
        },
    }
}

pub async fn delete(
    source: &Source,
    kind: Kind,
    name: &str,
    expected_version: u64,
) -> Result<(), Failure> {
    let id = format!("{}/{name}", kind.as_str().to_lowercase());
    match source {
        Source::ApiServer(client) => {
            let deleted = client.delete(kind, name, expected_version).await?;
            println!("{id} deleted (version {})", deleted.resource_version);
        }
        #[cfg(feature = "kubernetes")]
        Source::Kubernetes(_) if expected_version != 0 => {
            return Err(Failure::input(anyhow::anyhow!(
                "--if-version compares the API server's versions: it does not apply with --kubernetes"
            )));
        }
        #[cfg(feature = "kubernetes")]
        Source::Kubernetes(custom) => match custom.delete(kind, name).await {
            Ok(true) => println!("{id} deleted (namespace {})", custom.namespace()),
            Ok(false) => {
                return Err(Failure::server(anyhow::anyhow!(
                    "{id} not found in namespace {}",
                    custom.namespace()
                )));
            }
            Err(e) => return Err(kube_failure(e)),
        },
    }
    Ok(())
}

/// A refusal of what was sent (invalid, 4xx but not found or forbidden) is bad input
/// (exit 2); the rest is the server's or the connection's (exit 1).
#[cfg(feature = "kubernetes")]
pub fn kube_failure(error: KubeError) -> Failure {
    let input = matches!(&error, KubeError::Api(kube::Error::Api(status))
        if matches!(status.code, 400 | 409 | 422))
        || matches!(error, KubeError::Convert(_));
    if input {
        Failure::input(error.into())
    } else {
        Failure::server(error.into())
    }
}
fn with_context(error: primus_api_client::ClientError, id: &str) -> Failure {
    let failure = Failure::from(error);
    Failure {
        exit_code: failure.exit_code,
        error: failure.error.context(format!("applying {id}")),
    }
}
