//! Static bearer tokens: every API call carries `authorization: Bearer <token>`.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, bail};
use tonic::{Request, Status};

/// The tokens that may call the API; cheap to clone into the interceptor.
#[derive(Clone)]
pub(crate) struct Tokens(Arc<Vec<Vec<u8>>>);

impl Tokens {
    /// Reads one token per line from the file named by `auth.token_file`.
    pub(crate) fn load(token_file: Option<&Path>) -> anyhow::Result<Self> {
        let Some(path) = token_file else {
            bail!("no API tokens: set `auth.token_file` to a file with one bearer token per line");
        };
        let text = std::fs::read_to_string(path).with_context(|| {
            format!("cannot read {} (setting `auth.token_file`)", path.display())
        })?;
        let tokens = parse(&text);
        if tokens.is_empty() {
            bail!(
                "{} (setting `auth.token_file`) holds no token",
                path.display()
            );
        }
        Ok(Self(Arc::new(tokens)))
    }

    /// Lets the call through if it carries one of the tokens.
    pub(crate) fn check(&self, request: Request<()>) -> Result<Request<()>, Status> {
        let header = request
            .metadata()
            .get("authorization")
            .ok_or_else(|| Status::unauthenticated("missing `authorization: Bearer <token>`"))?;
        let token = header
            .to_str()
            .ok()
            .and_then(|h| h.strip_prefix("Bearer "))
            .ok_or_else(|| Status::unauthenticated("`authorization` must be `Bearer <token>`"))?;
        // Compare against every token without stopping early, so timing says nothing.
        let known = self.0.iter().fold(false, |found, t| {
            found | constant_time_eq(t, token.as_bytes())
        });
        if known {
            Ok(request)
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

    fn tokens(text: &str) -> Tokens {
        Tokens(Arc::new(parse(text)))
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
    fn a_missing_or_empty_token_file_stops_start() {
        let err = Tokens::load(None).err().expect("no file");
        assert!(err.to_string().contains("auth.token_file"), "{err}");
        let dir = tempfile::tempdir().expect("tempdir");
        let empty = dir.path().join("tokens");
        std::fs::write(&empty, "# none yet\n").expect("write");
        let err = Tokens::load(Some(&empty)).err().expect("empty");
        assert!(err.to_string().contains("holds no token"), "{err}");
    }
}
