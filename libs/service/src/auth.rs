//! Bearer tokens from a token file: a guarded call carries `authorization: Bearer <token>`
//! (the API server's every call, a serving replica's Predict over gRPC and HTTP). Each
//! token's line may narrow what it grants ([`Grant`]: a scope, labels), which the API
//! server enforces. The file is read again at most once a second as calls arrive, so
//! tokens are added, narrowed and revoked by editing it, without a restart.

mod grant;

pub use grant::{Grant, Scope, labels_text};

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tonic::{Request, Status};

/// How often, at most, a call looks at the token file again.
const RELOAD_EVERY: Duration = Duration::from_secs(1);

/// Each token with what it grants.
type Granted = Vec<(Vec<u8>, Grant)>;

/// The tokens that may make a guarded call; cheap to clone into an interceptor.
#[derive(Clone)]
pub struct BearerTokens(Arc<Tokens>);

struct Tokens {
    file: PathBuf,
    /// The setting that names the file, for the log.
    key: String,
    current: RwLock<Arc<Granted>>,
    /// The file's text when last read: a read that finds it unchanged keeps the tokens.
    text: Mutex<String>,
    reload_every: Duration,
    started: Instant,
    /// Milliseconds after `started` of the last look at the file.
    looked_ms: AtomicU64,
}

impl BearerTokens {
    /// Reads one token per line from `token_file`, which the setting `key` names.
    pub fn load(token_file: &Path, key: &str) -> anyhow::Result<Self> {
        Self::load_every(token_file, key, RELOAD_EVERY)
    }

    fn load_every(token_file: &Path, key: &str, reload_every: Duration) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(token_file)
            .with_context(|| format!("cannot read {} (setting `{key}`)", token_file.display()))?;
        let read = grant::parse(&text);
        if !read.problems.is_empty() {
            bail!(
                "{} (setting `{key}`): {}",
                token_file.display(),
                read.problems.join("; ")
            );
        }
        if read.tokens.is_empty() {
            bail!("{} (setting `{key}`) holds no token", token_file.display());
        }
        Ok(Self(Arc::new(Tokens {
            file: token_file.to_owned(),
            key: key.to_owned(),
            current: RwLock::new(Arc::new(read.tokens)),
            text: Mutex::new(text),
            reload_every,
            started: Instant::now(),
            looked_ms: AtomicU64::new(0),
        })))
    }

    /// The tokens now: the file's, read again when the last look is older than the reload
    /// interval (by one caller; the others use the tokens as they were).
    fn current(&self) -> Arc<Granted> {
        let tokens = &self.0;
        let now = tokens.started.elapsed().as_millis() as u64;
        let looked = tokens.looked_ms.load(Ordering::Relaxed);
        let due = now.saturating_sub(looked) >= tokens.reload_every.as_millis() as u64;
        if due
            && (tokens.looked_ms)
                .compare_exchange(looked, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tokens.reload();
        }
        let current = tokens
            .current
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        Arc::clone(&current)
    }

    /// Lets a gRPC call through if it carries one of the tokens, with the token's
    /// [`Grant`] in the request's extensions (see [`grant_of`]).
    pub fn check(&self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let header = request
            .metadata()
            .get("authorization")
            .map(|value| value.to_str().unwrap_or(""));
        let grant = self.check_header(header)?;
        request.extensions_mut().insert(grant);
        Ok(request)
    }

    /// The grant of the token an `authorization` header's value (None: no header) holds,
    /// if it is one of the tokens.
    pub fn check_header(&self, header: Option<&str>) -> Result<Grant, Status> {
        let header = header
            .ok_or_else(|| Status::unauthenticated("missing `authorization: Bearer <token>`"))?;
        let token = header
            .strip_prefix("Bearer ")
            .ok_or_else(|| Status::unauthenticated("`authorization` must be `Bearer <token>`"))?;
        // Compare against every token without stopping early, so timing says nothing.
        let tokens = self.current();
        let found = tokens.iter().fold(None, |found, (known, grant)| {
            let equal = constant_time_eq(known, token.as_bytes());
            found.or(equal.then_some(grant))
        });
        found
            .cloned()
            .ok_or_else(|| Status::unauthenticated("unknown token"))
    }
}

/// The grant [`BearerTokens::check`] put on a call; a call that passed no check gets
/// none (UNAUTHENTICATED), so a service wired without the check refuses everything.
pub fn grant_of<T>(request: &Request<T>) -> Result<Grant, Status> {
    (request.extensions().get::<Grant>().cloned())
        .ok_or_else(|| Status::unauthenticated("the call's token was not checked"))
}

impl Tokens {
    /// Takes the file's tokens if its text changed. An unreadable file keeps the tokens
    /// (a file being replaced); a file without tokens refuses every call until it has one.
    fn reload(&self) {
        let text = match std::fs::read_to_string(&self.file) {
            Ok(text) => text,
            Err(e) => {
                tracing::warn!(file = %self.file.display(), setting = %self.key, error = %e,
                    "cannot read the token file again; its previous tokens stay");
                return;
            }
        };
        let mut last = self.text.lock().unwrap_or_else(PoisonError::into_inner);
        if *last == text {
            return;
        }
        let read = grant::parse(&text);
        if !read.problems.is_empty() {
            tracing::warn!(file = %self.file.display(), setting = %self.key,
                problems = %read.problems.join("; "),
                "lines of the token file are wrong: their tokens are refused");
        }
        match read.tokens.len() {
            0 => tracing::warn!(file = %self.file.display(), setting = %self.key,
                "the token file holds no token: every guarded call is refused until it does"),
            n => tracing::info!(file = %self.file.display(), setting = %self.key, tokens = n,
                "token file read again"),
        }
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(read.tokens);
        *last = text;
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(header: Option<&str>) -> Request<()> {
        let mut request = Request::new(());
        if let Some(value) = header {
            request
                .metadata_mut()
                .insert("authorization", value.parse().expect("ascii"));
        }
        request
    }

    fn tokens(text: &str) -> BearerTokens {
        let file = tempfile::NamedTempFile::new().expect("a token file");
        std::fs::write(file.path(), text).expect("write");
        BearerTokens::load(file.path(), "auth.token_file").expect("tokens")
    }

    fn passes(tokens: &BearerTokens, token: &str) -> bool {
        tokens
            .check_header(Some(&format!("Bearer {token}")))
            .is_ok()
    }

    #[test]
    fn tokens_are_added_and_revoked_by_editing_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("tokens");
        std::fs::write(&file, "alpha\nbeta\n").expect("write");
        let every = Duration::from_millis(50);
        let tokens = BearerTokens::load_every(&file, "auth.token_file", every).expect("tokens");
        let after_a_reload = || std::thread::sleep(every + Duration::from_millis(20));
        assert!(passes(&tokens, "alpha") && passes(&tokens, "beta"));

        std::fs::write(&file, "beta\ngamma\n").expect("rewrite");
        after_a_reload();
        assert!(!passes(&tokens, "alpha"), "a removed token is revoked");
        assert!(
            passes(&tokens, "beta") && passes(&tokens, "gamma"),
            "an added one passes"
        );

        // A file being replaced (gone for a moment) keeps the tokens it held.
        std::fs::remove_file(&file).expect("remove");
        after_a_reload();
        assert!(passes(&tokens, "gamma"));

        std::fs::write(&file, "# every token revoked\n").expect("empty");
        after_a_reload();
        assert!(!passes(&tokens, "beta") && !passes(&tokens, "gamma"));
        let clone = tokens.clone();
        std::fs::write(&file, "delta\n").expect("rewrite");
        after_a_reload();
        assert!(passes(&clone, "delta"), "clones share the tokens");
    }

    #[test]
    fn only_a_listed_bearer_token_passes() {
        let tokens = tokens("alpha\nbeta\n");
        assert!(tokens.check(request(Some("Bearer beta"))).is_ok());
        for header in [
            None,
            Some("Bearer gamma"),
            Some("beta"),
            Some("Bearer alph"),
        ] {
            let status = tokens.check(request(header)).expect_err("refused");
            assert_eq!(status.code(), tonic::Code::Unauthenticated, "{header:?}");
        }
    }

    #[test]
    fn a_missing_or_empty_token_file_stops_start_naming_the_setting() {
        let dir = tempfile::tempdir().expect("tempdir");
        let absent = dir.path().join("absent");
        let err = BearerTokens::load(&absent, "auth.token_file")
            .err()
            .expect("no file");
        assert!(err.to_string().contains("auth.token_file"), "{err}");
        let empty = dir.path().join("tokens");
        std::fs::write(&empty, "# none yet\n").expect("write");
        let err = BearerTokens::load(&empty, "serving.token_file")
            .err()
            .expect("empty");
        assert!(err.to_string().contains("holds no token"), "{err}");
        assert!(err.to_string().contains("serving.token_file"), "{err}");
        std::fs::write(&empty, "fine read\nsecret-token reed\n").expect("write");
        let err = BearerTokens::load(&empty, "auth.token_file")
            .err()
            .expect("a wrong line");
        let message = err.to_string();
        assert!(message.contains("auth.token_file") && message.contains("line 2: word 2"));
        assert!(!message.contains("secret-token"), "{message}");
    }

    #[test]
    fn a_checked_call_carries_its_token_s_grant() {
        let tokens = tokens("root\nviewer read team=ads\n");
        let checked = tokens.check(request(Some("Bearer viewer"))).expect("known");
        let grant = grant_of(&checked).expect("a grant");
        assert_eq!(grant.to_string(), "read team=ads");
        let root = tokens.check(request(Some("Bearer root"))).expect("known");
        assert_eq!(grant_of(&root).expect("a grant"), Grant::admin());
        let unchecked = grant_of(&request(Some("Bearer root"))).expect_err("unchecked");
        assert_eq!(unchecked.code(), tonic::Code::Unauthenticated);
    }
}
