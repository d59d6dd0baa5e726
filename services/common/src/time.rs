//! Timestamps as stored and shown: RFC 3339 UTC with milliseconds, so text order is time order.

use chrono::{DateTime, Datelike, NaiveDate, SecondsFormat, Timelike, Utc};

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

/// Parses an RFC 3339 instant (any offset) into UTC. The stored form (what `format_timestamp`
/// writes, so nearly every timestamp the gateway reads back) is read digit by digit; any other form,
/// and a leap second, goes through chrono's parser (about twice the instructions).
pub fn parse_timestamp(text: &str) -> Option<DateTime<Utc>> {
    stored_form(text).or_else(|| DateTime::parse_from_rfc3339(text).ok().map(|instant| instant.with_timezone(&Utc)))
}

/// An RFC 3339 instant rewritten in the stored form; a text already in that form comes back as it is.
pub fn normalise_timestamp(text: &str) -> Option<String> {
    if stored_form(text).is_some() { Some(text.to_owned()) } else { parse_timestamp(text).map(format_timestamp) }
}

/// The instant a text in the stored form (`2026-01-02T03:04:05.006Z`) names; None for any other
/// form, a date that does not exist, or a leap second (chrono's parser decides those).
fn stored_form(text: &str) -> Option<DateTime<Utc>> {
    const SEPARATORS: [(usize, u8); 7] = [(4, b'-'), (7, b'-'), (10, b'T'), (13, b':'), (16, b':'), (19, b'.'), (23, b'Z')];
    let bytes: &[u8; 24] = text.as_bytes().try_into().ok()?;
    if SEPARATORS.iter().any(|&(at, separator)| bytes[at] != separator) {
        return None;
    }
    let number = |from: usize, to: usize| {
        bytes[from..to].iter().try_fold(0u32, |value, &digit| digit.is_ascii_digit().then(|| value * 10 + u32::from(digit - b'0')))
    };
    let date = NaiveDate::from_ymd_opt(i32::try_from(number(0, 4)?).ok()?, number(5, 7)?, number(8, 10)?)?;
    Some(date.and_hms_milli_opt(number(11, 13)?, number(14, 16)?, number(17, 19)?, number(20, 23)?)?.and_utc())
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
    fn the_stored_form_parses_as_chrono_parses_it() {
        let chrono = |text: &str| DateTime::parse_from_rfc3339(text).ok().map(|instant| instant.with_timezone(&Utc));
        let mut seconds: i64 = -62_135_596_800; // 0001-01-01
        while seconds < 253_402_300_799 {
            for nanos in [0, 1_000_000, 999_000_000, 123_000_000] {
                let text = format_timestamp(DateTime::from_timestamp(seconds, nanos).unwrap_or_default());
                assert!(stored_form(&text).is_some(), "{text}");
                assert_eq!(parse_timestamp(&text), chrono(&text), "{text}");
                assert_eq!(normalise_timestamp(&text).as_deref(), Some(text.as_str()));
            }
            seconds += 7_919_993;
        }
        for text in [
            "2026-02-29T00:00:00.000Z", // no such day: both refuse
            "2024-02-29T23:59:59.999Z",
            "2016-12-31T23:59:60.500Z", // a leap second: chrono's
            "2026-13-01T00:00:00.000Z",
            "2026-01-01T24:00:00.000Z",
            "2026-01-01t00:00:00.000z",
            "2026-01-01T00:00:00.000+00:00",
            "2026-01-01T00:00:00Z",
            "2026-01-01T00:00:00.00AZ",
            "+026-01-01T00:00:00.000Z",
            "2026-01-01T00:00:00.000Z ",
            "yesterday",
            "",
        ] {
            assert_eq!(parse_timestamp(text), chrono(text), "{text}");
            assert_eq!(normalise_timestamp(text), chrono(text).map(format_timestamp), "{text}");
        }
        assert_eq!(normalise_timestamp("2026-01-02T04:04:05.006+01:00").as_deref(), Some("2026-01-02T03:04:05.006Z"));
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
