//! Subject names: the only place a subject is formatted. The prefix (default `primus`) comes from
//! `nats.subject_prefix`, so several clusters can share one NATS server.
//!
//! | subject | carries |
//! | --- | --- |
//! | `<p>.events.<kind>.<name>` | resource changes from the api-server |
//! | `<p>.job.<job>.heartbeat.<role>.<id>` | executor heartbeats |
//! | `<p>.job.<job>.metrics.<role>.<id>` | executor metrics |
//! | `<p>.job.<job>.delta.<shard>` | "new delta available" notices from training PS shards |
//! | `<p>.job.<job>.hot` | hot-row plans, rounds and probes between the job's trainers |

use crate::BusError;

/// Builds subject names under one prefix. Every token is checked: a name holding `.`,
/// whitespace, `*` or `>` would silently change what a subject matches.
#[derive(Debug, Clone)]
pub struct Subjects {
    prefix: String,
}

/// A wildcard matching exactly one token.
pub const ANY: &str = "*";

impl Subjects {
    /// Subjects under `prefix` (`nats.subject_prefix`).
    pub fn new(prefix: &str) -> Result<Self, BusError> {
        prefix.split('.').try_for_each(check)?;
        Ok(Self {
            prefix: prefix.to_owned(),
        })
    }

    /// The first token of every subject.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `<p>.events.<kind>.<name>`; `name` may be [`ANY`].
    pub fn event(&self, kind: &str, name: &str) -> Result<String, BusError> {
        self.build(&["events", kind, name])
    }

    /// `<p>.events.>`: every resource change.
    pub fn all_events(&self) -> String {
        format!("{}.events.>", self.prefix)
    }

    /// `<p>.job.<job>.heartbeat.<role>.<id>`; `role` and `id` may be [`ANY`].
    pub fn heartbeat(&self, job: &str, role: &str, id: &str) -> Result<String, BusError> {
        self.build(&["job", job, "heartbeat", role, id])
    }

    /// `<p>.job.<job>.metrics.<role>.<id>`; `role` and `id` may be [`ANY`].
    pub fn metrics(&self, job: &str, role: &str, id: &str) -> Result<String, BusError> {
        self.build(&["job", job, "metrics", role, id])
    }

    /// `<p>.job.<job>.delta.<shard>`; `shard` may be [`ANY`].
    pub fn delta(&self, job: &str, shard: &str) -> Result<String, BusError> {
        self.build(&["job", job, "delta", shard])
    }

    /// `<p>.job.<job>.hot`.
    pub fn hot(&self, job: &str) -> Result<String, BusError> {
        self.build(&["job", job, "hot"])
    }

    fn build(&self, tokens: &[&str]) -> Result<String, BusError> {
        let mut subject = self.prefix.clone();
        for token in tokens {
            if *token != ANY {
                check(token)?;
            }
            subject.push('.');
            subject.push_str(token);
        }
        Ok(subject)
    }
}

fn check(token: &str) -> Result<(), BusError> {
    let bad = token.is_empty()
        || token
            .chars()
            .any(|c| c == '.' || c == '*' || c == '>' || c.is_whitespace() || c.is_control());
    if bad {
        return Err(BusError::InvalidToken(token.to_owned()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_follow_the_design() {
        let s = Subjects::new("primus").expect("prefix");
        assert_eq!(s.event("job", "ctr").expect("ok"), "primus.events.job.ctr");
        assert_eq!(s.all_events(), "primus.events.>");
        assert_eq!(
            s.heartbeat("ctr", "trainer", "0").expect("ok"),
            "primus.job.ctr.heartbeat.trainer.0"
        );
        assert_eq!(
            s.metrics("ctr", ANY, ANY).expect("ok"),
            "primus.job.ctr.metrics.*.*"
        );
        assert_eq!(s.delta("ctr", "3").expect("ok"), "primus.job.ctr.delta.3");
        let nested = Subjects::new("team.a").expect("dotted prefix");
        assert_eq!(nested.hot("j").expect("ok"), "team.a.job.j.hot");
    }

    #[test]
    fn tokens_that_change_matching_are_refused() {
        let s = Subjects::new("primus").expect("prefix");
        for bad in ["a.b", "a b", "*x", ">", "", "tab\t"] {
            let err = s.hot(bad).expect_err(bad);
            assert!(err.to_string().contains("subject token"), "{err}");
        }
        assert!(Subjects::new("pri mus").is_err());
        assert!(Subjects::new("").is_err());
    }
}
