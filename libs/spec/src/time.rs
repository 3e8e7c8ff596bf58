//! The wall clock, UTC window arithmetic and the partition layout of Parquet sources
//! (`date=YYYY-MM-DD/hour=HH`), computed without a calendar dependency (days-from-civil and
//! its inverse, proleptic Gregorian).

use crate::dataset::WindowUnit;

/// Seconds in an hour.
pub const HOUR: i64 = 3600;
/// Seconds in a day.
pub const DAY: i64 = 24 * HOUR;

/// The wall clock since the Unix epoch (zero for a clock set before 1970).
fn since_epoch() -> std::time::Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}

/// The wall clock as Unix milliseconds.
pub fn unix_ms() -> i64 {
    i64::try_from(since_epoch().as_millis()).unwrap_or(i64::MAX)
}

/// The wall clock as Unix microseconds.
pub fn unix_us() -> u64 {
    u64::try_from(since_epoch().as_micros()).unwrap_or(u64::MAX)
}

/// The wall clock as Unix seconds, as the embedding tables keep time (a `u32`, enough
/// until 2106).
pub fn unix_secs() -> u32 {
    u32::try_from(since_epoch().as_secs()).unwrap_or(u32::MAX)
}

/// Seconds in one window of `unit`.
pub fn window_seconds(unit: WindowUnit) -> i64 {
    match unit {
        WindowUnit::Hourly => HOUR,
        WindowUnit::Daily => DAY,
    }
}

/// Unix seconds of a validated `YYYY-MM-DD` or `YYYY-MM-DDTHH` window time.
pub fn parse_window_time(text: &str) -> Option<i64> {
    let (date, hour) = match text.split_once('T') {
        Some((date, hour)) => (
            date,
            hour.parse::<i64>().ok().filter(|h| (0..24).contains(h))?,
        ),
        None => (text, 0),
    };
    let mut parts = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (year, month, day) = (parts.next()??, parts.next()??, parts.next()??);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    Some(days_from_civil(year, month, day) * DAY + hour * HOUR)
}

/// `YYYY-MM-DD` of the day holding `unix_s`.
pub fn date_of(unix_s: i64) -> String {
    let (y, m, d) = civil_from_days(unix_s.div_euclid(DAY));
    format!("{y:04}-{m:02}-{d:02}")
}

/// `YYYY-MM-DDTHH` of the hour holding `unix_s` (what [`parse_window_time`] reads).
pub fn window_time(unix_s: i64) -> String {
    format!("{}T{:02}", date_of(unix_s), unix_s.rem_euclid(DAY) / HOUR)
}

/// The partition directory of the window starting at `start`, relative to a source URI:
/// `date=YYYY-MM-DD/hour=HH` (hourly) or `date=YYYY-MM-DD` (daily).
pub fn partition(unit: WindowUnit, start: i64) -> String {
    match unit {
        WindowUnit::Daily => format!("date={}", date_of(start)),
        WindowUnit::Hourly => format!(
            "date={}/hour={:02}",
            date_of(start),
            start.rem_euclid(DAY) / HOUR
        ),
    }
}

fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clocks_read_one_wall_clock_in_their_units() {
        let (ms, us, secs) = (unix_ms(), unix_us(), unix_secs());
        // After 2026, before 2106, and each within a second of the others.
        assert!(ms > 1_790_000_000_000, "{ms}");
        assert!((us / 1_000).abs_diff(ms as u64) < 1_000, "{us} vs {ms}");
        assert!(
            u64::from(secs).abs_diff(ms as u64 / 1_000) <= 1,
            "{secs} vs {ms}"
        );
    }

    #[test]
    fn window_times_round_trip_through_partitions() {
        assert_eq!(parse_window_time("1970-01-01"), Some(0));
        assert_eq!(parse_window_time("1970-01-02T01"), Some(DAY + HOUR));
        let t = parse_window_time("2024-02-29T23").expect("leap day");
        assert_eq!(partition(WindowUnit::Hourly, t), "date=2024-02-29/hour=23");
        assert_eq!(
            partition(WindowUnit::Hourly, t + HOUR),
            "date=2024-03-01/hour=00"
        );
        assert_eq!(partition(WindowUnit::Daily, t), "date=2024-02-29");
        for days in (-800_000..800_000).step_by(997) {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
        assert_eq!(parse_window_time("2024-13-01"), None);
        assert_eq!(parse_window_time("2024-01-01T24"), None);
    }
}
