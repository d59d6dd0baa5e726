//! Timestamps as stored and shown: RFC 3339 UTC with milliseconds, so text order is time order.

use chrono::{DateTime, Datelike, SecondsFormat, Timelike, Utc};

/// Formats an instant the one way Brainstorm stores and shows instants (`2026-01-02T03:04:05.006Z`).
pub fn format_timestamp(instant: DateTime<Utc>) -> String {
    let year = instant.year();
    let nanos = instant.nanosecond();
    // Four-digit years and no leap second: written digit by digit (chrono's formatter costs about
    // seven times as much, and every request formats several); anything else goes through chrono.
    if !(0..=9999).contains(&year) || nanos >= 1_000_000_000 {
        return instant.to_rfc3339_opts(SecondsFormat::Millis, true);
    }
    let mut text = *b"0000-00-00T00:00:00.000Z";
    let mut put = |at: usize, width: usize, mut value: u32| {
        for position in (at..at + width).rev() {
            text[position] = b'0' + (value % 10) as u8;
            value /= 10;
        }
    };
    put(0, 4, year.unsigned_abs());
    put(5, 2, instant.month());
    put(8, 2, instant.day());
    put(11, 2, instant.hour());
    put(14, 2, instant.minute());
    put(17, 2, instant.second());
    put(20, 3, nanos / 1_000_000);
    // Digits and ASCII punctuation only: always valid UTF-8.
    std::str::from_utf8(&text).map(str::to_owned).unwrap_or_default()
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

    #[test]
    fn the_fast_formatter_writes_what_chrono_writes() {
        let mut seconds: i64 = -62_135_596_800; // 0001-01-01
        while seconds < 253_402_300_799 {
            for nanos in [0, 1_000_000, 999_999_999, 123_456_789] {
                let instant = DateTime::from_timestamp(seconds, nanos).unwrap_or_default();
                assert_eq!(format_timestamp(instant), instant.to_rfc3339_opts(SecondsFormat::Millis, true));
            }
            seconds += 7_919_993; // about three months and a prime, so every field varies
        }
        // Every day around two century years (2000 leaps, 2100 does not), and years 0 and -1.
        for day in 10_926..47_541 {
            let instant = DateTime::from_timestamp(day * 86_400 + 86_399, 999_000_000).unwrap_or_default();
            assert_eq!(format_timestamp(instant), instant.to_rfc3339_opts(SecondsFormat::Millis, true));
        }
        for seconds in [-62_167_219_200, -62_162_035_201, -62_198_755_200, -1, 0, 951_782_400] {
            let instant = DateTime::from_timestamp(seconds, 0).unwrap_or_default();
            assert_eq!(format_timestamp(instant), instant.to_rfc3339_opts(SecondsFormat::Millis, true));
        }
        let leap = DateTime::from_timestamp(1_483_228_799, 1_500_000_000).unwrap_or_default();
        assert_eq!(format_timestamp(leap), leap.to_rfc3339_opts(SecondsFormat::Millis, true));
        let far = DateTime::from_timestamp(253_402_300_800, 0).unwrap_or_default();
        assert_eq!(format_timestamp(far), far.to_rfc3339_opts(SecondsFormat::Millis, true));
    }
}
