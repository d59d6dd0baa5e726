//! Envelope encryption of provider keys: each secret is sealed with its own random AES-256-GCM data
//! key, and the data key is sealed with the master key. The tenant and provider are bound in as
//! associated data, so a sealed key moved to another row does not open.

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Key, Nonce};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use rand::RngCore;

/// Why sealing or opening failed (never carries the secret).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VaultError {
    #[error("the master key must be 64 hexadecimal characters")]
    BadMasterKey,
    #[error("the sealed secret is corrupt or was sealed under another master key or binding")]
    CannotOpen,
}

/// The key-encryption key.
#[derive(Clone)]
pub struct MasterKey(Key<Aes256Gcm>);

impl std::fmt::Debug for MasterKey {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("MasterKey(***)")
    }
}

impl MasterKey {
    /// From 64 hex characters.
    pub fn from_hex(text: &str) -> Result<Self, VaultError> {
        let bytes = hex::decode(text.trim()).map_err(|_| VaultError::BadMasterKey)?;
        let bytes: [u8; 32] = bytes.try_into().map_err(|_| VaultError::BadMasterKey)?;
        Ok(MasterKey(bytes.into()))
    }

    /// A secret for one purpose, derived from (and not revealing) the master key.
    fn derived_secret(&self, purpose: &[u8]) -> [u8; 32] {
        use sha2::Digest;
        let mut hasher = sha2::Sha256::new();
        hasher.update(purpose);
        hasher.update(self.0.as_slice());
        hasher.finalize().into()
    }

    /// A secret for signing evidence artifacts.
    pub fn artifact_secret(&self) -> [u8; 32] {
        self.derived_secret(b"brainstorm/artifact-signing/v1\0")
    }

    /// A secret for signing agent JWTs.
    pub fn agent_token_secret(&self) -> [u8; 32] {
        self.derived_secret(b"brainstorm/agent-jwt/v1\0")
    }

    /// The seed of the agent CA's Ed25519 key (agent client certificates for mTLS).
    pub fn agent_ca_secret(&self) -> [u8; 32] {
        self.derived_secret(b"brainstorm/agent-ca/v1\0")
    }

    /// A secret for signing liaison session ids and plans.
    pub fn liaison_secret(&self) -> [u8; 32] {
        self.derived_secret(b"brainstorm/liaison/v2\0")
    }

    /// A fresh random key, as hex (for embedded mode's generated key file).
    pub fn generate_hex() -> String {
        let mut bytes = [0u8; 32];
        rand::rng().fill_bytes(&mut bytes);
        hex::encode(bytes)
    }
}

/// A sealed secret, as stored (base64 text fields).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SealedSecret {
    pub ciphertext: String,
    pub nonce: String,
    pub wrapped_key: String,
    pub key_nonce: String,
}

fn random_nonce() -> [u8; 12] {
    let mut nonce = [0u8; 12];
    rand::rng().fill_bytes(&mut nonce);
    nonce
}

/// Seals `secret`, bound to `binding` (for example `tenant_id/provider`).
pub fn seal(master: &MasterKey, secret: &str, binding: &str) -> Result<SealedSecret, VaultError> {
    let mut data_key = [0u8; 32];
    rand::rng().fill_bytes(&mut data_key);
    let data_cipher = Aes256Gcm::new(&data_key.into());
    let nonce = random_nonce();
    let ciphertext = data_cipher
        .encrypt(Nonce::from_slice(&nonce), Payload { msg: secret.as_bytes(), aad: binding.as_bytes() })
        .map_err(|_| VaultError::CannotOpen)?;
    let key_nonce = random_nonce();
    let wrapped_key = Aes256Gcm::new(&master.0)
        .encrypt(Nonce::from_slice(&key_nonce), Payload { msg: &data_key, aad: binding.as_bytes() })
        .map_err(|_| VaultError::CannotOpen)?;
    Ok(SealedSecret {
        ciphertext: STANDARD.encode(ciphertext),
        nonce: STANDARD.encode(nonce),
        wrapped_key: STANDARD.encode(wrapped_key),
        key_nonce: STANDARD.encode(key_nonce),
    })
}

/// Opens a sealed secret bound to `binding`.
pub fn open(master: &MasterKey, sealed: &SealedSecret, binding: &str) -> Result<String, VaultError> {
    let decode = |text: &str| STANDARD.decode(text).map_err(|_| VaultError::CannotOpen);
    let key_nonce = decode(&sealed.key_nonce)?;
    let nonce = decode(&sealed.nonce)?;
    if key_nonce.len() != 12 || nonce.len() != 12 {
        return Err(VaultError::CannotOpen);
    }
    let data_key = Aes256Gcm::new(&master.0)
        .decrypt(Nonce::from_slice(&key_nonce), Payload { msg: &decode(&sealed.wrapped_key)?, aad: binding.as_bytes() })
        .map_err(|_| VaultError::CannotOpen)?;
    let data_key: [u8; 32] = data_key.try_into().map_err(|_| VaultError::CannotOpen)?;
    let plaintext = Aes256Gcm::new(&data_key.into())
        .decrypt(Nonce::from_slice(&nonce), Payload { msg: &decode(&sealed.ciphertext)?, aad: binding.as_bytes() })
        .map_err(|_| VaultError::CannotOpen)?;
    String::from_utf8(plaintext).map_err(|_| VaultError::CannotOpen)
}

/// How a key is shown: its first characters and its last four, never enough to use it.
pub fn mask(secret: &str) -> String {
    let characters: Vec<char> = secret.chars().collect();
    if characters.len() <= 8 {
        return "****".to_string();
    }
    let head: String = characters.iter().take(3).collect();
    let tail: String = characters[characters.len() - 4..].iter().collect();
    format!("{head}...{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_secrets_open_only_with_their_key_and_binding() -> Result<(), VaultError> {
        let master = MasterKey::from_hex(&MasterKey::generate_hex())?;
        let other = MasterKey::from_hex(&MasterKey::generate_hex())?;
        let sealed = seal(&master, "sk-live-secret-123456", "tenant-1/openai")?;
        for field in [&sealed.ciphertext, &sealed.wrapped_key] {
            assert!(!field.contains("secret"));
        }
        assert_eq!(open(&master, &sealed, "tenant-1/openai")?, "sk-live-secret-123456");
        assert_eq!(open(&other, &sealed, "tenant-1/openai"), Err(VaultError::CannotOpen));
        assert_eq!(open(&master, &sealed, "tenant-2/openai"), Err(VaultError::CannotOpen));
        let resealed = seal(&master, "sk-live-secret-123456", "tenant-1/openai")?;
        assert_ne!(resealed.ciphertext, sealed.ciphertext, "fresh data key and nonce every time");
        assert_eq!(MasterKey::from_hex("abc").err(), Some(VaultError::BadMasterKey));
        Ok(())
    }

    #[test]
    fn masks_never_reveal_the_middle() {
        assert_eq!(mask("sk-proj-abcdefghijklmnop1234"), "sk-...1234");
        assert_eq!(mask("short"), "****");
    }
}
