//! The joiner's clock: the time a message's wait is measured against. A subject read to
//! its end runs on the wall clock; a subject with a backlog runs at the store time of the
//! newest message taken in from it, and one nothing was read from yet stands still. The
//! join's time is the earlier of its two subjects', so a joiner catching up on a backlog
//! (a successor taking over held messages, a Job started after its streams) pairs rows as
//! they were published instead of timing out every row older than the wait.

use super::Side;

/// Where one subject's consumer stands.
#[derive(Default)]
struct SubjectClock {
    /// Store time of the newest message taken in (unix ms).
    newest_ms: Option<i64>,
    /// Whether the consumer has nothing left to deliver.
    read_to_end: bool,
}

impl SubjectClock {
    fn now(&self, wall_ms: i64) -> i64 {
        if self.read_to_end {
            wall_ms
        } else {
            self.newest_ms.unwrap_or(i64::MIN)
        }
    }
}

/// The clock of a join's two subjects.
#[derive(Default)]
pub(super) struct JoinClock {
    features: SubjectClock,
    actions: SubjectClock,
}

impl JoinClock {
    fn subject(&mut self, side: Side) -> &mut SubjectClock {
        match side {
            Side::Features => &mut self.features,
            Side::Actions => &mut self.actions,
        }
    }

    /// A message stored at `stored_ms` was taken in from `side`, with `pending` messages
    /// still undelivered behind it.
    pub(super) fn took(&mut self, side: Side, stored_ms: i64, pending: u64) {
        let subject = self.subject(side);
        subject.newest_ms = Some(subject.newest_ms.map_or(stored_ms, |n| n.max(stored_ms)));
        subject.read_to_end = pending == 0;
    }

    /// A fetch from `side` came back empty: everything before it was taken in. (It also
    /// comes back empty when the consumer holds its most unacked messages; the wall clock
    /// then lets the oldest time out, which frees the consumer.)
    pub(super) fn read_to_end(&mut self, side: Side) {
        self.subject(side).read_to_end = true;
    }

    /// The join's time (unix ms), given the wall clock's.
    pub(super) fn now(&self, wall_ms: i64) -> i64 {
        self.features.now(wall_ms).min(self.actions.now(wall_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WALL: i64 = 1_000_000;

    #[test]
    fn a_join_runs_on_the_wall_clock_once_both_subjects_are_read_to_the_end() {
        let mut clock = JoinClock::default();
        clock.took(Side::Features, 10, 0);
        clock.read_to_end(Side::Actions);
        assert_eq!(clock.now(WALL), WALL);
    }

    #[test]
    fn a_subject_nothing_was_read_from_holds_the_join_still() {
        let mut clock = JoinClock::default();
        clock.took(Side::Features, 10, 0);
        assert_eq!(clock.now(WALL), i64::MIN);
    }

    #[test]
    fn a_backlog_holds_the_join_at_its_newest_store_time() {
        let mut clock = JoinClock::default();
        clock.took(Side::Features, 500, 40);
        clock.took(Side::Features, 300, 39);
        clock.read_to_end(Side::Actions);
        assert_eq!(
            clock.now(WALL),
            500,
            "a redelivered older message moves nothing back"
        );
        clock.took(Side::Actions, 200, 3);
        assert_eq!(clock.now(WALL), 200, "the earlier of the two subjects");
        clock.took(Side::Features, 900, 0);
        clock.took(Side::Actions, 950, 0);
        assert_eq!(clock.now(WALL), WALL);
    }
}
