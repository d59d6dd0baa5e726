//! UTC budget periods and their keys: `2026-11-22` for a day, `2026-11` for a month.
//!
//! Counter keys carry the period key, so a new period starts from zero by itself; counters outlive
//! their period by a grace day so that a request straddling midnight still settles into the period
//! it reserved in.

use chrono::{DateTime, Datelike, Duration, NaiveDate, TimeZone, Utc};

/// How long a counter outlives the end of its period.
const COUNTER_GRACE: Duration = Duration::days(1);

/// A budget period, always in UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Period {
    Daily,
    Monthly,
}

impl Period {
    /// `daily` or `monthly`.
    pub fn as_str(self) -> &'static str {
        match self {
            Period::Daily => "daily",
            Period::Monthly => "monthly",
        }
    }

    /// Reads `daily` or `monthly` (as identity stores an API key's `budget_period`).
    pub fn parse(text: &str) -> Option<Period> {
        match text.trim().to_ascii_lowercase().as_str() {
            "daily" | "day" => Some(Period::Daily),
            "monthly" | "month" => Some(Period::Monthly),
            _ => None,
        }
    }

    /// The key of the period containing `now`: `2026-11-22` or `2026-11`.
    pub fn key_at(self, now: DateTime<Utc>) -> String {
        match self {
            Period::Daily => day_key(now.date_naive()),
            Period::Monthly => month_key(now.year(), now.month()),
        }
    }

    /// Where the period containing `now` starts (midnight UTC of its first day).
    pub fn start_at(self, now: DateTime<Utc>) -> DateTime<Utc> {
        let date = now.date_naive();
        match self {
            Period::Daily => midnight(date),
            Period::Monthly => date.with_day(1).map_or_else(|| midnight(date), midnight),
        }
    }

    /// Where the period containing `now` ends (exclusive).
    pub fn end_after(self, now: DateTime<Utc>) -> DateTime<Utc> {
        let date = now.date_naive();
        let end_date = match self {
            Period::Daily => date.succ_opt(),
            Period::Monthly => first_of_next_month(date.year(), date.month()),
        };
        end_date.map(midnight).unwrap_or(DateTime::<Utc>::MAX_UTC)
    }
}

/// `2026-11-22`.
pub fn day_key(date: NaiveDate) -> String {
    let mut key = month_key(date.year(), date.month());
    key.push('-');
    push_two_digits(&mut key, date.day());
    key
}

/// `2026-11`. Written digit by digit: a reservation formats a key per scope and period, and
/// `format!` costs about ten times as much (years outside 0-9999 go through it).
fn month_key(year: i32, month: u32) -> String {
    if !(0..=9999).contains(&year) {
        return format!("{year:04}-{month:02}");
    }
    let mut key = String::with_capacity(10);
    let year = year.unsigned_abs();
    push_two_digits(&mut key, year / 100);
    push_two_digits(&mut key, year % 100);
    key.push('-');
    push_two_digits(&mut key, month);
    key
}

/// Appends `value` (below 100) as two digits.
fn push_two_digits(text: &mut String, value: u32) {
    text.push(char::from(b'0' + (value / 10 % 10) as u8));
    text.push(char::from(b'0' + (value % 10) as u8));
}

/// The end (exclusive) of the period a key names: `2026-11-22` ends at the next midnight, `2026-11` at
/// the first of December. None for a malformed key.
pub fn end_of_period_key(period_key: &str) -> Option<DateTime<Utc>> {
    if let Ok(date) = NaiveDate::parse_from_str(period_key, "%Y-%m-%d") {
        return date.succ_opt().map(midnight);
    }
    let (year, month) = period_key.split_once('-')?;
    let (year, month) = (year.parse::<i32>().ok()?, month.parse::<u32>().ok()?);
    if period_key.len() != 7 || !(1..=12).contains(&month) {
        return None;
    }
    first_of_next_month(year, month).map(midnight)
}

/// Seconds a counter of `period_key` should live from `now`: to the period's end plus a grace day, at
/// least a minute (a malformed key lives a grace day).
pub fn counter_ttl_seconds(period_key: &str, now: DateTime<Utc>) -> i64 {
    let expires_at = end_of_period_key(period_key).unwrap_or(now) + COUNTER_GRACE;
    (expires_at - now).num_seconds().max(60)
}

/// Seconds from `now` to the next UTC midnight (when daily caps reset), at least one.
pub fn seconds_until_next_day(now: DateTime<Utc>) -> i64 {
    (Period::Daily.end_after(now) - now).num_seconds().max(1)
}

fn first_of_next_month(year: i32, month: u32) -> Option<NaiveDate> {
    if month == 12 { NaiveDate::from_ymd_opt(year + 1, 1, 1) } else { NaiveDate::from_ymd_opt(year, month + 1, 1) }
}

fn midnight(date: NaiveDate) -> DateTime<Utc> {
    Utc.from_utc_datetime(&date.and_time(chrono::NaiveTime::MIN))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        brainstorm_common::time::parse_timestamp(text).unwrap_or_default()
    }

    #[test]
    fn keys_are_utc_dates_and_months() {
        let now = at("2026-11-22T23:59:59.999Z");
        assert_eq!(Period::Daily.key_at(now), "2026-11-22");
        assert_eq!(Period::Monthly.key_at(now), "2026-11");
        // An instant with an offset is keyed by its UTC date.
        assert_eq!(Period::Daily.key_at(at("2026-11-23T00:30:00+02:00")), "2026-11-22");
        assert_eq!(Period::Daily.end_after(now), at("2026-11-23T00:00:00Z"));
        assert_eq!(Period::Daily.start_at(now), at("2026-11-22T00:00:00Z"));
        assert_eq!(Period::Monthly.start_at(now), at("2026-11-01T00:00:00Z"));
        assert_eq!(Period::Monthly.start_at(at("2026-12-01T00:00:00Z")), at("2026-12-01T00:00:00Z"));
        assert_eq!(Period::Monthly.end_after(at("2026-12-05T10:00:00Z")), at("2027-01-01T00:00:00Z"));
    }

    #[test]
    fn hand_written_keys_match_the_formatter() {
        for (year, month, day) in [(2026, 1, 1), (2026, 12, 31), (1, 2, 3), (999, 10, 9), (9999, 12, 31), (0, 1, 1)] {
            let Some(date) = NaiveDate::from_ymd_opt(year, month, day) else { continue };
            assert_eq!(day_key(date), format!("{year:04}-{month:02}-{day:02}"));
            assert_eq!(month_key(year, month), format!("{year:04}-{month:02}"));
        }
        assert_eq!(month_key(10_000, 1), "10000-01");
        assert_eq!(month_key(-5, 3), "-005-03");
    }

    #[test]
    fn period_keys_parse_back_to_their_end() {
        assert_eq!(end_of_period_key("2026-11-22"), Some(at("2026-11-23T00:00:00Z")));
        assert_eq!(end_of_period_key("2026-12"), Some(at("2027-01-01T00:00:00Z")));
        assert_eq!(end_of_period_key("2026-13"), None);
        assert_eq!(end_of_period_key("2026-00"), None);
        assert_eq!(end_of_period_key("garbage"), None);
        let now = at("2026-11-22T12:00:00Z");
        assert_eq!(counter_ttl_seconds("2026-11-22", now), 12 * 3600 + 86_400);
        assert_eq!(counter_ttl_seconds("garbage", now), 86_400);
        assert_eq!(seconds_until_next_day(now), 12 * 3600);
    }

    #[test]
    fn periods_parse_from_key_budget_text() {
        assert_eq!(Period::parse("monthly"), Some(Period::Monthly));
        assert_eq!(Period::parse(" Daily "), Some(Period::Daily));
        assert_eq!(Period::parse("weekly"), None);
    }
}
