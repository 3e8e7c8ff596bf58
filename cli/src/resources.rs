//! `apply`, `get`, `describe` and `delete`.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use primus_api_client::ApiClient;
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

/// Applies in order and stops at the first refusal (what came before it stays applied).
pub async fn apply(client: &ApiClient, resources: &[primus_spec::Resource]) -> Result<(), Failure> {
    for resource in resources {
        let id = format!(
            "{}/{}",
            resource.kind().as_str().to_lowercase(),
            resource.name()
        );
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
        println!("{id} {verb} (version {version})");
    }
    Ok(())
}

pub async fn get(
    client: &ApiClient,
    kind: Kind,
    name: Option<&str>,
    selector: HashMap<String, String>,
    format: Format,
) -> Result<(), Failure> {
    let (resources, single) = match name {
        Some(name) => (vec![client.get(kind, name).await?], true),
        None => (client.list(kind, selector).await?.resources, false),
    };
    let text = output::render(kind, &resources, format, single).map_err(Failure::server)?;
    print!("{text}");
    Ok(())
}

pub async fn describe(client: &ApiClient, kind: Kind, name: &str) -> Result<(), Failure> {
    let resource = client.get(kind, name).await?;
    print!("{}", output::describe(&resource).map_err(Failure::server)?);
    Ok(())
}

pub async fn delete(
    client: &ApiClient,
    kind: Kind,
    name: &str,
    expected_version: u64,
) -> Result<(), Failure> {
    let deleted = client.delete(kind, name, expected_version).await?;
    println!(
        "{}/{name} deleted (version {})",
        kind.as_str().to_lowercase(),
        deleted.resource_version
    );
    Ok(())
}

fn with_context(error: primus_api_client::ClientError, id: &str) -> Failure {
    let failure = Failure::from(error);
    Failure {
        exit_code: failure.exit_code,
        error: failure.error.context(format!("applying {id}")),
    }
}
