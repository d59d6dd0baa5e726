//! Exact money: US dollars held as an integer count of billionths (nano-dollars), never as floats.

use std::fmt;

const NANOS_PER_USD: i64 = 1_000_000_000;

/// An exact amount of US dollars.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Usd {
    nanos: i64,
}

/// Why a decimal could not be read as dollars.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UsdParseError {
    #[error("`{0}` is not a decimal amount of dollars")]
    NotDecimal(String),
    #[error("`{0}` has more than 9 decimal places")]
    TooPrecise(String),
    #[error("`{0}` is out of range")]
    OutOfRange(String),
}

impl Usd {
    /// Zero dollars.
    pub const ZERO: Usd = Usd { nanos: 0 };

    /// From a count of nano-dollars.
    pub const fn from_nanos(nanos: i64) -> Self {
        Usd { nanos }
    }

    /// The count of nano-dollars.
    pub const fn nanos(self) -> i64 {
        self.nanos
    }

    /// Reads a decimal such as `12`, `0.5` or `-3.000000001` exactly (the text of a JSON number).
    pub fn parse_decimal(text: &str) -> Result<Self, UsdParseError> {
        let not_decimal = || UsdParseError::NotDecimal(text.to_string());
        let out_of_range = || UsdParseError::OutOfRange(text.to_string());
        let (negative, unsigned) = match text.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let (whole, fraction) = unsigned.split_once('.').unwrap_or((unsigned, ""));
        let all_digits = |part: &str| part.bytes().all(|byte| byte.is_ascii_digit());
        if whole.is_empty() || !all_digits(whole) || !all_digits(fraction) || (unsigned.contains('.') && fraction.is_empty()) {
            return Err(not_decimal());
        }
        if fraction.len() > 9 {
            return Err(UsdParseError::TooPrecise(text.to_string()));
        }
        let whole: i64 = whole.parse().map_err(|_| out_of_range())?;
        let fraction_nanos: i64 = if fraction.is_empty() {
            0
        } else {
            let padded = format!("{fraction:0<9}");
            padded.parse().map_err(|_| not_decimal())?
        };
        let nanos = whole.checked_mul(NANOS_PER_USD).and_then(|nanos| nanos.checked_add(fraction_nanos)).ok_or_else(out_of_range)?;
        Ok(Usd { nanos: if negative { -nanos } else { nanos } })
    }

    /// Reads a JSON number exactly, through its decimal text (no float arithmetic). Exponent
    /// notation (`1e-06`, as Python's and JavaScript's encoders write small amounts) is read by
    /// moving the decimal point in the text.
    pub fn from_json_number(number: &serde_json::Number) -> Result<Self, UsdParseError> {
        let text = number.to_string();
        match text.split_once(['e', 'E']) {
            None => Self::parse_decimal(&text),
            Some((mantissa, exponent)) => {
                let relabel = |error: UsdParseError| match error {
                    UsdParseError::NotDecimal(_) => UsdParseError::NotDecimal(text.clone()),
                    UsdParseError::TooPrecise(_) => UsdParseError::TooPrecise(text.clone()),
                    UsdParseError::OutOfRange(_) => UsdParseError::OutOfRange(text.clone()),
                };
                Self::parse_decimal(&without_exponent(mantissa, exponent).map_err(relabel)?).map_err(relabel)
            }
        }
    }

    /// As a JSON number (for display only; arithmetic stays on nanos).
    pub fn to_json(self) -> serde_json::Value {
        let text = self.to_string();
        match text.parse::<serde_json::Number>() {
            Ok(number) => serde_json::Value::Number(number),
            Err(_) => serde_json::Value::String(text),
        }
    }

    /// Formats with exactly `decimals` places (truncating extra precision toward zero).
    pub fn format_fixed(self, decimals: u32) -> String {
        self.fixed(decimals).to_string()
    }

    /// Displays with exactly `decimals` places (at most 9; extra precision truncated toward zero), to
    /// be written where it goes without an intermediate `String`.
    pub fn fixed(self, decimals: u32) -> FixedUsd {
        FixedUsd { amount: self, decimals: decimals.min(9) }
    }
}

/// `mantissa` times ten to `exponent` as plain decimal text (`2.5`, `-7` -> `0.00000025`), trailing
/// fractional zeros dropped. Errors carry the mantissa; the caller names the whole number.
fn without_exponent(mantissa: &str, exponent: &str) -> Result<String, UsdParseError> {
    let not_decimal = || UsdParseError::NotDecimal(mantissa.to_string());
    let exponent: i64 = exponent.parse().map_err(|_| not_decimal())?;
    let (sign, unsigned) = match mantissa.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", mantissa),
    };
    let (whole, fraction) = unsigned.split_once('.').unwrap_or((unsigned, ""));
    if whole.is_empty() || !whole.bytes().chain(fraction.bytes()).all(|byte| byte.is_ascii_digit()) {
        return Err(not_decimal());
    }
    let digits = [whole, fraction].concat();
    if digits.bytes().all(|byte| byte == b'0') {
        return Ok("0".to_string());
    }
    // Past 10^±40 no amount of nano-dollars is representable: refuse before building the text.
    if exponent > 40 {
        return Err(UsdParseError::OutOfRange(mantissa.to_string()));
    }
    if exponent < -40 {
        return Err(UsdParseError::TooPrecise(mantissa.to_string()));
    }
    let point = i64::try_from(whole.len()).map_err(|_| not_decimal())? + exponent;
    let (whole, fraction) = match usize::try_from(point) {
        Err(_) | Ok(0) => ("0".to_string(), ["0".repeat(usize::try_from(-point).unwrap_or(0)), digits].concat()),
        Ok(point) if point >= digits.len() => ([digits.as_str(), &"0".repeat(point - digits.len())].concat(), String::new()),
        Ok(point) => (digits[..point].to_string(), digits[point..].to_string()),
    };
    let fraction = fraction.trim_end_matches('0');
    Ok(if fraction.is_empty() { [sign, &whole].concat() } else { [sign, &whole, ".", fraction].concat() })
}

/// An amount shown with a fixed number of decimals (`Usd::fixed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedUsd {
    amount: Usd,
    decimals: u32,
}

impl fmt::Display for FixedUsd {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let magnitude = self.amount.nanos.unsigned_abs();
        let fraction = (magnitude % NANOS_PER_USD as u64) / 10u64.pow(9 - self.decimals);
        write_fixed(formatter, self.amount.nanos < 0, magnitude / NANOS_PER_USD as u64, fraction, self.decimals)
    }
}

/// Writes `[-]whole.fraction`, the fraction zero-padded to `decimals` digits (none when 0), in one piece.
pub fn write_fixed(formatter: &mut fmt::Formatter<'_>, negative: bool, whole: u64, fraction: u64, decimals: u32) -> fmt::Result {
    // Digit by digit into a stack buffer, from the end: `write!` with a width runs the formatter's
    // padding for each part, several times the work, and the answer's cost and latency headers are
    // written on every request. Room for 20 digits of a u64, a point, up to 20 decimals (more are not
    // written) and a sign.
    let mut text = [0u8; 42];
    let mut start = text.len();
    let mut push = |digit: u8| {
        start -= 1;
        text[start] = digit;
    };
    let mut rest = fraction;
    for _ in 0..decimals.min(20) {
        push(b'0' + (rest % 10) as u8);
        rest /= 10;
    }
    if decimals > 0 {
        push(b'.');
    }
    let mut rest = whole;
    loop {
        push(b'0' + (rest % 10) as u8);
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    if negative {
        push(b'-');
    }
    formatter.write_str(std::str::from_utf8(&text[start..]).map_err(|_| fmt::Error)?)
}

impl fmt::Display for Usd {
    /// Shortest exact decimal: `12`, `0.5`, `0.000000001`.
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fixed = self.format_fixed(9);
        let trimmed = fixed.trim_end_matches('0').trim_end_matches('.');
        formatter.write_str(trimmed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_amounts_are_written_digit_for_digit() {
        let shown = |nanos: i64, decimals: u32| Usd::from_nanos(nanos).fixed(decimals).to_string();
        assert_eq!(shown(12_345_678_901, 6), "12.345678");
        assert_eq!(shown(-1_500_000_000, 2), "-1.50");
        assert_eq!(shown(7_000, 6), "0.000007");
        assert_eq!(shown(0, 6), "0.000000");
        assert_eq!(shown(42_999_999_999, 0), "42");
        assert_eq!(shown(i64::MIN, 9), "-9223372036.854775808");
        assert_eq!(shown(i64::MAX, 9), "9223372036.854775807");
    }

    #[test]
    fn decimals_are_read_exactly() {
        assert_eq!(Usd::parse_decimal("12"), Ok(Usd::from_nanos(12_000_000_000)));
        assert_eq!(Usd::parse_decimal("0.1"), Ok(Usd::from_nanos(100_000_000)));
        assert_eq!(Usd::parse_decimal("-3.000000001"), Ok(Usd::from_nanos(-3_000_000_001)));
        assert!(matches!(Usd::parse_decimal("0.0000000001"), Err(UsdParseError::TooPrecise(_))));
        for bad in ["", ".5", "5.", "1e3", "abc", "1.2.3", "--1"] {
            assert!(Usd::parse_decimal(bad).is_err(), "{bad} should not parse");
        }
        assert!(matches!(Usd::parse_decimal("99999999999999"), Err(UsdParseError::OutOfRange(_))));
    }

    #[test]
    fn json_numbers_in_exponent_notation_are_read_exactly() {
        let read = |text: &str| Usd::from_json_number(&text.parse::<serde_json::Number>().unwrap());
        assert_eq!(read("1e-06"), Ok(Usd::from_nanos(1_000)));
        assert_eq!(read("2.5e-8"), Ok(Usd::from_nanos(25)));
        assert_eq!(read("-1.5E3"), Ok(Usd::from_nanos(-1_500_000_000_000)));
        assert_eq!(read("1e2"), Ok(Usd::from_nanos(100_000_000_000)));
        assert_eq!(read("0.001"), Ok(Usd::from_nanos(1_000_000)));
        assert!(matches!(read("1e-10"), Err(UsdParseError::TooPrecise(_))));
        assert!(matches!(read("1e-300"), Err(UsdParseError::TooPrecise(_))));
        assert!(matches!(read("1e300"), Err(UsdParseError::OutOfRange(_))));
        assert_eq!(read("0e-400"), Ok(Usd::ZERO));
    }

    #[test]
    fn ten_cents_ten_times_is_exactly_a_dollar() {
        let ten_cents = Usd::parse_decimal("0.1").unwrap_or_default();
        let total = (0..10).fold(0i64, |sum, _| sum + ten_cents.nanos());
        assert_eq!(Usd::from_nanos(total).to_string(), "1");
    }

    #[test]
    fn formatting_is_exact() {
        assert_eq!(Usd::from_nanos(1_234_567).format_fixed(6), "0.001234");
        assert_eq!(Usd::from_nanos(-1_500_000_000).format_fixed(2), "-1.50");
        assert_eq!(Usd::from_nanos(2_500_000_000).to_string(), "2.5");
        assert_eq!(Usd::ZERO.to_string(), "0");
        assert_eq!(Usd::from_nanos(2_500_000_000).to_json(), serde_json::json!(2.5));
    }
}
