//! A secret setting (a storage key): written in full where a process needs it (the
//! settings file the master writes for an executor), shown as [`REDACTED`] by `Debug` and
//! by `--print-settings`, so logs and settings dumps never carry it.

use std::cell::Cell;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize, Serializer};

/// What a secret reads as where it is not needed.
pub const REDACTED: &str = "<redacted>";

thread_local! {
    /// Set while [`redacting`] runs on this thread.
    static REDACTING: Cell<bool> = const { Cell::new(false) };
}

/// A setting's secret value.
#[derive(Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// The value itself, for the one call that needs it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Self(value.to_owned())
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Self(value)
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(REDACTED)
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match REDACTING.get() {
            true => serializer.serialize_str(REDACTED),
            false => serializer.serialize_str(&self.0),
        }
    }
}

/// `serialize_with` for a URL that may carry credentials (`nats.url`, `redis.url`): in
/// full, or without them while [`redacting`].
pub(crate) fn url_with_credentials<S: Serializer>(
    url: &str,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match REDACTING.get() {
        true => serializer.serialize_str(&crate::redact_url(url)),
        false => serializer.serialize_str(url),
    }
}

/// Runs `f` with every [`Secret`] it serializes on this thread written as [`REDACTED`],
/// and URLs' credentials left out.
pub fn redacting<T>(f: impl FnOnce() -> T) -> T {
    /// Ends the redaction however `f` ends.
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            REDACTING.set(self.0);
        }
    }
    let _restore = Restore(REDACTING.replace(true));
    f()
}
