//! Credentials minted by identity: random, shown once, stored only as SHA-256 digests.

use rand::Rng;
use rand::distr::Alphanumeric;
use sha2::{Digest, Sha256};

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
}
