use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt};
use primus_config::StorageSettings;

use crate::StorageError;

/// A store and a prefix inside it; object paths given to its methods are relative to it.
#[derive(Clone, Debug)]
pub struct Location {
    store: Arc<dyn ObjectStore>,
    /// `s3://bucket`, `file://`, `memory://name`: the store's root as a URL.
    root_url: String,
    prefix: Path,
}

impl Location {
    /// The object store.
    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The prefix inside it.
    pub fn prefix(&self) -> &Path {
        &self.prefix
    }

    /// The store path of `relative` (`a/b.parquet`) under this location's prefix.
    pub fn path(&self, relative: &str) -> Path {
        relative
            .split('/')
            .filter(|part| !part.is_empty())
            .fold(self.prefix.clone(), |path, part| path.clone().join(part))
    }

    /// The URL of a store path, for messages and for handing work to other processes.
    pub fn url_of(&self, path: &Path) -> String {
        format!("{}/{}", self.root_url, path)
    }

    /// The location's own URL.
    pub fn url(&self) -> String {
        self.url_of(&self.prefix)
    }

    /// Writes one object whole.
    pub async fn put(&self, path: &Path, bytes: Bytes) -> Result<(), StorageError> {
        self.store
            .put(path, bytes.into())
            .await
            .map(|_| ())
            .map_err(|e| StorageError::from_store(self.url_of(path), e))
    }

    /// One object's size and modification time.
    pub async fn head(&self, path: &Path) -> Result<ObjectMeta, StorageError> {
        self.store
            .head(path)
            .await
            .map_err(|e| StorageError::from_store(self.url_of(path), e))
    }

    /// Reads one object whole.
    pub async fn get(&self, path: &Path) -> Result<Bytes, StorageError> {
        let url = || self.url_of(path);
        let result = self
            .store
            .get(path)
            .await
            .map_err(|e| StorageError::from_store(url(), e))?;
        result
            .bytes()
            .await
            .map_err(|e| StorageError::from_store(url(), e))
    }

    /// Every object under `relative` (recursively), sorted by path.
    pub async fn list(&self, relative: &str) -> Result<Vec<ObjectMeta>, StorageError> {
        let path = self.path(relative);
        let listed: Result<Vec<ObjectMeta>, _> = self.store.list(Some(&path)).try_collect().await;
        match listed {
            Ok(mut objects) => {
                objects.sort_by(|a, b| a.location.cmp(&b.location));
                Ok(objects)
            }
            Err(error) => Err(self.classify_list_error(&path, error).await),
        }
    }

    /// Deletes every object under `relative` (recursively); returns how many there were.
    pub async fn delete_all(&self, relative: &str) -> Result<usize, StorageError> {
        let objects = self.list(relative).await?;
        for object in &objects {
            self.store
                .delete(&object.location)
                .await
                .map_err(|e| StorageError::from_store(self.url_of(&object.location), e))?;
        }
        Ok(objects.len())
    }

    /// object_store reports a refused LIST as a generic error (the HTTP status is not
    /// reachable through its public types), while HEAD maps 401/403 properly. So a failed
    /// list asks HEAD once and reports "denied" only if HEAD says so.
    async fn classify_list_error(&self, path: &Path, error: object_store::Error) -> StorageError {
        let url = self.url_of(path);
        if let object_store::Error::Generic { .. } = &error
            && let Err(
                head @ (object_store::Error::PermissionDenied { .. }
                | object_store::Error::Unauthenticated { .. }),
            ) = self.store.head(path).await
        {
            return StorageError::Denied {
                url,
                message: format!("{error} ({head})"),
            };
        }
        StorageError::from_store(url, error)
    }
}

/// Opens the location a URL names. See the crate docs for the schemes.
pub fn open(url: &str, settings: &StorageSettings) -> Result<Location, StorageError> {
    let invalid = |message: &str| StorageError::InvalidUrl {
        url: url.to_owned(),
        message: message.to_owned(),
    };
    let Some((scheme, rest)) = url.split_once("://") else {
        return open_local(url, url);
    };
    match scheme {
        "file" => open_local(url, rest),
        "memory" => {
            let (name, prefix) = split_authority(rest);
            Ok(Location {
                store: memory_store(name),
                root_url: format!("memory://{name}"),
                prefix: parse_prefix(url, prefix)?,
            })
        }
        "s3" => {
            let (bucket, prefix) = split_authority(rest);
            if bucket.is_empty() {
                return Err(invalid("no bucket: expected s3://bucket/prefix"));
            }
            Ok(Location {
                store: s3_store(url, bucket, settings)?,
                root_url: format!("s3://{bucket}"),
                prefix: parse_prefix(url, prefix)?,
            })
        }
        "hdfs" => open_hdfs(url, rest, settings),
        other => Err(invalid(&format!(
            "unsupported scheme `{other}` (use file, memory, s3 or hdfs)"
        ))),
    }
}

fn split_authority(rest: &str) -> (&str, &str) {
    rest.split_once('/').unwrap_or((rest, ""))
}

fn parse_prefix(url: &str, prefix: &str) -> Result<Path, StorageError> {
    Path::parse(prefix.trim_matches('/')).map_err(|e| StorageError::InvalidUrl {
        url: url.to_owned(),
        message: e.to_string(),
    })
}

fn open_local(url: &str, path: &str) -> Result<Location, StorageError> {
    let absolute = std::path::absolute(path).map_err(|e| StorageError::InvalidUrl {
        url: url.to_owned(),
        message: e.to_string(),
    })?;
    // The store is rooted at `/` so a prefix need not exist yet (writers create it).
    let prefix = Path::from_absolute_path(&absolute).map_err(|e| StorageError::InvalidUrl {
        url: url.to_owned(),
        message: e.to_string(),
    })?;
    Ok(Location {
        store: Arc::new(LocalFileSystem::new()),
        root_url: "file://".into(),
        prefix,
    })
}

/// One in-memory store per name, shared by everything in this process.
fn memory_store(name: &str) -> Arc<dyn ObjectStore> {
    static STORES: OnceLock<Mutex<HashMap<String, Arc<InMemory>>>> = OnceLock::new();
    let mut stores = STORES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    stores
        .entry(name.to_owned())
        .or_insert_with(|| Arc::new(InMemory::new()))
        .clone()
}

fn s3_store(
    url: &str,
    bucket: &str,
    settings: &StorageSettings,
) -> Result<Arc<dyn ObjectStore>, StorageError> {
    // The HTTP client's TLS (rustls) needs the process's crypto provider: ring, the one
    // rustls is built with here. Installed once; a provider installed before is kept.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let s3 = &settings.s3;
    let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
    // `false` leaves the choice to AWS_ALLOW_HTTP (the CLI has no settings file).
    if s3.allow_http {
        builder = builder.with_allow_http(true);
    }
    if let Some(endpoint) = &s3.endpoint {
        builder = builder.with_endpoint(endpoint);
    }
    if let Some(region) = &s3.region {
        builder = builder.with_region(region);
    }
    if let Some(key) = &s3.access_key_id {
        builder = builder.with_access_key_id(key);
    }
    if let Some(secret) = &s3.secret_access_key {
        builder = builder.with_secret_access_key(secret.expose());
    }
    let store = builder.build().map_err(|e| StorageError::InvalidUrl {
        url: url.to_owned(),
        message: format!("S3 settings (storage.s3.*): {e}"),
    })?;
    Ok(Arc::new(store))
}

#[cfg(feature = "hdfs")]
fn open_hdfs(url: &str, rest: &str, settings: &StorageSettings) -> Result<Location, StorageError> {
    let (authority, prefix) = split_authority(rest);
    let root_url = format!("hdfs://{authority}");
    let hdfs = &settings.hdfs;
    let invalid = |message: String| StorageError::InvalidUrl {
        url: url.to_owned(),
        message,
    };
    // The client's defaults retry a dead namenode for minutes; these make it fail in seconds.
    let mut config: HashMap<String, String> = hdfs.config.clone().into_iter().collect();
    config.extend([
        (
            "dfs.client.failover.max.attempts".to_owned(),
            hdfs.failover_max_attempts.to_string(),
        ),
        (
            "dfs.client.failover.sleep.base.millis".to_owned(),
            hdfs.failover_sleep_base_ms.to_string(),
        ),
        (
            "dfs.client.failover.sleep.max.millis".to_owned(),
            hdfs.failover_sleep_max_ms.to_string(),
        ),
    ]);
    if hdfs.kerberos_principal.is_some() {
        config.insert(
            "hadoop.security.authentication".to_owned(),
            "kerberos".to_owned(),
        );
    }
    let mut client = hdfs_native::ClientBuilder::new()
        .with_url(root_url.clone())
        .with_config(config);
    match (&hdfs.kerberos_principal, &hdfs.kerberos_keytab) {
        (Some(principal), keytab) => {
            client = client.with_kerberos_principal(principal);
            if let Some(keytab) = keytab {
                client = client.with_kerberos_keytab(readable_keytab(keytab).map_err(invalid)?);
            }
        }
        (None, Some(keytab)) => {
            return Err(invalid(format!(
                "storage.hdfs.kerberos_keytab {} is set without storage.hdfs.kerberos_principal",
                keytab.display()
            )));
        }
        (None, None) => {}
    }
    let client = client.build().map_err(|e| invalid(e.to_string()))?;
    Ok(Location {
        store: Arc::new(hdfs_native_object_store::HdfsObjectStore::new(client)),
        root_url,
        prefix: parse_prefix(url, prefix)?,
    })
}

/// The keytab's path once it is a readable file; else what is wrong, naming the setting.
#[cfg(feature = "hdfs")]
fn readable_keytab(keytab: &std::path::Path) -> Result<String, String> {
    let named = |problem: String| {
        format!(
            "storage.hdfs.kerberos_keytab {}: {problem}",
            keytab.display()
        )
    };
    let file = std::fs::File::open(keytab).map_err(|e| named(e.to_string()))?;
    let meta = file.metadata().map_err(|e| named(e.to_string()))?;
    if !meta.is_file() || meta.len() == 0 {
        return Err(named("not a keytab file".into()));
    }
    keytab
        .to_str()
        .map(str::to_owned)
        .ok_or_else(|| named("the path is not UTF-8".into()))
}

#[cfg(not(feature = "hdfs"))]
fn open_hdfs(url: &str, _: &str, _: &StorageSettings) -> Result<Location, StorageError> {
    Err(StorageError::InvalidUrl {
        url: url.to_owned(),
        message: "this build has no HDFS support (build with the `hdfs` cargo feature)".into(),
    })
}
