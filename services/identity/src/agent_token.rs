//! Agent JWTs: compact JWS tokens signed with HMAC-SHA256 (`HS256`) under a secret derived from the
//! master key, minted by bootstrap and presented on the agent self endpoints. Verification accepts
//! exactly the header this module writes (no `alg: none`, no other algorithm, no key id it did not
//! issue), checks the signature in constant time, then the issuer, audience and lifetime.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// The `iss` of every token.
pub const ISSUER: &str = "brainstorm";
/// The `aud` of every token: agents, not dashboards or other relying parties.
pub const AUDIENCE: &str = "brainstorm-agent";
/// Tokens larger than this are refused before any decoding.
const MAX_TOKEN_BYTES: usize = 4096;
/// Clock skew allowed on `iat` (a token issued slightly in the future by another replica's clock).
const LEEWAY_SECONDS: i64 = 60;

/// The trust envelope a token carries: what the gateway knew about the agent's standing when it
/// minted the token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrustClaims {
    /// An XDR's risk score for the agent (0 to 1), and who pushed it.
    pub xdr_risk: f64,
    pub xdr_risk_source: String,
}

/// What a token says about its agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentClaims {
    pub iss: String,
    pub aud: String,
    /// The agent id.
    pub sub: String,
    /// The tenant id.
    pub tid: String,
    /// The profile's own id: a profile deleted and created again under the same agent id is another.
    pub pid: String,
    pub role: String,
    pub iat: i64,
    pub exp: i64,
    pub jti: String,
    /// Present when the agent had an XDR risk score at minting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub br_trust: Option<TrustClaims>,
}

#[derive(Serialize, Deserialize)]
struct Header {
    alg: String,
    typ: String,
    kid: String,
}

/// Why a presented token was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("the token is not a JWT this gateway issued")]
    Malformed,
    #[error("the token's signature does not verify")]
    BadSignature,
    #[error("the token has expired")]
    Expired,
}

/// Mints and verifies agent tokens.
#[derive(Clone)]
pub struct AgentTokenSigner {
    key: [u8; 32],
    key_id: String,
    lifetime: Duration,
}

impl std::fmt::Debug for AgentTokenSigner {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "AgentTokenSigner({})", self.key_id)
    }
}

impl AgentTokenSigner {
    /// A signer over a 32-byte secret (derived from the master key), minting tokens valid `lifetime`.
    pub fn new(secret: [u8; 32], lifetime: Duration) -> Self {
        let key_id = {
            let mut mac = mac(&secret);
            mac.update(b"brainstorm/agent-jwt/key-id/v1");
            hex::encode(&mac.finalize().into_bytes()[..8])
        };
        AgentTokenSigner { key: secret, key_id, lifetime }
    }

    /// How long minted tokens live.
    pub fn lifetime(&self) -> Duration {
        self.lifetime
    }

    /// A signed token for an agent, and when it expires.
    pub fn mint(
        &self,
        tenant_id: &str,
        agent_id: &str,
        profile_id: &str,
        role: &str,
        trust: Option<TrustClaims>,
        now: DateTime<Utc>,
    ) -> (String, DateTime<Utc>) {
        let lifetime = chrono::Duration::from_std(self.lifetime).unwrap_or(chrono::Duration::hours(1));
        let expires_at = now + lifetime;
        let claims = AgentClaims {
            iss: ISSUER.to_string(),
            aud: AUDIENCE.to_string(),
            sub: agent_id.to_string(),
            tid: tenant_id.to_string(),
            pid: profile_id.to_string(),
            role: role.to_string(),
            iat: now.timestamp(),
            exp: expires_at.timestamp(),
            jti: uuid::Uuid::now_v7().to_string(),
            br_trust: trust,
        };
        let header = Header { alg: "HS256".to_string(), typ: "JWT".to_string(), kid: self.key_id.clone() };
        let signing_input = format!("{}.{}", encode_json(&header), encode_json(&claims));
        let mut mac = mac(&self.key);
        mac.update(signing_input.as_bytes());
        let signature = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
        (format!("{signing_input}.{signature}"), chrono::DateTime::from_timestamp(claims.exp, 0).unwrap_or(expires_at))
    }

    /// The claims of a token this signer issued, unexpired at `now`.
    pub fn verify(&self, token: &str, now: DateTime<Utc>) -> Result<AgentClaims, TokenError> {
        if token.len() > MAX_TOKEN_BYTES {
            return Err(TokenError::Malformed);
        }
        let (signing_input, signature) = token.rsplit_once('.').ok_or(TokenError::Malformed)?;
        let (header, claims) = signing_input.split_once('.').ok_or(TokenError::Malformed)?;
        if claims.contains('.') {
            return Err(TokenError::Malformed);
        }
        let header: Header = decode_json(header)?;
        if header.alg != "HS256" || header.typ != "JWT" || header.kid != self.key_id {
            return Err(TokenError::Malformed);
        }
        let signature = URL_SAFE_NO_PAD.decode(signature).map_err(|_| TokenError::Malformed)?;
        let mut mac = mac(&self.key);
        mac.update(signing_input.as_bytes());
        // `verify_slice` compares in constant time.
        mac.verify_slice(&signature).map_err(|_| TokenError::BadSignature)?;
        let claims: AgentClaims = decode_json(claims)?;
        if claims.iss != ISSUER || claims.aud != AUDIENCE || claims.sub.is_empty() || claims.tid.is_empty() {
            return Err(TokenError::Malformed);
        }
        let now = now.timestamp();
        if claims.iat > now + LEEWAY_SECONDS {
            return Err(TokenError::Malformed);
        }
        if claims.exp <= now {
            return Err(TokenError::Expired);
        }
        Ok(claims)
    }
}

fn mac(key: &[u8]) -> HmacSha256 {
    // HMAC takes a key of any length; this cannot fail.
    <HmacSha256 as Mac>::new_from_slice(key).unwrap_or_else(|_| unreachable!("HMAC accepts keys of any length"))
}

fn encode_json<T: Serialize>(value: &T) -> String {
    // Serializing these plain structs cannot fail.
    URL_SAFE_NO_PAD.encode(serde_json::to_vec(value).unwrap_or_default())
}

fn decode_json<T: for<'de> Deserialize<'de>>(part: &str) -> Result<T, TokenError> {
    let bytes = URL_SAFE_NO_PAD.decode(part).map_err(|_| TokenError::Malformed)?;
    serde_json::from_slice(&bytes).map_err(|_| TokenError::Malformed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signer() -> AgentTokenSigner {
        AgentTokenSigner::new([7; 32], Duration::from_secs(3600))
    }

    fn now() -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000, 0).unwrap()
    }

    #[test]
    fn a_minted_token_verifies_with_its_claims() {
        let (token, expires_at) = signer().mint("tenant-1", "planner", "profile-1", "agent", None, now());
        assert_eq!(expires_at.timestamp(), 1_800_003_600);
        let claims = signer().verify(&token, now()).unwrap();
        assert_eq!(
            (claims.sub.as_str(), claims.tid.as_str(), claims.pid.as_str(), claims.role.as_str()),
            ("planner", "tenant-1", "profile-1", "agent")
        );
        assert_eq!((claims.iss.as_str(), claims.aud.as_str(), claims.exp), (ISSUER, AUDIENCE, 1_800_003_600));
        let (again, _) = signer().mint("tenant-1", "planner", "profile-1", "agent", None, now());
        assert_ne!(token, again, "every token has its own id");
    }

    #[test]
    fn expired_tokens_are_refused() {
        let (token, _) = signer().mint("t", "planner", "p", "agent", None, now());
        let later = now() + chrono::Duration::seconds(3600);
        assert_eq!(signer().verify(&token, later), Err(TokenError::Expired));
        assert!(signer().verify(&token, later - chrono::Duration::seconds(1)).is_ok());
    }

    #[test]
    fn tokens_from_another_secret_or_edited_are_refused() {
        let (token, _) = signer().mint("t", "planner", "p", "agent", None, now());
        let other = AgentTokenSigner::new([8; 32], Duration::from_secs(3600));
        // Another secret has another key id, so its tokens are not even this signer's shape.
        assert_eq!(other.verify(&token, now()), Err(TokenError::Malformed));
        let parts: Vec<&str> = token.split('.').collect();
        // A claim rewritten (another tenant) with the original signature.
        let mut claims: AgentClaims = decode_json(parts[1]).unwrap();
        claims.tid = "another-tenant".to_string();
        let forged = format!("{}.{}.{}", parts[0], encode_json(&claims), parts[2]);
        assert_eq!(signer().verify(&forged, now()), Err(TokenError::BadSignature));
        // A truncated or missing signature.
        assert_eq!(signer().verify(&format!("{}.{}.", parts[0], parts[1]), now()), Err(TokenError::BadSignature));
        assert_eq!(signer().verify(&format!("{}.{}", parts[0], parts[1]), now()), Err(TokenError::Malformed));
        assert_eq!(signer().verify("not a token", now()), Err(TokenError::Malformed));
        assert_eq!(signer().verify(&format!("{token}.extra"), now()), Err(TokenError::Malformed));
    }

    #[test]
    fn unsigned_and_other_algorithm_headers_are_refused() {
        let (token, _) = signer().mint("t", "planner", "p", "agent", None, now());
        let parts: Vec<&str> = token.split('.').collect();
        let key_id = signer().key_id;
        for alg in ["none", "HS512", "RS256"] {
            let header = encode_json(&Header { alg: alg.to_string(), typ: "JWT".to_string(), kid: key_id.clone() });
            assert_eq!(signer().verify(&format!("{header}.{}.{}", parts[1], parts[2]), now()), Err(TokenError::Malformed), "{alg}");
            assert_eq!(signer().verify(&format!("{header}.{}.", parts[1]), now()), Err(TokenError::Malformed), "{alg}");
        }
    }

    #[test]
    fn tokens_claiming_a_future_issue_time_are_refused() {
        let (token, _) = signer().mint("t", "planner", "p", "agent", None, now() + chrono::Duration::seconds(600));
        assert_eq!(signer().verify(&token, now()), Err(TokenError::Malformed));
    }
}
