//! Where source ops get their file listings: a [`Catalog`], and the cache that fuses the
//! listings of one source (every stream naming the same URI shares one LIST of a window's
//! partition).

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex};

use primus_config::StorageSettings;
use tokio::sync::OnceCell;

use super::PlanError;

/// One listed object, relative to the listed partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileEntry {
    pub name: String,
    pub size: u64,
}

/// Lists the objects under `<uri>/<partition>/` (recursively), sorted by name.
pub trait Catalog: Send + Sync + 'static {
    fn list(
        &self,
        uri: &str,
        partition: &str,
    ) -> impl Future<Output = Result<Vec<FileEntry>, PlanError>> + Send;

    /// Whether anything at all exists under `uri` (a source pointing at a missing prefix
    /// fails its job up front instead of yielding empty windows forever).
    fn exists(&self, uri: &str) -> impl Future<Output = Result<bool, PlanError>> + Send;
}

/// The catalog of real object stores, through primus-storage.
pub struct StoreCatalog {
    settings: StorageSettings,
}

impl StoreCatalog {
    pub fn new(settings: StorageSettings) -> Self {
        Self { settings }
    }

    fn open(&self, uri: &str) -> Result<primus_storage::Location, PlanError> {
        primus_storage::open(uri, &self.settings).map_err(PlanError::Storage)
    }
}

impl Catalog for StoreCatalog {
    async fn list(&self, uri: &str, partition: &str) -> Result<Vec<FileEntry>, PlanError> {
        let location = self.open(uri)?;
        let base = location.path(partition);
        let objects = match location.list(partition).await {
            Ok(objects) => objects,
            Err(primus_storage::StorageError::NotFound { .. }) => Vec::new(),
            Err(e) => return Err(PlanError::Storage(e)),
        };
        Ok(objects
            .into_iter()
            .filter_map(|object| {
                let name = object
                    .location
                    .prefix_match(&base)?
                    .map(|p| p.as_ref().to_owned());
                Some(FileEntry {
                    name: name.collect::<Vec<_>>().join("/"),
                    size: object.size,
                })
            })
            .collect())
    }

    async fn exists(&self, uri: &str) -> Result<bool, PlanError> {
        use futures::StreamExt;
        let location = self.open(uri)?;
        let mut listing = location.store().list(Some(location.prefix()));
        match listing.next().await {
            None => Ok(false),
            Some(Ok(_)) => Ok(true),
            Some(Err(object_store::Error::NotFound { .. })) => Ok(false),
            Some(Err(e)) => Err(PlanError::Storage(primus_storage::StorageError::Store {
                url: uri.to_owned(),
                message: e.to_string(),
            })),
        }
    }
}

type Listing = Arc<Vec<FileEntry>>;
type Slot = Arc<OnceCell<Listing>>;
/// (source URI, partition).
type PartitionKey = (String, String);

/// Slots by partition, and the order they were added in (oldest evicted first).
#[derive(Default)]
struct Slots {
    by_partition: HashMap<PartitionKey, Slot>,
    order: VecDeque<PartitionKey>,
}

/// Partition listings by (source URI, partition), at most `capacity` kept. Concurrent
/// requests for the same partition wait on one LIST.
pub struct ListingCache<C> {
    catalog: Arc<C>,
    capacity: usize,
    slots: Mutex<Slots>,
}

impl<C: Catalog> ListingCache<C> {
    pub fn new(catalog: Arc<C>, capacity: usize) -> Self {
        Self {
            catalog,
            capacity: capacity.max(1),
            slots: Mutex::new(Slots::default()),
        }
    }

    pub fn catalog(&self) -> &Arc<C> {
        &self.catalog
    }

    /// Every object under `<uri>/<partition>/`, sorted by name.
    pub async fn partition(&self, uri: &str, partition: &str) -> Result<Listing, PlanError> {
        let slot = self.slot(uri, partition);
        slot.get_or_try_init(|| async {
            let mut files = self.catalog.list(uri, partition).await?;
            // Object stores list in key order already; checking is linear, sorting is not.
            if !files.is_sorted_by(|a, b| a.name <= b.name) {
                files.sort_unstable_by(|a, b| a.name.cmp(&b.name));
            }
            Ok(Arc::new(files))
        })
        .await
        .cloned()
    }

    fn slot(&self, uri: &str, partition: &str) -> Slot {
        let mut guard = self
            .slots
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let Slots {
            by_partition: slots,
            order,
        } = &mut *guard;
        let key = (uri.to_owned(), partition.to_owned());
        if let Some(slot) = slots.get(&key) {
            return slot.clone();
        }
        while slots.len() >= self.capacity {
            match order.pop_front() {
                Some(oldest) => slots.remove(&oldest),
                None => break,
            };
        }
        let slot = Slot::default();
        slots.insert(key.clone(), slot.clone());
        order.push_back(key);
        slot
    }
}
