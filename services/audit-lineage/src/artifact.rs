//! Signed evidence artifacts: HMAC-SHA256 over the artifact's canonical JSON, with a per-tenant key
//! derived from one configured secret.
//!
//! - Tenant key: `HMAC-SHA256(key = secret, message = "brainstorm/audit-artifact/v1/" || tenant_id)`.
//!   Each tenant verifies with its own key, so publishing a tenant's key to that tenant's auditors
//!   (the verification-key endpoint) lets nobody forge another tenant's artifacts.
//! - Key id: `ak_` + the first 16 hex digits of `SHA-256("brainstorm/audit-artifact/key-id/v1" ||
//!   tenant key)`: it changes when the secret rotates, and reveals nothing about the key.
//! - Signature: `base64url_nopad(HMAC-SHA256(tenant key, canonical artifact bytes))`.
//!
//! HMAC is symmetric: whoever holds the tenant key can also mint a valid artifact. The artifact binds
//! the record's chain hash, so a forged artifact still does not verify against the chain.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use brainstorm_proto::audit::{Signature, SignedArtifact, VerificationKey};
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::canonical::{Canonical, CanonicalError};

/// The algorithm named in signatures and keys.
pub const ALGORITHM: &str = "HMAC-SHA256";

/// The shortest secret accepted, in bytes.
pub const MIN_SECRET_BYTES: usize = 32;

const TENANT_KEY_LABEL: &[u8] = b"brainstorm/audit-artifact/v1/";
const KEY_ID_LABEL: &[u8] = b"brainstorm/audit-artifact/key-id/v1";

type HmacSha256 = Hmac<Sha256>;

/// Why a signer could not be built or an artifact checked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArtifactError {
    #[error("the artifact signing secret must be at least {MIN_SECRET_BYTES} bytes")]
    SecretTooShort,
    #[error("the artifact is not canonical JSON: {0}")]
    NotCanonical(#[from] CanonicalError),
    #[error("the key is not base64url")]
    BadKey,
}

/// Signs artifacts with keys derived from one secret (for example `BR_MASTER_KEY`'s bytes: the
/// derivation label keeps the uses apart).
#[derive(Clone)]
pub struct ArtifactSigner {
    secret: Vec<u8>,
}

impl std::fmt::Debug for ArtifactSigner {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("ArtifactSigner(..)")
    }
}

/// One tenant's artifact key.
#[derive(Clone, PartialEq, Eq)]
pub struct TenantKey {
    bytes: [u8; 32],
    key_id: String,
}

impl std::fmt::Debug for TenantKey {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "TenantKey({})", self.key_id)
    }
}

impl TenantKey {
    /// A key from its published base64url form (what the verification-key endpoint returns).
    pub fn from_published(key: &str) -> Result<Self, ArtifactError> {
        let decoded = URL_SAFE_NO_PAD.decode(key).map_err(|_| ArtifactError::BadKey)?;
        let bytes: [u8; 32] = decoded.try_into().map_err(|_| ArtifactError::BadKey)?;
        Ok(Self::from_bytes(bytes))
    }

    fn from_bytes(bytes: [u8; 32]) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(KEY_ID_LABEL);
        hasher.update(bytes);
        let digest = hex::encode(hasher.finalize());
        TenantKey { bytes, key_id: format!("ak_{}", &digest[..16]) }
    }

    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    /// The MAC of some bytes, base64url without padding.
    pub fn sign(&self, message: &[u8]) -> String {
        URL_SAFE_NO_PAD.encode(mac(&self.bytes, &[message]))
    }

    /// Checks a signature in constant time.
    pub fn verify(&self, message: &[u8], signature: &str) -> bool {
        match URL_SAFE_NO_PAD.decode(signature) {
            Ok(presented) => bool::from(mac(&self.bytes, &[message]).as_slice().ct_eq(&presented)),
            Err(_) => false,
        }
    }

    /// The published form.
    pub fn published(&self, tenant_id: &str) -> VerificationKey {
        VerificationKey {
            tenant_id: tenant_id.to_string(),
            key_id: self.key_id.clone(),
            algorithm: ALGORITHM.to_string(),
            key: URL_SAFE_NO_PAD.encode(self.bytes),
        }
    }
}

fn mac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    // HMAC accepts keys of any length, so construction cannot fail.
    let mut mac = match HmacSha256::new_from_slice(key) {
        Ok(mac) => mac,
        Err(_) => return [0; 32],
    };
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().into()
}

impl ArtifactSigner {
    /// A signer over `secret` (at least 32 bytes).
    pub fn new(secret: &[u8]) -> Result<Self, ArtifactError> {
        if secret.len() < MIN_SECRET_BYTES {
            return Err(ArtifactError::SecretTooShort);
        }
        Ok(ArtifactSigner { secret: secret.to_vec() })
    }

    /// The tenant's key.
    pub fn tenant_key(&self, tenant_id: &str) -> TenantKey {
        TenantKey::from_bytes(mac(&self.secret, &[TENANT_KEY_LABEL, tenant_id.as_bytes()]))
    }

    /// Signs an artifact object.
    pub fn sign(&self, tenant_id: &str, request_id: &str, artifact: &Canonical) -> SignedArtifact {
        let key = self.tenant_key(tenant_id);
        let canonical = artifact.to_text();
        SignedArtifact {
            request_id: request_id.to_string(),
            signature: Some(Signature {
                algorithm: ALGORITHM.to_string(),
                key_id: key.key_id.clone(),
                value: key.sign(canonical.as_bytes()),
            }),
            canonical,
        }
    }
}

/// Verifies an artifact as a client would: re-encode the artifact JSON canonically and check the MAC.
pub fn verify_artifact(artifact: &serde_json::Value, signature: &Signature, key: &TenantKey) -> Result<bool, ArtifactError> {
    if signature.algorithm != ALGORITHM || signature.key_id != key.key_id {
        return Ok(false);
    }
    let canonical = Canonical::from_json(artifact)?.to_text();
    Ok(key.verify(canonical.as_bytes(), &signature.value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::canonical::ObjectBuilder;

    #[test]
    fn keys_are_per_tenant_and_stable() -> Result<(), ArtifactError> {
        let signer = ArtifactSigner::new(&[7u8; 32])?;
        assert_eq!(signer.tenant_key("a"), signer.tenant_key("a"));
        assert_ne!(signer.tenant_key("a").key_id(), signer.tenant_key("b").key_id());
        let rotated = ArtifactSigner::new(&[8u8; 32])?;
        assert_ne!(signer.tenant_key("a").key_id(), rotated.tenant_key("a").key_id());
        assert!(matches!(ArtifactSigner::new(&[1u8; 31]), Err(ArtifactError::SecretTooShort)));
        Ok(())
    }

    #[test]
    fn a_signed_artifact_verifies_with_the_published_key_only() -> Result<(), Box<dyn std::error::Error>> {
        let signer = ArtifactSigner::new(b"a secret of at least thirty-two bytes!")?;
        let artifact = ObjectBuilder::new().text("requestId", "req_1").integer("costNanos", 42).build();
        let signed = signer.sign("t1", "req_1", &artifact);
        let signature = signed.signature.clone().ok_or("unsigned")?;
        let published = TenantKey::from_published(&signer.tenant_key("t1").published("t1").key)?;
        let parsed: serde_json::Value = serde_json::from_str(&signed.canonical)?;
        assert!(verify_artifact(&parsed, &signature, &published)?);

        let mut tampered = parsed.clone();
        tampered["costNanos"] = serde_json::json!(41);
        assert!(!verify_artifact(&tampered, &signature, &published)?);
        assert!(!verify_artifact(&parsed, &signature, &signer.tenant_key("t2"))?, "another tenant's key fails");
        let mut bad = signature.clone();
        bad.value = "AAAA".to_string();
        assert!(!verify_artifact(&parsed, &bad, &published)?);
        Ok(())
    }
}
