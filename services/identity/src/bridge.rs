//! The identity bridge's rules: device and user codes of the device authorization grant (RFC 8628).

use rand::Rng;

/// Prefix of a device code (the device's secret; kept as a digest).
pub const DEVICE_CODE_PREFIX: &str = "brdc_";
/// How long a device authorization waits for its confirmation.
pub const DEVICE_CODE_SECONDS: i64 = 600;
/// How often a device may poll; polling faster is answered `slow_down`.
pub const POLL_INTERVAL_SECONDS: u32 = 5;
/// How long a key issued to a linked device lives.
pub const DEVICE_KEY_DAYS: i64 = 90;
/// User code characters: consonants only (no words, no look-alikes such as 0/O or 1/I; RFC 8628 6.1).
const USER_CODE_ALPHABET: &[u8] = b"BCDFGHJKLMNPQRSTVWXZ";
const USER_CODE_LENGTH: usize = 8;

/// A fresh user code, `XXXX-XXXX`.
pub fn user_code() -> String {
    let mut random = rand::rng();
    let characters: String =
        (0..USER_CODE_LENGTH).map(|_| char::from(USER_CODE_ALPHABET[random.random_range(0..USER_CODE_ALPHABET.len())])).collect();
    format!("{}-{}", &characters[..4], &characters[4..])
}

/// A user code as a person may type it (any case, with or without the dash or spaces) in its stored
/// form; None when it cannot be one.
pub fn normalise_user_code(typed: &str) -> Option<String> {
    let characters: String = typed.chars().filter(|character| !matches!(character, '-' | ' ')).map(|c| c.to_ascii_uppercase()).collect();
    let valid = characters.len() == USER_CODE_LENGTH && characters.bytes().all(|byte| USER_CODE_ALPHABET.contains(&byte));
    valid.then(|| format!("{}-{}", &characters[..4], &characters[4..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_codes_are_drawn_from_the_alphabet_and_read_back_however_typed() {
        for _ in 0..100 {
            let code = user_code();
            assert_eq!(code.len(), 9);
            assert_eq!(normalise_user_code(&code).as_deref(), Some(code.as_str()));
            let typed = code.to_lowercase().replace('-', " ");
            assert_eq!(normalise_user_code(&typed).as_deref(), Some(code.as_str()));
        }
        for bad in ["", "BCDF-GHJ", "BCDF-GHJKL", "BCDF-GHJA", "0000-0000"] {
            assert_eq!(normalise_user_code(bad), None, "{bad}");
        }
    }
}
