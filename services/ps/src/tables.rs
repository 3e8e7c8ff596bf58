//! The tables of one PS process: built from its settings (on the host or the GPU), one
//! change-version sequence, the lock that keeps delta exports from seeing a table emptied
//! and not yet refilled, and the pushes the next delta notice names.

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError};

use primus_config::TableSettings;
use primus_embedding::{Table, TableOptions};
use primus_gpu::{CudaKernels, DeviceRows, RowStore};
use primus_spec::job::Device;
use primus_spec::{Validate, time};
use tonic::Status;

/// Pushes a delta notice names at most (the serving-sync cycle links to each).
const MAX_NOTICED_PUSHES: usize = 32;

/// The tables of one PS process, sharing one change-version sequence.
pub(crate) struct Tables {
    tables: HashMap<String, Table>,
    /// `traceparent`s of the pushes since the last delta notice.
    pushes: Mutex<Vec<String>>,
    /// Held exclusively while every row is replaced (a restore, an emptying Open) and
    /// shared by each delta export, so that no export sees a table emptied and not yet
    /// refilled: its watermark would pass the rows the refill writes with their older
    /// versions, and no later delta would carry them to serving. Waited for without
    /// blocking a runtime thread: a restore of many rows takes seconds.
    replacing: tokio::sync::RwLock<()>,
}

impl Tables {
    /// Builds every table; a bad table spec fails start naming `ps.tables[i]...`.
    pub(crate) fn new(settings: &TableSettings) -> anyhow::Result<Self> {
        // Versions start at the start time in microseconds, so a restarted PS (which makes
        // far fewer than a million changes a second) never reuses a version its previous
        // life handed out: serving replicas compare versions across restarts.
        let versions = Arc::new(AtomicU64::new(time::unix_us()));
        let kernels = match settings.device {
            Device::Cpu => None,
            Device::Cuda => Some(Arc::new(CudaKernels::new(settings.cuda_device).map_err(
                |e| anyhow::anyhow!("ps.device is cuda (device {}): {e}", settings.cuda_device),
            )?)),
        };
        if let Some(kernels) = &kernels {
            tracing::info!(
                device = %kernels.device_name().unwrap_or_default(),
                "embedding rows in GPU memory"
            );
        }
        let mut tables = HashMap::new();
        for (i, spec) in settings.tables.iter().enumerate() {
            let path = format!("ps.tables[{i}]");
            let problems = spec.problems(&path);
            if !problems.is_empty() {
                let lines: Vec<String> = problems.iter().map(ToString::to_string).collect();
                anyhow::bail!("invalid table settings:\n  {}", lines.join("\n  "));
            }
            let options = TableOptions {
                shards: settings.shards_per_table,
                seed: settings.seed,
                ..TableOptions::default()
            };
            let table = match &kernels {
                None => Table::with_versions(spec, options, versions.clone()),
                Some(kernels) => {
                    let on_device = |dim, stride| {
                        DeviceRows::new(kernels.clone(), dim, stride)
                            .map(|rows| Box::new(rows) as Box<dyn RowStore>)
                    };
                    Table::with_row_stores(spec, options, versions.clone(), &on_device)
                }
            }
            .map_err(|e| anyhow::anyhow!("{path}: {e}"))?;
            if tables.insert(spec.name.clone(), table).is_some() {
                anyhow::bail!("{path}.name: table {:?} is listed twice", spec.name);
            }
        }
        Ok(Self {
            tables,
            pushes: Mutex::default(),
            replacing: tokio::sync::RwLock::default(),
        })
    }

    /// Held while every row is replaced; delta exports wait for it.
    pub(crate) async fn replacing_rows(&self) -> tokio::sync::RwLockWriteGuard<'_, ()> {
        self.replacing.write().await
    }

    /// [`Tables::replacing_rows`] on a thread that may block (a restore's).
    pub(crate) fn replacing_rows_blocking(&self) -> tokio::sync::RwLockWriteGuard<'_, ()> {
        self.replacing.blocking_write()
    }

    /// Held while a delta is exported; a replacement of every row waits for it.
    pub(crate) async fn exporting(&self) -> tokio::sync::RwLockReadGuard<'_, ()> {
        self.replacing.read().await
    }

    /// Remembers the push being handled (its span's `traceparent`) for the next notice.
    pub(crate) fn record_push(&self) {
        if let Some(traceparent) = primus_telemetry::propagation::current_traceparent() {
            let mut pushes = self.pushes.lock().unwrap_or_else(PoisonError::into_inner);
            if pushes.len() < MAX_NOTICED_PUSHES {
                pushes.push(traceparent);
            }
        }
    }

    /// The pushes since the last call.
    pub(crate) fn take_pushes(&self) -> Vec<String> {
        std::mem::take(&mut *self.pushes.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Tables in name order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, &Table)> {
        let mut all: Vec<(&str, &Table)> =
            self.tables.iter().map(|(n, t)| (n.as_str(), t)).collect();
        all.sort_unstable_by_key(|(name, _)| *name);
        all.into_iter()
    }

    pub(crate) fn get(&self, name: &str) -> Result<&Table, UnknownTable> {
        self.tables.get(name).ok_or_else(|| {
            let mut known: Vec<String> = self.tables.keys().cloned().collect();
            known.sort_unstable();
            UnknownTable {
                name: name.to_owned(),
                known,
            }
        })
    }

    /// The latest change version (the tables share one sequence).
    pub(crate) fn version(&self) -> u64 {
        self.tables.values().map(Table::version).max().unwrap_or(0)
    }

    /// Bytes the tables hold.
    pub(crate) fn bytes(&self) -> u64 {
        self.tables.values().map(|t| t.stats().bytes).sum()
    }

    /// Makes every table refuse new rows, or take them again.
    pub(crate) fn refuse_new_rows(&self, refuse: bool) {
        for table in self.tables.values() {
            table.refuse_new_rows(refuse);
        }
    }

    pub(crate) fn evict_expired(&self) -> usize {
        let now = time::unix_secs();
        self.tables.values().map(|t| t.evict_expired(now)).sum()
    }
}

/// A table this PS does not hold was asked for.
#[derive(Debug, thiserror::Error)]
#[error("table: {name:?} is not held by this PS (tables: {})", known.join(", "))]
pub(crate) struct UnknownTable {
    name: String,
    known: Vec<String>,
}

impl From<UnknownTable> for Status {
    fn from(error: UnknownTable) -> Self {
        Status::invalid_argument(error.to_string())
    }
}
