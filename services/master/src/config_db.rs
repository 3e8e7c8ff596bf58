//! The config DB (DLRover-RM §4.3, Alg. 1's `D`): finished Jobs' features and final
//! allocations in Redis, for the warm start of later Jobs. One hash, `<p>:config-db`
//! (`<p>` is `redis.key_prefix`): Job name -> its [`ConfigRecord`] as JSON.

#![expect(
    clippy::disallowed_methods,
    reason = "the config DB: the one place that reads and writes its key"
)]

use primus_resource_model::warm_start::ConfigRecord;
use redis::aio::ConnectionManager;

/// The config DB in one master's Redis.
#[derive(Clone)]
pub(crate) struct ConfigDb {
    redis: ConnectionManager,
    key: String,
}

impl ConfigDb {
    pub(crate) fn new(redis: ConnectionManager, key_prefix: &str) -> Self {
        Self {
            redis,
            key: format!("{key_prefix}:config-db"),
        }
    }

    /// Keeps `record`, replacing an earlier one of the same Job.
    pub(crate) async fn put(&self, record: &ConfigRecord) -> Result<(), String> {
        let json = serde_json::to_string(record).map_err(|e| e.to_string())?;
        redis::cmd("HSET")
            .arg(&self.key)
            .arg(&record.job)
            .arg(json)
            .query_async::<()>(&mut self.redis.clone())
            .await
            .map_err(|e| e.to_string())
    }

    /// Every record, and the names of the Jobs whose record does not parse.
    pub(crate) async fn all(&self) -> Result<(Vec<ConfigRecord>, Vec<String>), String> {
        let entries: Vec<(String, String)> = redis::cmd("HGETALL")
            .arg(&self.key)
            .query_async(&mut self.redis.clone())
            .await
            .map_err(|e| e.to_string())?;
        let mut records = Vec::with_capacity(entries.len());
        let mut unreadable = Vec::new();
        for (job, json) in entries {
            match serde_json::from_str(&json) {
                Ok(record) => records.push(record),
                Err(_) => unreadable.push(job),
            }
        }
        Ok((records, unreadable))
    }
}
