//! Static bearer tokens: a guarded call carries `authorization: Bearer <token>` (the API
//! server's every call, a serving replica's Predict over gRPC and HTTP).

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, bail};
use tonic::{Request, Status};

/// The tokens that may make a guarded call; cheap to clone into an interceptor.
#[derive(Clone)]
pub struct BearerTokens(Arc<Vec<Vec<u8>>>);

impl BearerTokens {
    /// Reads one token per line from `token_file`, which the setting `key` names.
    pub fn load(token_file: &Path, key: &str) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(token_file)
            .with_context(|| format!("cannot read {} (setting `{key}`)", token_file.display()))?;
        let tokens = parse(&text);
        if tokens.is_empty() {
            bail!("{} (setting `{key}`) holds no token", token_file.display());
        }
        Ok(Self(Arc::new(tokens)))
    }

    /// Lets a gRPC call through if it carries one of the tokens.
    pub fn check(&self, request: Request<()>) -> Result<Request<()>, Status> {
        let header = request
            .metadata()
            .get("authorization")
            .map(|value| value.to_str().unwrap_or(""));
        self.check_header(header)?;
        Ok(request)
    }

    /// Whether an `authorization` header's value (None: no header) holds one of the tokens.
    pub fn check_header(&self, header: Option<&str>) -> Result<(), Status> {
        let header = header
            .ok_or_else(|| Status::unauthenticated("missing `authorization: Bearer <token>`"))?;
        let token = header
            .strip_prefix("Bearer ")
            .ok_or_else(|| Status::unauthenticated("`authorization` must be `Bearer <token>`"))?;
        // Compare against every token without stopping early, so timing says nothing.
        let known = self.0.iter().fold(false, |found, t| {
            found | constant_time_eq(t, token.as_bytes())
        });
        if known {
            Ok(())
        } else {
            Err(Status::unauthenticated("unknown token"))
        }
    }
}

fn parse(text: &str) -> Vec<Vec<u8>> {
    primus_config::tokens_in(text)
        .map(|token| token.as_bytes().to_vec())
        .collect()
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
        BearerTokens(Arc::new(parse(text)))
    }

    #[test]
    fn comments_and_blank_lines_are_not_tokens() {
        assert_eq!(
            parse("# ops\n\n  alpha  \nbeta\n"),
            vec![b"alpha".to_vec(), b"beta".to_vec()]
        );
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
    }
}
