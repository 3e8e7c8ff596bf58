//! The files that describe the Primus services, checked against the services' own types:
//! what the deployment files tell each service (so a renamed or removed setting cannot
//! silently break a deployment), and the reference pages under `docs/reference/`
//! ([`mod@reference`], generated from the Job, Dataset and settings types).
//!
//! A [`Launch`] is one container that runs a service: the settings file it is given
//! (`--config`) and the `PRIMUS_<SECTION>__<KEY>` variables set for it. [`compose_launches`]
//! reads `deploy/docker-compose.yaml`; [`kubernetes_launches`] reads every manifest and
//! kustomization under `k8s/`. [`Launch::check`] loads the settings as the service would.

pub mod reference;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use primus_config::{ConfigError, is_settings_variable};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_yaml_ng::Value;

#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    #[error("{path}: {message}")]
    File { path: String, message: String },
    #[error("{origin}: {message}")]
    Settings { origin: String, message: String },
}

/// A Primus program, as the image's entrypoint names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    ApiServer,
    Master,
    DataExecutor,
    Trainer,
    Ps,
    ServingSync,
}

impl Service {
    pub fn from_program(name: &str) -> Option<Self> {
        Some(match name {
            "api-server" => Self::ApiServer,
            "master" => Self::Master,
            "data-executor" => Self::DataExecutor,
            "trainer" => Self::Trainer,
            "ps" => Self::Ps,
            "serving-sync" => Self::ServingSync,
            _ => return None,
        })
    }
}

/// One `PRIMUS_<SECTION>__<KEY>` variable; `value` is `None` when it comes from a secret,
/// the downward API or a shell, so only its name can be checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvSetting {
    pub name: String,
    pub value: Option<String>,
}

/// One container running a service.
#[derive(Debug, Clone)]
pub struct Launch {
    /// File and container, for messages.
    pub origin: String,
    pub service: Service,
    /// The settings file on this machine (the one mounted where `--config` points).
    pub config: Option<PathBuf>,
    pub env: Vec<EnvSetting>,
}

impl Launch {
    /// Loads the settings file as the service does (unknown keys and wrong types fail),
    /// then each variable over it: a known value must load; a variable whose value is not
    /// in the manifest must at least name an existing setting.
    pub fn check(&self) -> Result<(), DeployError> {
        match self.service {
            Service::ApiServer => self.check_as(&primus_config::ApiServerSettings::default()),
            Service::Master => self.check_as(&primus_config::MasterSettings::default()),
            Service::DataExecutor => self.check_as(&primus_config::DataExecutorSettings::default()),
            Service::Trainer => self.check_as(&primus_config::TrainerSettings::default()),
            Service::Ps => self.check_as(&primus_config::PsSettings::default()),
            Service::ServingSync => self.check_as(&primus_config::ServingSyncSettings::default()),
        }
    }

    fn check_as<T: DeserializeOwned + Serialize>(&self, defaults: &T) -> Result<(), DeployError> {
        let failed = |message: String| DeployError::Settings {
            origin: self.origin.clone(),
            message,
        };
        let file = self.config.as_deref();
        primus_config::load(defaults, file, std::iter::empty())
            .map_err(|e| failed(e.to_string()))?;
        for variable in &self.env {
            // A stand-in for values the manifest does not hold: a wrong type for most
            // settings, which still tells an existing key from an unknown one.
            let value = variable.value.clone().unwrap_or_else(|| "0".into());
            match primus_config::load(defaults, file, [(variable.name.clone(), value)]) {
                Ok(_) => {}
                Err(ConfigError::Invalid { .. }) if variable.value.is_none() => {}
                Err(e) => return Err(failed(format!("{}: {e}", variable.name))),
            }
        }
        Ok(())
    }
}

fn read_yaml(path: &Path) -> Result<Vec<Value>, DeployError> {
    let failed = |message: String| DeployError::File {
        path: path.display().to_string(),
        message,
    };
    let text = std::fs::read_to_string(path).map_err(|e| failed(e.to_string()))?;
    let mut documents = Vec::new();
    for document in serde_yaml_ng::Deserializer::from_str(&text) {
        let mut value: Value =
            serde::Deserialize::deserialize(document).map_err(|e| failed(e.to_string()))?;
        value.apply_merge().map_err(|e| failed(e.to_string()))?;
        if !value.is_null() {
            documents.push(value);
        }
    }
    Ok(documents)
}

fn strings(value: Option<&Value>) -> Vec<String> {
    match value {
        Some(Value::Sequence(items)) => items
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
        Some(Value::String(s)) => vec![s.clone()],
        _ => Vec::new(),
    }
}

/// The word after `--config` in a command line (list or shell string).
fn config_arg(words: &[String]) -> Option<String> {
    let words: Vec<&str> = words.iter().flat_map(|w| w.split_whitespace()).collect();
    words
        .windows(2)
        .find(|pair| pair[0] == "--config")
        .map(|pair| pair[1].to_owned())
}

/// Settings variables assigned inside shell command lines (`PRIMUS_A__B=... exec ...`).
fn shell_settings(words: &[String]) -> Vec<EnvSetting> {
    words
        .iter()
        .flat_map(|w| w.split_whitespace())
        .filter_map(|word| word.split_once('=').map(|(name, _)| name))
        .filter(|name| is_settings_variable(name))
        .map(|name| EnvSetting {
            name: name.to_owned(),
            value: None,
        })
        .collect()
}

/// The service a command runs: its first word when that names a program (the image's
/// entrypoint takes it), else the container's name.
fn service_of(command: &[String], container: &str) -> Option<Service> {
    command
        .first()
        .and_then(|first| Service::from_program(first))
        .or_else(|| Service::from_program(container))
}

/// Every service container of `deploy/docker-compose.yaml` under `repo`.
pub fn compose_launches(repo: &Path) -> Result<Vec<Launch>, DeployError> {
    let path = repo.join("deploy/docker-compose.yaml");
    let documents = read_yaml(&path)?;
    let services = documents
        .first()
        .and_then(|d| d.get("services"))
        .and_then(Value::as_mapping)
        .ok_or_else(|| DeployError::File {
            path: path.display().to_string(),
            message: "no `services` mapping".into(),
        })?;
    let mut launches = Vec::new();
    for (name, service) in services {
        let name = name.as_str().unwrap_or_default();
        let command = strings(service.get("command"));
        let Some(kind) = service_of(&command, name) else {
            continue;
        };
        let mounts = compose_mounts(service, path.parent().unwrap_or(repo));
        let mut env = shell_settings(&command);
        if let Some(Value::Mapping(vars)) = service.get("environment") {
            for (var, value) in vars {
                let Some(var) = var.as_str().filter(|v| is_settings_variable(v)) else {
                    continue;
                };
                env.push(EnvSetting {
                    name: var.to_owned(),
                    value: value.as_str().map(str::to_owned),
                });
            }
        }
        launches.push(Launch {
            origin: format!("{} service {name}", path.display()),
            service: kind,
            config: config_arg(&command).and_then(|c| host_path(&mounts, &c)),
            env,
        });
    }
    Ok(launches)
}

/// Bind mounts of a compose service: container path -> host path.
fn compose_mounts(service: &Value, compose_dir: &Path) -> BTreeMap<String, PathBuf> {
    strings(service.get("volumes"))
        .iter()
        .filter_map(|volume| {
            let mut parts = volume.split(':');
            let (host, container) = (parts.next()?, parts.next()?);
            host.starts_with('.')
                .then(|| (container.to_owned(), compose_dir.join(host)))
        })
        .collect()
}

fn host_path(mounts: &BTreeMap<String, PathBuf>, in_container: &str) -> Option<PathBuf> {
    mounts.iter().find_map(|(container, host)| {
        let rest = Path::new(in_container).strip_prefix(container).ok()?;
        Some(host.join(rest))
    })
}

/// Where the base's ConfigMap `primus-config` is mounted in its containers.
const K8S_CONFIG_DIR: &str = "/etc/primus/config";

/// Every service container in the manifests under `repo/k8s`, with its settings file
/// from the ConfigMap generator of the base, and once more for each overlay that
/// replaces that file.
pub fn kubernetes_launches(repo: &Path) -> Result<Vec<Launch>, DeployError> {
    let root = repo.join("k8s");
    let mut files = Vec::new();
    yaml_files(&root, &mut files)?;
    let mut settings_files: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    let mut manifests = Vec::new();
    for path in files {
        for document in read_yaml(&path)? {
            match document.get("kind").and_then(Value::as_str) {
                Some("Kustomization") => {
                    for generated in generator_files(&document, &path) {
                        let name = generated
                            .file_name()
                            .map(|n| n.to_string_lossy().into_owned())
                            .unwrap_or_default();
                        settings_files.entry(name).or_default().push(generated);
                    }
                }
                Some(_) => manifests.push((path.clone(), document)),
                None => {}
            }
        }
    }
    let mut launches = Vec::new();
    for (path, document) in &manifests {
        let mut containers = Vec::new();
        find_containers(document, &mut containers);
        for container in containers {
            let name = container.get("name").and_then(Value::as_str).unwrap_or("");
            let mut command = strings(container.get("command"));
            command.extend(strings(container.get("args")));
            let Some(service) = service_of(&command, name) else {
                continue;
            };
            let mut env = shell_settings(&command);
            env.extend(container_env(container));
            let file_name = config_arg(&command).and_then(|c| {
                Path::new(&c)
                    .strip_prefix(K8S_CONFIG_DIR)
                    .ok()
                    .map(|p| p.display().to_string())
            });
            let configs = file_name
                .and_then(|f| settings_files.get(&f).cloned())
                .unwrap_or_default();
            let origin = format!("{} container {name}", path.display());
            let launch = |config: Option<PathBuf>| Launch {
                origin: match &config {
                    Some(c) => format!("{origin} with {}", c.display()),
                    None => origin.clone(),
                },
                service,
                config,
                env: env.clone(),
            };
            if configs.is_empty() {
                launches.push(launch(None));
            }
            launches.extend(configs.into_iter().map(|c| launch(Some(c))));
        }
    }
    Ok(launches)
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), DeployError> {
    let entries = std::fs::read_dir(dir).map_err(|e| DeployError::File {
        path: dir.display().to_string(),
        message: e.to_string(),
    })?;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            yaml_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "yaml") {
            out.push(path);
        }
    }
    out.sort();
    Ok(())
}

/// The files of a kustomization's ConfigMap generators, relative to it.
fn generator_files(kustomization: &Value, path: &Path) -> Vec<PathBuf> {
    let dir = path.parent().unwrap_or(Path::new("."));
    match kustomization.get("configMapGenerator") {
        Some(Value::Sequence(generators)) => generators
            .iter()
            .flat_map(|g| strings(g.get("files")))
            .map(|f| dir.join(f.rsplit('=').next().unwrap_or(&f)))
            .collect(),
        _ => Vec::new(),
    }
}

fn find_containers<'a>(value: &'a Value, out: &mut Vec<&'a Value>) {
    match value {
        Value::Mapping(map) => {
            for (key, child) in map {
                if key.as_str() == Some("containers")
                    && let Value::Sequence(containers) = child
                {
                    out.extend(containers.iter());
                } else {
                    find_containers(child, out);
                }
            }
        }
        Value::Sequence(items) => items.iter().for_each(|i| find_containers(i, out)),
        _ => {}
    }
}

fn container_env(container: &Value) -> Vec<EnvSetting> {
    let Some(Value::Sequence(vars)) = container.get("env") else {
        return Vec::new();
    };
    vars.iter()
        .filter_map(|var| {
            let name = var.get("name")?.as_str()?;
            is_settings_variable(name).then(|| EnvSetting {
                name: name.to_owned(),
                // `$(VAR)` is expanded by the kubelet: its value is not known here.
                value: var
                    .get("value")
                    .and_then(Value::as_str)
                    .filter(|v| !v.contains("$("))
                    .map(str::to_owned),
            })
        })
        .collect()
}
