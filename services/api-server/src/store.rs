//! Resources in Redis: one record per resource, a global version counter and a change log,
//! all changed together by Lua scripts so a version, its record and its log entry never
//! disagree — even with several API servers on one Redis.
//!
//! Keys (`<p>` is `redis.key_prefix`):
//! - `<p>:version`: the global counter; every change takes the next value.
//! - `<p>:res:<Kind>:<name>`: `<version>|<Resource protobuf without version>`.
//! - `<p>:index:<Kind>`: set of names of that kind.
//! - `<p>:refs:<Kind>:<name>`: set of `<Kind>/<name>` of resources that reference this one.
//! - `<p>:events`: sorted set, score = version, member = `<version>|<type>|<protobuf>` (the
//!   new state; for an APPENDED Metric, only its new points).
//!   Every version has exactly one entry until retention trims it, so a reader can tell a
//!   gap (trimmed history) from "nothing happened".

#![expect(
    clippy::disallowed_methods,
    reason = "the resource store: the one place that reads and writes the API server's Redis keys"
)]

use std::sync::Arc;

use primus_proto::v1::{EventType, Resource, ResourceEvent};
use primus_spec::Kind;
use prost::Message;
use redis::Script;
use redis::aio::ConnectionManager;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{kind} {name:?} is at version {actual}, not {expected}")]
    Conflict {
        kind: Kind,
        name: String,
        expected: u64,
        actual: u64,
    },
    #[error("{kind} {name:?} references {target_kind} {target:?}, which does not exist")]
    DanglingReference {
        kind: Kind,
        name: String,
        target_kind: Kind,
        target: String,
    },
    #[error("{kind} {name:?} is still referenced by {}", .referrers.join(", "))]
    Referenced {
        kind: Kind,
        name: String,
        referrers: Vec<String>,
    },
    #[error(
        "version {since} is no longer in the change log (oldest kept: {oldest}); list again and watch from the list's version"
    )]
    Gone { since: u64, oldest: u64 },
    #[error("version {since} is ahead of the store (latest: {latest}); list again")]
    Ahead { since: u64, latest: u64 },
    #[error("Redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("corrupt record in Redis at {key}: {message}")]
    Corrupt { key: String, message: String },
}

/// What a resource points at: it must exist when the resource is written, and it cannot
/// be deleted while referenced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    pub kind: Kind,
    pub name: String,
}

/// One change to write.
pub struct Change<'a> {
    pub kind: Kind,
    pub name: &'a str,
    /// The version the record must have now (0: it must not exist).
    pub expected: u64,
    /// The new state; its `resource_version` is set by the store.
    pub resource: &'a Resource,
    pub event: EventType,
    /// What the change log carries when not the new state itself (a Metric's appended
    /// points).
    pub logged: Option<&'a Resource>,
    /// What the new state references, and what the old state referenced.
    pub reference: Option<&'a Reference>,
    pub previous_reference: Option<&'a Reference>,
}

/// Changes after a version, in order, and the latest version when they were read.
pub struct EventPage {
    pub latest: u64,
    pub events: Vec<ResourceEvent>,
}

#[derive(Clone)]
pub struct Store {
    redis: ConnectionManager,
    prefix: String,
    retention: u64,
    scripts: Arc<Scripts>,
}

/// Each script is hashed once; Redis runs it by hash (EVALSHA) after the first call.
struct Scripts {
    list: Script,
    write: Script,
    delete: Script,
    events_after: Script,
}

impl Store {
    pub fn new(redis: ConnectionManager, key_prefix: &str, retention: u64) -> Self {
        Self {
            redis,
            prefix: key_prefix.to_owned(),
            retention: retention.max(1),
            scripts: Arc::new(Scripts {
                list: Script::new(LIST),
                write: Script::new(WRITE),
                delete: Script::new(DELETE),
                events_after: Script::new(EVENTS_AFTER),
            }),
        }
    }

    pub async fn get(&self, kind: Kind, name: &str) -> Result<Option<Resource>, StoreError> {
        let key = self.resource_key(kind, name);
        let record: Option<Vec<u8>> = redis::cmd("GET")
            .arg(&key)
            .query_async(&mut self.redis.clone())
            .await?;
        record.map(|r| decode_record(&key, &r)).transpose()
    }

    /// Every resource of `kind` and the version the list is consistent with (one atomic read,
    /// so a Watch from that version misses nothing and repeats nothing).
    pub async fn list(&self, kind: Kind) -> Result<(Vec<Resource>, u64), StoreError> {
        let reply: Vec<Vec<u8>> = self
            .scripts
            .list
            .key(self.index_key(kind))
            .key(self.version_key())
            .arg(self.resource_key(kind, ""))
            .invoke_async(&mut self.redis.clone())
            .await?;
        let mut parts = reply.into_iter();
        let latest = parse_version(&self.version_key(), &parts.next().unwrap_or_default())?;
        let key = self.index_key(kind);
        let resources = parts
            .map(|record| decode_record(&key, &record))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((resources, latest))
    }

    /// Writes `change` if the record is still at `change.expected`; returns the new version.
    pub async fn write(&self, change: Change<'_>) -> Result<u64, StoreError> {
        let encode = |resource: &Resource| {
            let mut body = resource.clone();
            body.resource_version = 0;
            body.encode_to_vec()
        };
        let body = encode(change.resource);
        let logged = change.logged.map_or_else(|| body.clone(), encode);
        let mut script = self.scripts.write.prepare_invoke();
        script
            .key(self.resource_key(change.kind, change.name))
            .key(self.version_key())
            .key(self.events_key())
            .key(self.index_key(change.kind))
            .arg(change.expected)
            .arg(body)
            .arg(change.event as i32)
            .arg(self.retention)
            .arg(change.name)
            .arg(format!("{}/{}", change.kind, change.name))
            .arg(logged);
        if let Some(target) = change.reference {
            script
                .key(self.resource_key(target.kind, &target.name))
                .key(self.refs_key(target));
        }
        if let Some(previous) = change.previous_reference {
            script.key(self.refs_key(previous));
        }
        let reply: Vec<Vec<u8>> = script.invoke_async(&mut self.redis.clone()).await?;
        match reply_code(&reply) {
            b"ok" => self.reply_version(&reply),
            b"conflict" => Err(StoreError::Conflict {
                kind: change.kind,
                name: change.name.to_owned(),
                expected: change.expected,
                actual: self.reply_version(&reply)?,
            }),
            b"dangling" => {
                let target = change.reference.cloned().ok_or_else(|| self.bad_reply())?;
                Err(StoreError::DanglingReference {
                    kind: change.kind,
                    name: change.name.to_owned(),
                    target_kind: target.kind,
                    target: target.name,
                })
            }
            _ => Err(self.bad_reply()),
        }
    }

    /// Deletes the record if it is at `expected` and nothing references it; returns the
    /// deletion's version. `last` (the state being deleted) goes into the change log.
    pub async fn delete(
        &self,
        last: &Resource,
        kind: Kind,
        expected: u64,
        reference: Option<&Reference>,
    ) -> Result<u64, StoreError> {
        let mut body = last.clone();
        body.resource_version = 0;
        let own = Reference {
            kind,
            name: last.name.clone(),
        };
        let mut script = self.scripts.delete.prepare_invoke();
        script
            .key(self.resource_key(kind, &last.name))
            .key(self.version_key())
            .key(self.events_key())
            .key(self.index_key(kind))
            .key(self.refs_key(&own))
            .arg(expected)
            .arg(body.encode_to_vec())
            .arg(EventType::Deleted as i32)
            .arg(self.retention)
            .arg(&last.name)
            .arg(format!("{kind}/{}", last.name));
        if let Some(target) = reference {
            script.key(self.refs_key(target));
        }
        let reply: Vec<Vec<u8>> = script.invoke_async(&mut self.redis.clone()).await?;
        match reply_code(&reply) {
            b"ok" => self.reply_version(&reply),
            b"conflict" => Err(StoreError::Conflict {
                kind,
                name: last.name.clone(),
                expected,
                actual: self.reply_version(&reply)?,
            }),
            b"referenced" => Err(StoreError::Referenced {
                kind,
                name: last.name.clone(),
                referrers: reply[1..]
                    .iter()
                    .map(|r| String::from_utf8_lossy(r).into_owned())
                    .collect(),
            }),
            _ => Err(self.bad_reply()),
        }
    }

    /// Up to `limit` changes after `since`, oldest first. Fails with `Gone` when retention
    /// already trimmed a change the caller has not seen, and `Ahead` when `since` is newer
    /// than anything this store wrote (a Redis that was wiped).
    pub async fn events_after(&self, since: u64, limit: usize) -> Result<EventPage, StoreError> {
        let reply: Vec<Vec<u8>> = self
            .scripts
            .events_after
            .key(self.events_key())
            .key(self.version_key())
            .arg(since)
            .arg(limit)
            .invoke_async(&mut self.redis.clone())
            .await?;
        let mut parts = reply.into_iter();
        let latest = parse_version(&self.version_key(), &parts.next().unwrap_or_default())?;
        let oldest = parse_version(&self.events_key(), &parts.next().unwrap_or_default())?;
        if since > latest {
            return Err(StoreError::Ahead { since, latest });
        }
        let events = parts
            .map(|entry| decode_event(&self.events_key(), &entry))
            .collect::<Result<Vec<_>, _>>()?;
        let first = events.first().map(version_of);
        let missed = match first {
            Some(first) => first != since + 1,
            None => latest > since,
        };
        if missed {
            return Err(StoreError::Gone { since, oldest });
        }
        Ok(EventPage { latest, events })
    }

    pub async fn latest_version(&self) -> Result<u64, StoreError> {
        let version: Option<u64> = redis::cmd("GET")
            .arg(self.version_key())
            .query_async(&mut self.redis.clone())
            .await?;
        Ok(version.unwrap_or(0))
    }

    fn reply_version(&self, reply: &[Vec<u8>]) -> Result<u64, StoreError> {
        let field = reply.get(1).ok_or_else(|| self.bad_reply())?;
        parse_version(&self.version_key(), field)
    }

    fn bad_reply(&self) -> StoreError {
        StoreError::Corrupt {
            key: self.prefix.clone(),
            message: "unexpected reply from a store script".into(),
        }
    }

    fn version_key(&self) -> String {
        format!("{}:version", self.prefix)
    }

    fn events_key(&self) -> String {
        format!("{}:events", self.prefix)
    }

    fn index_key(&self, kind: Kind) -> String {
        format!("{}:index:{kind}", self.prefix)
    }

    fn resource_key(&self, kind: Kind, name: &str) -> String {
        format!("{}:res:{kind}:{name}", self.prefix)
    }

    fn refs_key(&self, target: &Reference) -> String {
        format!("{}:refs:{}:{}", self.prefix, target.kind, target.name)
    }
}

fn reply_code(reply: &[Vec<u8>]) -> &[u8] {
    reply.first().map(Vec::as_slice).unwrap_or_default()
}

fn version_of(event: &ResourceEvent) -> u64 {
    event.resource.as_ref().map_or(0, |r| r.resource_version)
}

fn parse_version(key: &str, text: &[u8]) -> Result<u64, StoreError> {
    std::str::from_utf8(text)
        .ok()
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| StoreError::Corrupt {
            key: key.to_owned(),
            message: format!("{:?} is not a version", String::from_utf8_lossy(text)),
        })
}

/// Splits `<field>|<rest>`.
fn split_field<'a>(key: &str, bytes: &'a [u8]) -> Result<(&'a [u8], &'a [u8]), StoreError> {
    let bar = bytes
        .iter()
        .position(|b| *b == b'|')
        .ok_or_else(|| StoreError::Corrupt {
            key: key.to_owned(),
            message: "missing `|` separator".into(),
        })?;
    Ok((&bytes[..bar], &bytes[bar + 1..]))
}

fn decode_body(key: &str, version: u64, body: &[u8]) -> Result<Resource, StoreError> {
    let mut resource = Resource::decode(body).map_err(|e| StoreError::Corrupt {
        key: key.to_owned(),
        message: e.to_string(),
    })?;
    resource.resource_version = version;
    Ok(resource)
}

fn decode_record(key: &str, record: &[u8]) -> Result<Resource, StoreError> {
    let (version, body) = split_field(key, record)?;
    decode_body(key, parse_version(key, version)?, body)
}

fn decode_event(key: &str, entry: &[u8]) -> Result<ResourceEvent, StoreError> {
    let (version, rest) = split_field(key, entry)?;
    let (event_type, body) = split_field(key, rest)?;
    let event_type = std::str::from_utf8(event_type)
        .ok()
        .and_then(|t| t.parse::<i32>().ok())
        .and_then(|t| EventType::try_from(t).ok())
        .ok_or_else(|| StoreError::Corrupt {
            key: key.to_owned(),
            message: "bad event type".into(),
        })?;
    Ok(ResourceEvent {
        r#type: event_type as i32,
        resource: Some(decode_body(key, parse_version(key, version)?, body)?),
    })
}

/// KEYS: index, version counter. ARGV: resource key prefix (`<p>:res:<Kind>:`).
/// Returns the latest version, then every record of the kind.
const LIST: &str = r#"
local reply = {redis.call('GET', KEYS[2]) or '0'}
local names = redis.call('SMEMBERS', KEYS[1])
for _, name in ipairs(names) do
  local record = redis.call('GET', ARGV[1] .. name)
  if record then table.insert(reply, record) end
end
return reply
"#;

/// Appends one change to the log and trims it to the retention (shared by WRITE and DELETE).
macro_rules! append_event_lua {
    () => {
        r#"
local function append_event(events_key, version, event_type, body, retention)
  local v = string.format('%d', version)
  redis.call('ZADD', events_key, version, v .. '|' .. event_type .. '|' .. body)
  if version > retention then
    redis.call('ZREMRANGEBYSCORE', events_key, '-inf', string.format('%d', version - retention))
  end
  return v
end
local function current_version(record)
  if not record then return 0 end
  return tonumber(string.match(record, '^(%d+)|'))
end
"#
    };
}

/// KEYS: resource, version counter, events, index, [referenced resource, its refs set],
/// [previous reference's refs set]. ARGV: expected version, body, event type, retention,
/// name, referrer id (`<Kind>/<name>`), the change log's body.
const WRITE: &str = concat!(
    append_event_lua!(),
    r#"
local current = current_version(redis.call('GET', KEYS[1]))
if current ~= tonumber(ARGV[1]) then return {'conflict', string.format('%d', current)} end
if #KEYS >= 6 and redis.call('EXISTS', KEYS[5]) == 0 then return {'dangling', '0'} end
local version = redis.call('INCR', KEYS[2])
local v = append_event(KEYS[3], version, ARGV[3], ARGV[7], tonumber(ARGV[4]))
redis.call('SET', KEYS[1], v .. '|' .. ARGV[2])
redis.call('SADD', KEYS[4], ARGV[5])
if #KEYS == 7 or #KEYS == 5 then redis.call('SREM', KEYS[#KEYS], ARGV[6]) end
if #KEYS >= 6 then redis.call('SADD', KEYS[6], ARGV[6]) end
return {'ok', v}
"#
);

/// KEYS: resource, version counter, events, index, this resource's refs set, [the refs set
/// of what it references]. ARGV: expected version, last body, event type, retention, name,
/// referrer id.
const DELETE: &str = concat!(
    append_event_lua!(),
    r#"
local current = current_version(redis.call('GET', KEYS[1]))
if current == 0 or current ~= tonumber(ARGV[1]) then
  return {'conflict', string.format('%d', current)}
end
local referrers = redis.call('SMEMBERS', KEYS[5])
if #referrers > 0 then
  table.insert(referrers, 1, 'referenced')
  return referrers
end
local version = redis.call('INCR', KEYS[2])
local v = append_event(KEYS[3], version, ARGV[3], ARGV[2], tonumber(ARGV[4]))
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[4], ARGV[5])
if #KEYS == 6 then redis.call('SREM', KEYS[6], ARGV[6]) end
return {'ok', v}
"#
);

/// KEYS: events, version counter. ARGV: since, limit. Returns the latest version, the
/// oldest version still logged (0 if none), then up to `limit` entries after `since`.
const EVENTS_AFTER: &str = r#"
local reply = {redis.call('GET', KEYS[2]) or '0'}
local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if oldest[2] then table.insert(reply, oldest[2]) else table.insert(reply, '0') end
local entries = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. ARGV[1], '+inf', 'LIMIT', 0, tonumber(ARGV[2]))
for _, entry in ipairs(entries) do table.insert(reply, entry) end
return reply
"#;
