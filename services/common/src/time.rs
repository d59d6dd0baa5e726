//! Timestamps as stored and shown: RFC 3339 UTC with milliseconds, so text order is time order.

use chrono::{DateTime, SecondsFormat, Utc};

/// Formats an instant the one way Brainstorm stores and shows instants.
pub fn format_timestamp(instant: DateTime<Utc>) -> String {
    instant.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// The current instant, formatted.
pub fn now_timestamp() -> String {
    format_timestamp(Utc::now())
}

/// Parses an RFC 3339 instant (any offset) into UTC.
pub fn parse_timestamp(text: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(text).ok().map(|instant| instant.with_timezone(&Utc))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formatted_instants_sort_like_time_and_round_trip() {
        let earlier = parse_timestamp("2026-01-02T03:04:05.006Z");
        let later = parse_timestamp("2026-01-02T03:04:05.100+00:00");
        let (Some(earlier), Some(later)) = (earlier, later) else { unreachable!("valid literals") };
        assert!(format_timestamp(earlier) < format_timestamp(later));
        assert_eq!(parse_timestamp(&format_timestamp(earlier)), Some(earlier));
        assert_eq!(parse_timestamp("yesterday"), None);
    }
}
