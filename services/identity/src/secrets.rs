//! Credentials minted by identity: random, shown once, stored only as SHA-256 digests.

use rand::Rng;
use rand::distr::Alphanumeric;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Prefix of live API keys.
pub const LIVE_KEY_PREFIX: &str = "br_live_";
/// Prefix of test API keys.
pub const TEST_KEY_PREFIX: &str = "br_test_";
/// Prefix of claim tokens.
pub const CLAIM_TOKEN_PREFIX: &str = "brct_";
/// How much of a key is kept to recognise it.
const DISPLAY_PREFIX_LEN: usize = 12;

/// A fresh credential `<prefix><40 alphanumerics>` (about 238 bits of entropy).
pub fn mint(prefix: &str) -> String {
    let random: String = rand::rng().sample_iter(&Alphanumeric).take(40).map(char::from).collect();
    format!("{prefix}{random}")
}

/// The stored form of a credential. Keys carry ample entropy, so a fast hash is enough and keeps the
/// authentication path cheap.
pub fn digest(credential: &str) -> String {
    hex::encode(Sha256::digest(credential.as_bytes()))
}

/// The recognisable, unusable start of a key.
pub fn display_prefix(key: &str) -> String {
    key.chars().take(DISPLAY_PREFIX_LEN).collect()
}

/// A fresh 6-digit email verification code, uniform over `000000..=999999`. `rand::rng()` is a CSPRNG
/// (ChaCha12 seeded from the operating system) and `random_range` samples without modulo bias.
pub fn verification_code() -> String {
    format!("{:06}", rand::rng().random_range(0..1_000_000_u32))
}

/// The stored form of a verification code, bound to the tenant and the address it was mailed to: the
/// same code for another tenant or address has another digest, so a row copied or edited verifies
/// nothing. Six digits are brute-forced offline in a moment, so the digest only keeps the code out of
/// the database in plain text; the 600-second lifetime and the attempt limit are what protect it.
pub fn verification_code_digest(tenant_id: &str, email: &str, code: &str) -> String {
    let mut hasher = Sha256::new();
    for part in ["brainstorm email verification", tenant_id, email, code] {
        // Length-prefixed parts: no two different part lists hash the same bytes.
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part.as_bytes());
    }
    hex::encode(hasher.finalize())
}

/// Compares two digests in constant time, so the time taken says nothing about where they differ.
pub fn digests_match(presented: &str, stored: &str) -> bool {
    presented.as_bytes().ct_eq(stored.as_bytes()).into()
}

/// Whether a presented string has the shape of an API key.
pub fn looks_like_api_key(candidate: &str) -> bool {
    let body = candidate.strip_prefix(LIVE_KEY_PREFIX).or_else(|| candidate.strip_prefix(TEST_KEY_PREFIX));
    body.is_some_and(|body| {
        (16..=128).contains(&body.len()) && body.bytes().all(|byte| byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-')
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minted_keys_are_unique_well_formed_and_hash_stably() {
        let first = mint(LIVE_KEY_PREFIX);
        let second = mint(LIVE_KEY_PREFIX);
        assert_ne!(first, second);
        assert!(looks_like_api_key(&first));
        assert_eq!(digest(&first), digest(&first));
        assert_ne!(digest(&first), digest(&second));
        assert_eq!(display_prefix(&first).len(), 12);
        assert!(!looks_like_api_key("br_live_short"));
        assert!(!looks_like_api_key("sk-abcdefghijklmnopqrstuvwxyz"));
        assert!(!looks_like_api_key("br_live_has spaces in it and more"));
    }

    #[test]
    fn verification_codes_are_six_digits_and_their_digests_are_bound() {
        let codes: Vec<String> = (0..200).map(|_| verification_code()).collect();
        assert!(codes.iter().all(|code| code.len() == 6 && code.bytes().all(|byte| byte.is_ascii_digit())));
        // 200 draws from a million values repeat with probability about 2%; 150 distinct is far below any fair run.
        assert!(codes.iter().collect::<std::collections::BTreeSet<_>>().len() > 150);

        let digest = verification_code_digest("tenant-a", "ada@example.com", "123456");
        assert_eq!(digest.len(), 64);
        assert!(!digest.contains("123456"));
        assert_eq!(digest, verification_code_digest("tenant-a", "ada@example.com", "123456"));
        assert_ne!(digest, verification_code_digest("tenant-b", "ada@example.com", "123456"));
        assert_ne!(digest, verification_code_digest("tenant-a", "bob@example.com", "123456"));
        assert_ne!(digest, verification_code_digest("tenant-a", "ada@example.com", "123457"));
        // Moving a boundary between parts changes the digest.
        assert_ne!(verification_code_digest("ab", "c", "1"), verification_code_digest("a", "bc", "1"));
        assert!(digests_match(&digest, &digest.clone()));
        assert!(!digests_match(&digest, &verification_code_digest("tenant-a", "ada@example.com", "000000")));
        assert!(!digests_match(&digest, ""));
    }
}
