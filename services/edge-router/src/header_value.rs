//! Header values for the answer's thirty-odd headers, made without an intermediate `String` where
//! the text is static or formatted: each `HeaderValue::from_str(&x.to_string())` was two
//! allocations and a copy, on every request.

use std::fmt::{self, Write};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::HeaderValue;

/// The longest formatted value: numbers, dollars, ids and short notes fit; longer text is refused
/// like an invalid value (the header is left out).
const CAPACITY: usize = 128;

/// A static text as a header value, without copying it; None when it is not a valid header value.
pub(crate) fn fixed(text: &'static str) -> Option<HeaderValue> {
    HeaderValue::from_maybe_shared(Bytes::from_static(text.as_bytes())).ok()
}

/// A header value written by `arguments` into a stack buffer and copied once; None when it is
/// longer than the buffer or not a valid header value.
pub(crate) fn formatted(arguments: fmt::Arguments<'_>) -> Option<HeaderValue> {
    let mut buffer = Buffer { bytes: [0; CAPACITY], len: 0 };
    buffer.write_fmt(arguments).ok()?;
    HeaderValue::from_bytes(&buffer.bytes[..buffer.len]).ok()
}

/// A value's `Display` text as a header value (`formatted` with `{}`).
pub(crate) fn shown(value: impl fmt::Display) -> Option<HeaderValue> {
    formatted(format_args!("{value}"))
}

/// A duration in milliseconds with three decimals (`12.345`), rounded to the microsecond.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Millis(pub Duration);

impl fmt::Display for Millis {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let micros = u64::try_from(self.0.as_nanos().saturating_add(500) / 1_000).unwrap_or(u64::MAX);
        brainstorm_common::money::write_fixed(formatter, false, micros / 1_000, micros % 1_000, 3)
    }
}

struct Buffer {
    bytes: [u8; CAPACITY],
    len: usize,
}

impl Write for Buffer {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        let end = self.len.checked_add(text.len()).filter(|end| *end <= CAPACITY).ok_or(fmt::Error)?;
        self.bytes[self.len..end].copy_from_slice(text.as_bytes());
        self.len = end;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formatted_values_match_their_text() {
        assert_eq!(formatted(format_args!("{}.{:04}", 0, 4500)), Some(HeaderValue::from_static("0.4500")));
        assert_eq!(formatted(format_args!("sha256:{}", "ab")), Some(HeaderValue::from_static("sha256:ab")));
        assert_eq!(formatted(format_args!("{}", "x".repeat(CAPACITY))).map(|value| value.len()), Some(CAPACITY));
    }

    #[test]
    fn too_long_or_invalid_values_are_left_out() {
        assert_eq!(formatted(format_args!("{}", "x".repeat(CAPACITY + 1))), None);
        assert_eq!(formatted(format_args!("a\nb")), None);
        assert_eq!(fixed("bad\r\nvalue"), None);
        assert_eq!(fixed("on"), Some(HeaderValue::from_static("on")));
    }

    #[test]
    fn milliseconds_have_three_decimals_rounded_to_the_microsecond() {
        assert_eq!(Millis(Duration::from_nanos(12_345_600)).to_string(), "12.346");
        assert_eq!(Millis(Duration::from_micros(7)).to_string(), "0.007");
        assert_eq!(Millis(Duration::ZERO).to_string(), "0.000");
        assert_eq!(Millis(Duration::from_secs(2)).to_string(), "2000.000");
    }
}
