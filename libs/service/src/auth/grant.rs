//! What a token lets its holder do, as its line in the token file says:
//! `<token> [read|write|admin] [key=value ...]`. The scope (admin when left out) bounds the
//! calls; the labels, when given, bound the resources: the holder sees and changes only
//! those that carry every one of them.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::hash::BuildHasher;

use tonic::Status;

/// How far a token reaches, each including the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    /// Get, List, Watch: the CLI's `get` and `describe`, the dashboard.
    Read,
    /// Also Apply and Delete: declaring Jobs and Datasets.
    Write,
    /// Also UpdateStatus: what controllers (the master) write.
    Admin,
}

impl Scope {
    fn parse(word: &str) -> Option<Self> {
        match word {
            "read" => Some(Self::Read),
            "write" => Some(Self::Write),
            "admin" => Some(Self::Admin),
            _ => None,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::Admin => "admin",
        }
    }
}

/// What the token of a call grants: its scope, and the labels a resource must carry for
/// the call to see or change it (none: every resource).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The calls it allows.
    pub scope: Scope,
    /// Every one must be among a resource's labels.
    pub labels: BTreeMap<String, String>,
}

impl Grant {
    /// Every call on every resource: a token line with nothing after the token.
    pub fn admin() -> Self {
        Self {
            scope: Scope::Admin,
            labels: BTreeMap::new(),
        }
    }

    /// Whether a resource labelled `labels` is within the token's labels.
    pub fn covers<S: BuildHasher>(&self, labels: &HashMap<String, String, S>) -> bool {
        (self.labels.iter()).all(|(key, value)| labels.get(key) == Some(value))
    }

    /// Whether the token limits the resources it reaches by their labels.
    pub fn is_limited(&self) -> bool {
        !self.labels.is_empty()
    }

    /// Refuses a call that needs `scope` (named `call` in the error) when the token's is
    /// narrower: PERMISSION_DENIED.
    pub fn require(&self, scope: Scope, call: &str) -> Result<(), Status> {
        if self.scope >= scope {
            return Ok(());
        }
        Err(Status::permission_denied(format!(
            "{call} needs a token of scope {} or wider; this one's is {}",
            scope.as_str(),
            self.scope.as_str()
        )))
    }
}

impl fmt::Display for Grant {
    /// `write team=ads`: the scope, then the labels.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.scope.as_str())?;
        for (key, value) in &self.labels {
            write!(f, " {key}={value}")?;
        }
        Ok(())
    }
}

/// The labels as `k=v,k2=v2`, the form error messages and selectors use.
pub fn labels_text(labels: &BTreeMap<String, String>) -> String {
    let pairs: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    pairs.join(",")
}

/// A token file read: each token with its grant, and what is wrong with the lines that
/// were left out. A line in error grants nothing, so a typo never widens a token.
pub(super) struct TokenLines {
    pub(super) tokens: Vec<(Vec<u8>, Grant)>,
    pub(super) problems: Vec<String>,
}

/// Reads a token file's text: one token per line, with its scope and labels after it;
/// blank lines and `#` comments skipped. The problems name lines and words by position,
/// never by their text, which may hold a secret.
pub(super) fn parse(text: &str) -> TokenLines {
    let mut read = TokenLines {
        tokens: Vec::new(),
        problems: Vec::new(),
    };
    let mut first_line_of: HashMap<&str, usize> = HashMap::new();
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        let mut words = line.split_whitespace();
        let Some(token) = words.next().filter(|word| !word.starts_with('#')) else {
            continue;
        };
        if let Some(first) = first_line_of.insert(token, number) {
            read.problems.push(format!(
                "line {number}: the token of line {first} again; each token is listed once"
            ));
            read.tokens.retain(|(known, _)| known != token.as_bytes());
            continue;
        }
        match grant_of(words) {
            Ok(grant) => read.tokens.push((token.as_bytes().to_vec(), grant)),
            Err(problem) => read.problems.push(format!("line {number}: {problem}")),
        }
    }
    read
}

/// The grant the words after a token give.
fn grant_of<'a>(words: impl Iterator<Item = &'a str>) -> Result<Grant, String> {
    let mut scope = None;
    let mut labels = BTreeMap::new();
    for (index, word) in words.enumerate() {
        let position = index + 2;
        if let Some(named) = Scope::parse(word) {
            if scope.replace(named).is_some() {
                return Err(format!("word {position} is a second scope"));
            }
            continue;
        }
        let Some((key, value)) = word.split_once('=') else {
            return Err(format!(
                "word {position} is neither a scope (read, write, admin) nor a label (key=value)"
            ));
        };
        if key.is_empty() || value.is_empty() || value.contains('=') {
            return Err(format!(
                "word {position}: a label is key=value, both non-empty"
            ));
        }
        if labels.insert(key.to_owned(), value.to_owned()).is_some() {
            return Err(format!("word {position} names the label {key:?} again"));
        }
    }
    Ok(Grant {
        scope: scope.unwrap_or(Scope::Admin),
        labels,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grants(text: &str) -> Vec<(String, String)> {
        let read = parse(text);
        assert!(read.problems.is_empty(), "{:?}", read.problems);
        (read.tokens.into_iter())
            .map(|(token, grant)| (String::from_utf8(token).expect("utf-8"), grant.to_string()))
            .collect()
    }

    #[test]
    fn a_bare_token_is_admin_and_words_after_it_narrow_it() {
        let text =
            "# ops\n\n  root  \nviewer read\nads write team=ads env=prod\nweb env=prod read\n";
        let want = [
            ("root", "admin"),
            ("viewer", "read"),
            ("ads", "write env=prod team=ads"),
            ("web", "read env=prod"),
        ];
        let want: Vec<(String, String)> = (want.iter())
            .map(|(t, g)| (t.to_string(), g.to_string()))
            .collect();
        assert_eq!(grants(text), want);
    }

    #[test]
    fn bad_lines_grant_nothing_and_are_named_without_their_text() {
        let text = "good read\nsecret-one rread\nsecret-two read write\nsecret-three team=\n\
                    secret-four a=b a=c\ngood admin\n";
        let read = parse(text);
        assert!(
            read.tokens.is_empty(),
            "a repeated token keeps neither grant"
        );
        let want = [
            "line 2: word 2 is neither a scope (read, write, admin) nor a label (key=value)",
            "line 3: word 3 is a second scope",
            "line 4: word 2: a label is key=value, both non-empty",
            "line 5: word 3 names the label \"a\" again",
            "line 6: the token of line 1 again; each token is listed once",
        ];
        assert_eq!(read.problems, want);
        for problem in &read.problems {
            assert!(!problem.contains("secret") && !problem.contains("rread"));
        }
    }

    #[test]
    fn labels_bound_the_resources_and_scopes_the_calls() {
        let grant = parse("t write team=ads\n").tokens.remove(0).1;
        let labelled = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            (pairs.iter())
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert!(grant.covers(&labelled(&[("team", "ads"), ("env", "prod")])));
        assert!(!grant.covers(&labelled(&[("team", "web")])));
        assert!(!grant.covers(&labelled(&[])));
        assert!(Grant::admin().covers(&labelled(&[])));
        assert!(grant.require(Scope::Write, "Apply").is_ok());
        let refused = grant
            .require(Scope::Admin, "UpdateStatus")
            .expect_err("narrower");
        assert_eq!(refused.code(), tonic::Code::PermissionDenied);
        assert_eq!(
            refused.message(),
            "UpdateStatus needs a token of scope admin or wider; this one's is write"
        );
        assert_eq!(labels_text(&grant.labels), "team=ads");
    }
}
