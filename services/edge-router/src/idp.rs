//! Identity-provider JWTs for the `/auth/*` bridge routes: a compact JWS signed with RS256, ES256 or
//! EdDSA by a key of the provider's JSON Web Key Set (fetched from `BR_IDP_JWKS_URL` or read from
//! `BR_IDP_JWKS_FILE`, kept ten minutes and read again at once for a key id it does not hold, at most
//! every 30 seconds), its issuer, audience and lifetime checked. No other algorithm is accepted.

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use brainstorm_common::ApiError;
use brainstorm_common::config::{IdpJwks, IdpSettings};
use ring::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey};
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::Mutex;

/// How long a key set is trusted before it is read again.
const KEYS_TTL: Duration = Duration::from_secs(600);
/// The least time between two reads of the key set forced by an unknown key id.
const MIN_REFRESH: Duration = Duration::from_secs(30);
/// Clock skew allowed on `exp`, `nbf` and `iat`.
const LEEWAY_SECONDS: i64 = 60;
/// Tokens larger than this are refused before any decoding.
const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// Why a token was refused (never echoes the token).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdpError {
    #[error("the token is not a compact JWS")]
    Malformed,
    #[error("the token's algorithm `{0}` is not accepted (RS256, ES256, EdDSA)")]
    Algorithm(String),
    #[error("no key of the identity provider matches the token")]
    UnknownKey,
    #[error("the token's signature does not verify")]
    BadSignature,
    #[error("the token was issued by `{0}`, not this gateway's identity provider")]
    Issuer(String),
    #[error("the token is not meant for this gateway (audience)")]
    Audience,
    #[error("the token has expired or is not valid yet")]
    Lifetime,
    #[error("the token names no subject")]
    Subject,
    #[error("the identity provider's keys cannot be read: {0}")]
    Keys(String),
}

impl From<IdpError> for ApiError {
    fn from(error: IdpError) -> Self {
        match error {
            IdpError::Keys(_) => ApiError::unavailable("identity_provider_unavailable", error.to_string()),
            _ => ApiError::unauthenticated("invalid_idp_token", error.to_string()),
        }
    }
}

/// Who a verified token names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdpIdentity {
    pub issuer: String,
    pub subject: String,
    pub email: String,
}

/// A public key of the set.
#[derive(Debug, Clone, PartialEq, Eq)]
enum PublicKey {
    Rsa {
        n: Vec<u8>,
        e: Vec<u8>,
    },
    /// The uncompressed point (`04 || x || y`).
    P256(Vec<u8>),
    Ed25519(Vec<u8>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Key {
    kid: Option<String>,
    key: PublicKey,
}

#[derive(Deserialize)]
struct JwkSet {
    keys: Vec<Value>,
}

fn field_bytes(jwk: &Value, name: &str) -> Option<Vec<u8>> {
    URL_SAFE_NO_PAD.decode(jwk.get(name)?.as_str()?).ok()
}

/// The usable signing keys of a JWKS document (keys of other types, curves or uses are skipped).
fn parse_keys(document: &[u8]) -> Result<Vec<Key>, IdpError> {
    let set: JwkSet = serde_json::from_slice(document).map_err(|error| IdpError::Keys(format!("not a JWKS: {error}")))?;
    let keys = set
        .keys
        .iter()
        .filter(|jwk| jwk.get("use").and_then(Value::as_str).is_none_or(|usage| usage == "sig"))
        .filter_map(|jwk| {
            let key = match (jwk.get("kty")?.as_str()?, jwk.get("crv").and_then(Value::as_str)) {
                ("RSA", _) => PublicKey::Rsa { n: field_bytes(jwk, "n")?, e: field_bytes(jwk, "e")? },
                ("EC", Some("P-256")) => {
                    let (x, y) = (field_bytes(jwk, "x")?, field_bytes(jwk, "y")?);
                    (x.len() == 32 && y.len() == 32).then(|| PublicKey::P256([&[4u8][..], &x, &y].concat()))?
                }
                ("OKP", Some("Ed25519")) => PublicKey::Ed25519(field_bytes(jwk, "x")?),
                _ => return None,
            };
            Some(Key { kid: jwk.get("kid").and_then(Value::as_str).map(str::to_string), key })
        })
        .collect();
    Ok(keys)
}

#[derive(Deserialize)]
struct Header {
    alg: String,
    kid: Option<String>,
}

#[derive(Deserialize)]
struct Claims {
    iss: Option<String>,
    sub: Option<String>,
    aud: Option<Value>,
    exp: Option<i64>,
    nbf: Option<i64>,
    email: Option<String>,
}

/// Checks a token's signature with `keys` and its claims at `now` (epoch seconds).
fn verify_with(keys: &[Key], settings: &IdpSettings, token: &str, now: i64) -> Result<IdpIdentity, IdpError> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err(IdpError::Malformed);
    }
    let mut parts = token.split('.');
    let (Some(header), Some(payload), Some(signature), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return Err(IdpError::Malformed);
    };
    let decode = |part: &str| URL_SAFE_NO_PAD.decode(part).map_err(|_| IdpError::Malformed);
    let header: Header = serde_json::from_slice(&decode(header)?).map_err(|_| IdpError::Malformed)?;
    let signature = decode(signature)?;
    let signed = &token.as_bytes()[..token.len() - token.rsplit('.').next().map_or(0, str::len) - 1];
    let fits = |key: &PublicKey| match (header.alg.as_str(), key) {
        ("RS256", PublicKey::Rsa { .. }) | ("ES256", PublicKey::P256(_)) | ("EdDSA", PublicKey::Ed25519(_)) => true,
        ("RS256" | "ES256" | "EdDSA", _) => false,
        _ => false,
    };
    if !matches!(header.alg.as_str(), "RS256" | "ES256" | "EdDSA") {
        return Err(IdpError::Algorithm(header.alg));
    }
    let candidates: Vec<&Key> = keys.iter().filter(|key| fits(&key.key) && (header.kid.is_none() || key.kid == header.kid)).collect();
    if candidates.is_empty() {
        return Err(IdpError::UnknownKey);
    }
    let verified = candidates.iter().any(|key| match &key.key {
        PublicKey::Rsa { n, e } => {
            RsaPublicKeyComponents { n, e }.verify(&signature::RSA_PKCS1_2048_8192_SHA256, signed, &signature).is_ok()
        }
        PublicKey::P256(point) => UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point).verify(signed, &signature).is_ok(),
        PublicKey::Ed25519(x) => UnparsedPublicKey::new(&signature::ED25519, x).verify(signed, &signature).is_ok(),
    });
    if !verified {
        return Err(IdpError::BadSignature);
    }
    let claims: Claims = serde_json::from_slice(&decode(payload)?).map_err(|_| IdpError::Malformed)?;
    let issuer = claims.iss.unwrap_or_default();
    if issuer != settings.issuer {
        return Err(IdpError::Issuer(issuer));
    }
    if let Some(audience) = &settings.audience {
        let named = match &claims.aud {
            Some(Value::String(aud)) => aud == audience,
            Some(Value::Array(auds)) => auds.iter().any(|aud| aud.as_str() == Some(audience)),
            _ => false,
        };
        if !named {
            return Err(IdpError::Audience);
        }
    }
    let expired = claims.exp.is_none_or(|exp| exp + LEEWAY_SECONDS <= now);
    if expired || claims.nbf.is_some_and(|nbf| nbf - LEEWAY_SECONDS > now) {
        return Err(IdpError::Lifetime);
    }
    let subject = claims.sub.filter(|sub| !sub.trim().is_empty()).ok_or(IdpError::Subject)?;
    Ok(IdpIdentity { issuer, subject, email: claims.email.unwrap_or_default() })
}

/// Verifies identity-provider tokens against the provider's current keys.
pub struct IdpVerifier {
    settings: IdpSettings,
    http: reqwest::Client,
    /// The keys and when they were read.
    keys: Mutex<Option<(Instant, Arc<Vec<Key>>)>>,
}

impl IdpVerifier {
    /// A verifier for the configured provider.
    pub fn new(settings: IdpSettings) -> Self {
        let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build().unwrap_or_default();
        IdpVerifier { settings, http, keys: Mutex::new(None) }
    }

    async fn read_keys(&self) -> Result<Vec<Key>, IdpError> {
        let document = match &self.settings.jwks {
            IdpJwks::File(path) => tokio::fs::read(path).await.map_err(|error| IdpError::Keys(format!("{}: {error}", path.display())))?,
            IdpJwks::Url(url) => {
                let response = self.http.get(url).send().await.map_err(|error| IdpError::Keys(error.to_string()))?;
                let response = response.error_for_status().map_err(|error| IdpError::Keys(error.to_string()))?;
                response.bytes().await.map_err(|error| IdpError::Keys(error.to_string()))?.to_vec()
            }
        };
        parse_keys(&document)
    }

    /// The keys, read again when older than their time to live or, when `stale_ok` is false, older
    /// than the least refresh interval.
    async fn keys(&self, force: bool) -> Result<Arc<Vec<Key>>, IdpError> {
        let mut cached = self.keys.lock().await;
        if let Some((read_at, keys)) = cached.as_ref() {
            let age = read_at.elapsed();
            if age < KEYS_TTL && (!force || age < MIN_REFRESH) {
                return Ok(keys.clone());
            }
        }
        match self.read_keys().await {
            Ok(keys) => {
                let keys = Arc::new(keys);
                *cached = Some((Instant::now(), keys.clone()));
                Ok(keys)
            }
            // A provider briefly unreachable: the keys last read still serve until twice their life.
            Err(error) => match cached.as_ref() {
                Some((read_at, keys)) if read_at.elapsed() < 2 * KEYS_TTL => Ok(keys.clone()),
                _ => Err(error),
            },
        }
    }

    /// The identity a bearer token names, verified.
    pub async fn verify(&self, token: &str) -> Result<IdpIdentity, IdpError> {
        let now = chrono::Utc::now().timestamp();
        let keys = self.keys(false).await?;
        match verify_with(&keys, &self.settings, token, now) {
            // A key id the cached set lacks: the provider may have rotated; read the set again once.
            Err(IdpError::UnknownKey) => verify_with(&self.keys(true).await?, &self.settings, token, now),
            verified => verified,
        }
    }
}

#[cfg(test)]
mod tests {
    use ring::rand::SystemRandom;
    use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, Ed25519KeyPair, KeyPair};
    use serde_json::json;

    use super::*;

    fn settings() -> IdpSettings {
        IdpSettings {
            issuer: "https://idp.example".to_string(),
            audience: Some("brainstorm".to_string()),
            jwks: IdpJwks::File("/dev/null".into()),
        }
    }

    fn encode(value: &Value) -> String {
        URL_SAFE_NO_PAD.encode(serde_json::to_vec(value).unwrap_or_default())
    }

    fn claims(now: i64) -> Value {
        json!({"iss": "https://idp.example", "sub": "user-1", "aud": ["brainstorm", "other"], "exp": now + 300, "email": "ada@example.com"})
    }

    fn signed(alg: &str, kid: &str, claims: &Value, sign: impl Fn(&[u8]) -> Vec<u8>) -> String {
        let signing_input = format!("{}.{}", encode(&json!({"alg": alg, "kid": kid, "typ": "JWT"})), encode(claims));
        format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(sign(signing_input.as_bytes())))
    }

    fn ed25519() -> Result<(Ed25519KeyPair, Value), Box<dyn std::error::Error>> {
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).map_err(|_| "keygen")?;
        let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).map_err(|_| "key")?;
        let jwk = json!({"kty": "OKP", "crv": "Ed25519", "kid": "ed", "x": URL_SAFE_NO_PAD.encode(pair.public_key().as_ref())});
        Ok((pair, jwk))
    }

    #[test]
    fn eddsa_and_es256_tokens_verify_and_every_claim_is_checked() -> Result<(), Box<dyn std::error::Error>> {
        let now = 1_800_000_000;
        let (ed, ed_jwk) = ed25519()?;
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).map_err(|_| "keygen")?;
        let ec = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).map_err(|_| "key")?;
        let point = ec.public_key().as_ref();
        let ec_jwk = json!({"kty": "EC", "crv": "P-256", "kid": "ec", "x": URL_SAFE_NO_PAD.encode(&point[1..33]), "y": URL_SAFE_NO_PAD.encode(&point[33..])});
        let keys = parse_keys(serde_json::to_vec(&json!({"keys": [ed_jwk, ec_jwk, {"kty": "oct", "k": "c2VjcmV0"}]}))?.as_slice())?;
        assert_eq!(keys.len(), 2, "symmetric keys are never accepted");
        let sign_ed = |input: &[u8]| ed.sign(input).as_ref().to_vec();
        let sign_ec = |input: &[u8]| ec.sign(&rng, input).map(|signature| signature.as_ref().to_vec()).unwrap_or_default();

        let identity = verify_with(&keys, &settings(), &signed("EdDSA", "ed", &claims(now), sign_ed), now)?;
        assert_eq!((identity.subject.as_str(), identity.email.as_str()), ("user-1", "ada@example.com"));
        assert!(verify_with(&keys, &settings(), &signed("ES256", "ec", &claims(now), sign_ec), now).is_ok());

        let refused = |token: String| verify_with(&keys, &settings(), &token, now).err();
        assert_eq!(refused(signed("ES256", "ed", &claims(now), sign_ed)), Some(IdpError::UnknownKey), "a key of another type");
        assert_eq!(refused(signed("HS256", "ed", &claims(now), sign_ed)), Some(IdpError::Algorithm("HS256".to_string())));
        assert_eq!(refused(signed("none", "ed", &claims(now), |_| Vec::new())), Some(IdpError::Algorithm("none".to_string())));
        assert_eq!(refused(signed("EdDSA", "rotated", &claims(now), sign_ed)), Some(IdpError::UnknownKey));
        let original = signed("EdDSA", "ed", &claims(now), sign_ed);
        let other =
            signed("EdDSA", "ed", &json!({"iss": "https://idp.example", "sub": "admin", "exp": now + 300, "aud": "brainstorm"}), sign_ed);
        let (other_input, _) = other.rsplit_once('.').ok_or("no signature")?;
        let (_, original_signature) = original.rsplit_once('.').ok_or("no signature")?;
        let forged = format!("{other_input}.{original_signature}");
        assert_eq!(refused(forged), Some(IdpError::BadSignature), "another token's signature");
        let with = |change: Value| {
            let mut changed = claims(now);
            for (name, value) in change.as_object().into_iter().flatten() {
                changed[name] = value.clone();
            }
            refused(signed("EdDSA", "ed", &changed, sign_ed))
        };
        assert_eq!(with(json!({"iss": "https://evil.example"})), Some(IdpError::Issuer("https://evil.example".to_string())));
        assert_eq!(with(json!({"aud": "someone-else"})), Some(IdpError::Audience));
        assert_eq!(with(json!({"exp": now - 61})), Some(IdpError::Lifetime));
        assert_eq!(with(json!({"exp": null})), Some(IdpError::Lifetime));
        assert_eq!(with(json!({"nbf": now + 120})), Some(IdpError::Lifetime));
        assert_eq!(with(json!({"sub": ""})), Some(IdpError::Subject));
        assert_eq!(with(json!({"exp": now - 30})), None, "within the leeway");
        assert_eq!(refused("a.b".to_string()), Some(IdpError::Malformed));
        Ok(())
    }

    #[test]
    fn rs256_tokens_verify_against_the_modulus_and_exponent() -> Result<(), Box<dyn std::error::Error>> {
        // A 2048-bit test key (PKCS#1 DER, made with `openssl genpkey`; it signs nothing else).
        let pair = ring::signature::RsaKeyPair::from_der(include_bytes!("idp_test_rsa.der")).map_err(|_| "key")?;
        let components: ring::rsa::PublicKeyComponents<Vec<u8>> = pair.public().into();
        let jwk = json!({"kty": "RSA", "kid": "rsa", "alg": "RS256", "use": "sig", "n": URL_SAFE_NO_PAD.encode(&components.n), "e": URL_SAFE_NO_PAD.encode(&components.e)});
        let keys = parse_keys(serde_json::to_vec(&json!({"keys": [jwk]}))?.as_slice())?;
        let rng = SystemRandom::new();
        let sign = |input: &[u8]| {
            let mut signature = vec![0; pair.public().modulus_len()];
            pair.sign(&signature::RSA_PKCS1_SHA256, &rng, input, &mut signature).map(|()| signature).unwrap_or_default()
        };
        let now = 1_800_000_000;
        let identity = verify_with(&keys, &settings(), &signed("RS256", "rsa", &claims(now), sign), now)?;
        assert_eq!(identity.subject, "user-1");
        let without_kid = {
            let input = format!("{}.{}", encode(&json!({"alg": "RS256"})), encode(&claims(now)));
            format!("{input}.{}", URL_SAFE_NO_PAD.encode(sign(input.as_bytes())))
        };
        assert!(verify_with(&keys, &settings(), &without_kid, now).is_ok(), "no kid: any key of the algorithm's type");
        Ok(())
    }
}
