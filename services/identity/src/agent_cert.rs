//! Agent client certificates: the gateway's agent CA, which issues short-lived X.509 certificates
//! for mutual TLS (`POST /v1/agent/auth/cert`) and verifies the ones agents present.
//!
//! The CA key is an Ed25519 key derived from the master key, and its certificate is built from
//! fixed fields, so every identity replica holds the same CA with nothing stored or shared; a new
//! master key is a new CA (as it is new agent JWTs). A certificate names its agent in two URI
//! subject alternative names: `spiffe://brainstorm/tenant/<tenant>/agent/<agent>` and
//! `urn:brainstorm:agent-profile:<profile id>` (a profile deleted and created again under the same
//! agent id is another, and the old certificates die with the old one, as its JWTs do).

use chrono::{DateTime, Duration, Utc};
use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
    KeyPair, KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, PKCS_ED25519, SanType, SerialNumber,
};
use rustls_pki_types::{CertificateSigningRequestDer, PrivatePkcs8KeyDer};
use sha2::{Digest, Sha256};
use x509_parser::prelude::{ASN1Time, FromDer, GeneralName, X509Certificate};

/// The trust domain of the SPIFFE ids the CA writes.
const TRUST_DOMAIN: &str = "brainstorm";
/// The URI prefix naming the profile a certificate was issued to.
const PROFILE_URN: &str = "urn:brainstorm:agent-profile:";
/// The CA certificate's common name.
const CA_NAME: &str = "Brainstorm agent CA";
/// A certificate's life when the request names none: one day.
pub const DEFAULT_LIFETIME_SECONDS: u32 = 24 * 3600;
/// The shortest and longest lives a request may ask for: five minutes and seven days.
pub const MIN_LIFETIME_SECONDS: u32 = 300;
pub const MAX_LIFETIME_SECONDS: u32 = 7 * 24 * 3600;
/// Backdating of `notBefore`, for clocks slightly behind this one.
const BACKDATE_SECONDS: i64 = 60;
/// CSRs and presented certificates larger than this are refused before parsing.
const MAX_INPUT_BYTES: usize = 16 * 1024;
/// The fixed prefix of an Ed25519 private key in PKCS#8 v1 DER (RFC 8410), before its 32-byte seed.
const ED25519_PKCS8_PREFIX: [u8; 16] = [0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20];

/// Why a certificate could not be issued or was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CertError {
    #[error("the CSR is not a PEM certificate signing request whose signature verifies: {0}")]
    BadCsr(String),
    #[error("the certificate is not one this gateway's agent CA issued")]
    NotIssuedHere,
    #[error("the certificate has expired or is not yet valid")]
    OutsideValidity,
    #[error("the certificate's life must be between {MIN_LIFETIME_SECONDS} and {MAX_LIFETIME_SECONDS} seconds")]
    BadLifetime,
    #[error("the agent CA could not sign: {0}")]
    Signing(String),
}

/// Who a certificate names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentSubject {
    pub tenant_id: String,
    pub agent_id: String,
    /// The profile's own id.
    pub profile_id: String,
}

/// The agent's key: its own (a CSR, proving it holds the key) or one the CA makes and hands over once.
pub enum RequestedKey<'a> {
    Csr(&'a str),
    Generate,
}

/// A certificate the CA issued.
#[derive(Debug, Clone)]
pub struct IssuedCertificate {
    pub certificate_pem: String,
    pub ca_certificate_pem: String,
    /// PKCS#8 PEM, only when the CA made the key.
    pub private_key_pem: Option<String>,
    /// Lowercase hex.
    pub serial: String,
    /// SHA-256 of the certificate's DER, lowercase hex.
    pub fingerprint_sha256: String,
    pub spiffe_id: String,
    pub not_before: DateTime<Utc>,
    pub not_after: DateTime<Utc>,
}

/// A presented certificate the CA vouches for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedCertificate {
    pub subject: AgentSubject,
    pub serial: String,
    pub not_after: DateTime<Utc>,
}

/// The agent CA: issues and verifies agent certificates.
pub struct AgentCertificateAuthority {
    issuer: Issuer<'static, KeyPair>,
    certificate_der: Vec<u8>,
    certificate_pem: String,
}

impl std::fmt::Debug for AgentCertificateAuthority {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("AgentCertificateAuthority").finish_non_exhaustive()
    }
}

impl AgentCertificateAuthority {
    /// The CA whose key is derived from `seed` (the master key's agent-CA secret).
    pub fn from_seed(seed: [u8; 32]) -> Result<Self, CertError> {
        let mut pkcs8 = ED25519_PKCS8_PREFIX.to_vec();
        pkcs8.extend_from_slice(&seed);
        let key = KeyPair::from_pkcs8_der_and_sign_algo(&PrivatePkcs8KeyDer::from(pkcs8), &PKCS_ED25519).map_err(signing)?;
        let mut params = CertificateParams::default();
        params.distinguished_name = distinguished_name(CA_NAME, "Brainstorm");
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        // Fixed fields (and Ed25519's deterministic signatures) make every replica's CA certificate the same bytes.
        params.not_before = rcgen::date_time_ymd(2025, 1, 1);
        params.not_after = rcgen::date_time_ymd(2125, 1, 1);
        params.serial_number = Some(SerialNumber::from_slice(&Sha256::digest(key.public_key_raw())[..16]));
        let certificate = params.self_signed(&key).map_err(signing)?;
        Ok(AgentCertificateAuthority {
            certificate_der: certificate.der().to_vec(),
            certificate_pem: certificate.pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// The CA certificate (PEM), for relying parties that verify agent certificates themselves.
    pub fn certificate_pem(&self) -> &str {
        &self.certificate_pem
    }

    /// A client certificate for `subject`, valid from a minute ago for `lifetime_seconds`.
    pub fn issue(
        &self,
        subject: &AgentSubject,
        key: RequestedKey<'_>,
        lifetime_seconds: u32,
        now: DateTime<Utc>,
    ) -> Result<IssuedCertificate, CertError> {
        if !(MIN_LIFETIME_SECONDS..=MAX_LIFETIME_SECONDS).contains(&lifetime_seconds) {
            return Err(CertError::BadLifetime);
        }
        // X.509 times are whole seconds: the answer names the very instants the certificate holds.
        let now = DateTime::from_timestamp(now.timestamp(), 0).unwrap_or(now);
        let not_before = now - Duration::seconds(BACKDATE_SECONDS);
        let not_after = now + Duration::seconds(i64::from(lifetime_seconds));
        let spiffe_id = spiffe_id(subject);
        let mut params = CertificateParams::default();
        params.distinguished_name = distinguished_name(&subject.agent_id, &subject.tenant_id);
        params.subject_alt_names = vec![
            SanType::URI(spiffe_id.clone().try_into().map_err(signing)?),
            SanType::URI(format!("{PROFILE_URN}{}", encode(&subject.profile_id)).try_into().map_err(signing)?),
        ];
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.use_authority_key_identifier_extension = true;
        params.not_before = offset_time(not_before)?;
        params.not_after = offset_time(not_after)?;
        // Positive and 16 bytes: RFC 5280 wants serials positive and unpredictable.
        let mut serial: [u8; 16] = rand::random();
        serial[0] &= 0x7f;
        serial[0] |= 0x01;
        params.serial_number = Some(SerialNumber::from_slice(&serial));
        let (certificate, private_key_pem) = match key {
            RequestedKey::Csr(pem) => {
                let csr = parse_csr(pem)?;
                (params.signed_by(&csr.public_key, &self.issuer).map_err(signing)?, None)
            }
            RequestedKey::Generate => {
                let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(signing)?;
                (params.signed_by(&key, &self.issuer).map_err(signing)?, Some(key.serialize_pem()))
            }
        };
        Ok(IssuedCertificate {
            fingerprint_sha256: hex::encode(Sha256::digest(certificate.der())),
            certificate_pem: certificate.pem(),
            ca_certificate_pem: self.certificate_pem.clone(),
            private_key_pem,
            serial: hex::encode(serial),
            spiffe_id,
            not_before,
            not_after,
        })
    }

    /// The agent a presented certificate (DER) names, when this CA signed it, it is valid at `now`
    /// and it is meant for client authentication.
    pub fn verify(&self, der: &[u8], now: DateTime<Utc>) -> Result<VerifiedCertificate, CertError> {
        if der.len() > MAX_INPUT_BYTES {
            return Err(CertError::NotIssuedHere);
        }
        let (_, ca) = X509Certificate::from_der(&self.certificate_der).map_err(|_| CertError::NotIssuedHere)?;
        let (rest, certificate) = X509Certificate::from_der(der).map_err(|_| CertError::NotIssuedHere)?;
        if !rest.is_empty() || certificate.verify_signature(Some(ca.public_key())).is_err() {
            return Err(CertError::NotIssuedHere);
        }
        let at = ASN1Time::from_timestamp(now.timestamp()).map_err(|_| CertError::OutsideValidity)?;
        if !certificate.validity().is_valid_at(at) {
            return Err(CertError::OutsideValidity);
        }
        let for_clients = certificate.extended_key_usage().ok().flatten().is_some_and(|usage| usage.value.client_auth || usage.value.any);
        if !for_clients {
            return Err(CertError::NotIssuedHere);
        }
        let names = certificate.subject_alternative_name().ok().flatten().ok_or(CertError::NotIssuedHere)?;
        let uris: Vec<&str> = names
            .value
            .general_names
            .iter()
            .filter_map(|name| match name {
                GeneralName::URI(uri) => Some(*uri),
                _ => None,
            })
            .collect();
        let subject = uris.iter().find_map(|uri| parse_spiffe_id(uri)).ok_or(CertError::NotIssuedHere)?;
        let profile_id = uris.iter().find_map(|uri| uri.strip_prefix(PROFILE_URN).and_then(decode)).ok_or(CertError::NotIssuedHere)?;
        let not_after = DateTime::from_timestamp(certificate.validity().not_after.timestamp(), 0).ok_or(CertError::NotIssuedHere)?;
        Ok(VerifiedCertificate {
            subject: AgentSubject { tenant_id: subject.0, agent_id: subject.1, profile_id },
            serial: hex::encode(certificate.tbs_certificate.raw_serial()),
            not_after,
        })
    }
}

/// A PEM CSR whose signature verifies (the requester holds the key it names).
fn parse_csr(pem: &str) -> Result<CertificateSigningRequestParams, CertError> {
    if pem.len() > MAX_INPUT_BYTES {
        return Err(CertError::BadCsr(format!("it is larger than {MAX_INPUT_BYTES} bytes")));
    }
    let block = pem::parse(pem.trim()).map_err(|_| CertError::BadCsr("it is not PEM".to_string()))?;
    if block.tag() != "CERTIFICATE REQUEST" && block.tag() != "NEW CERTIFICATE REQUEST" {
        return Err(CertError::BadCsr(format!("its PEM block is `{}`, not `CERTIFICATE REQUEST`", block.tag())));
    }
    CertificateSigningRequestParams::from_der(&CertificateSigningRequestDer::from(block.contents())).map_err(|error| {
        CertError::BadCsr(match error {
            rcgen::Error::InvalidCertificationRequestSignature => "its signature does not verify".to_string(),
            rcgen::Error::UnsupportedExtension => {
                "it requests an extension the gateway does not read (send only a subject and names)".to_string()
            }
            rcgen::Error::UnsupportedSignatureAlgorithm => {
                "its key type is not supported (use ECDSA P-256 or P-384, Ed25519 or RSA)".to_string()
            }
            other => other.to_string(),
        })
    })
}

/// `spiffe://brainstorm/tenant/<tenant>/agent/<agent>`, each id percent-encoded.
fn spiffe_id(subject: &AgentSubject) -> String {
    format!("spiffe://{TRUST_DOMAIN}/tenant/{}/agent/{}", encode(&subject.tenant_id), encode(&subject.agent_id))
}

/// The (tenant, agent) a SPIFFE id of this trust domain names.
fn parse_spiffe_id(uri: &str) -> Option<(String, String)> {
    let path = uri.strip_prefix("spiffe://")?.strip_prefix(TRUST_DOMAIN)?.strip_prefix("/tenant/")?;
    let (tenant, agent) = path.split_once("/agent/")?;
    Some((decode(tenant)?, decode(agent)?))
}

/// Percent-encodes all but RFC 3986's unreserved characters.
fn encode(text: &str) -> String {
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            encoded.push(char::from(byte));
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

/// The inverse of `encode`; `None` for anything `encode` would not write.
fn decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        match bytes[index] {
            b'%' => {
                let hex = text.get(index + 1..index + 3)?;
                decoded.push(u8::from_str_radix(hex, 16).ok()?);
                index += 3;
            }
            byte if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') => {
                decoded.push(byte);
                index += 1;
            }
            _ => return None,
        }
    }
    String::from_utf8(decoded).ok().filter(|text| !text.is_empty())
}

fn distinguished_name(common_name: &str, organization: &str) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    name.push(DnType::OrganizationName, organization);
    name
}

fn offset_time(time: DateTime<Utc>) -> Result<time::OffsetDateTime, CertError> {
    time::OffsetDateTime::from_unix_timestamp(time.timestamp()).map_err(signing)
}

fn signing(error: impl std::fmt::Display) -> CertError {
    CertError::Signing(error.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subject() -> AgentSubject {
        AgentSubject { tenant_id: "t-1".to_string(), agent_id: "planner/eu west".to_string(), profile_id: "p-9".to_string() }
    }

    fn der_of(pem: &str) -> Vec<u8> {
        pem::parse(pem).unwrap().contents().to_vec()
    }

    fn csr() -> (String, KeyPair) {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        let csr = CertificateParams::new(vec!["ignored.example".to_string()]).unwrap().serialize_request(&key).unwrap();
        (csr.pem().unwrap(), key)
    }

    #[test]
    fn the_ca_is_the_same_on_every_replica_and_another_seed_is_another_ca() {
        let one = AgentCertificateAuthority::from_seed([3; 32]).unwrap();
        let two = AgentCertificateAuthority::from_seed([3; 32]).unwrap();
        let other = AgentCertificateAuthority::from_seed([4; 32]).unwrap();
        assert_eq!(one.certificate_pem(), two.certificate_pem());
        assert_ne!(one.certificate_pem(), other.certificate_pem());
        // One replica's certificate verifies on another, not under another master key.
        let now = Utc::now();
        let issued = one.issue(&subject(), RequestedKey::Generate, DEFAULT_LIFETIME_SECONDS, now).unwrap();
        let der = der_of(&issued.certificate_pem);
        assert_eq!(two.verify(&der, now).unwrap().subject, subject());
        assert_eq!(other.verify(&der, now), Err(CertError::NotIssuedHere));
    }

    #[test]
    fn a_csr_certificate_carries_the_requesters_key_and_names_the_agent() {
        let ca = AgentCertificateAuthority::from_seed([5; 32]).unwrap();
        let (csr, key) = csr();
        let now = Utc::now();
        let issued = ca.issue(&subject(), RequestedKey::Csr(&csr), 3600, now).unwrap();
        assert!(issued.private_key_pem.is_none(), "a CSR's key stays with the agent");
        assert_eq!(issued.spiffe_id, "spiffe://brainstorm/tenant/t-1/agent/planner%2Feu%20west");
        let der = der_of(&issued.certificate_pem);
        let (_, parsed) = X509Certificate::from_der(&der).unwrap();
        assert_eq!(parsed.public_key().raw, rcgen::PublicKeyData::subject_public_key_info(&key).as_slice());
        assert_eq!(hex::encode(Sha256::digest(&der)), issued.fingerprint_sha256);
        let verified = ca.verify(&der, now).unwrap();
        assert_eq!(verified.subject, subject());
        assert_eq!(verified.serial, issued.serial);
        assert_eq!(verified.not_after.timestamp(), (now + Duration::seconds(3600)).timestamp());
    }

    #[test]
    fn certificates_outside_their_life_are_refused() {
        let ca = AgentCertificateAuthority::from_seed([5; 32]).unwrap();
        let now = Utc::now();
        let issued = ca.issue(&subject(), RequestedKey::Generate, MIN_LIFETIME_SECONDS, now).unwrap();
        let der = der_of(&issued.certificate_pem);
        assert!(ca.verify(&der, now + Duration::seconds(i64::from(MIN_LIFETIME_SECONDS) - 5)).is_ok());
        assert_eq!(ca.verify(&der, now + Duration::seconds(i64::from(MIN_LIFETIME_SECONDS) + 5)), Err(CertError::OutsideValidity));
        assert_eq!(ca.verify(&der, now - Duration::seconds(120)), Err(CertError::OutsideValidity));
        for lifetime in [MIN_LIFETIME_SECONDS - 1, MAX_LIFETIME_SECONDS + 1] {
            assert_eq!(ca.issue(&subject(), RequestedKey::Generate, lifetime, now).err(), Some(CertError::BadLifetime));
        }
    }

    #[test]
    fn forged_tampered_and_foreign_certificates_are_refused() {
        let ca = AgentCertificateAuthority::from_seed([5; 32]).unwrap();
        let now = Utc::now();
        // A self-signed certificate claiming the same names.
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = CertificateParams::default();
        params.subject_alt_names =
            vec![SanType::URI(spiffe_id(&subject()).try_into().unwrap()), SanType::URI(format!("{PROFILE_URN}p-9").try_into().unwrap())];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let forged = params.self_signed(&key).unwrap();
        assert_eq!(ca.verify(forged.der(), now), Err(CertError::NotIssuedHere));
        // One byte of a real one changed.
        let issued = ca.issue(&subject(), RequestedKey::Generate, 3600, now).unwrap();
        let mut der = der_of(&issued.certificate_pem);
        let middle = der.len() / 2;
        der[middle] ^= 0x01;
        assert!(ca.verify(&der, now).is_err());
        assert_eq!(ca.verify(b"not a certificate", now), Err(CertError::NotIssuedHere));
        // The CA's own certificate is not a client's.
        assert_eq!(ca.verify(&der_of(ca.certificate_pem()), now), Err(CertError::NotIssuedHere));
    }

    #[test]
    fn bad_csrs_are_named() {
        let ca = AgentCertificateAuthority::from_seed([5; 32]).unwrap();
        let now = Utc::now();
        let refuse = |csr: &str| match ca.issue(&subject(), RequestedKey::Csr(csr), 3600, now) {
            Err(CertError::BadCsr(reason)) => reason,
            other => panic!("expected a CSR refusal, got {other:?}"),
        };
        assert!(refuse("hello").contains("not PEM"));
        let issued = ca.issue(&subject(), RequestedKey::Generate, 3600, now).unwrap();
        assert!(refuse(&issued.certificate_pem).contains("`CERTIFICATE`"));
        // A CSR whose signed part was altered: its signature no longer verifies.
        let (csr, _) = csr();
        let mut der = der_of(&csr);
        let last = der.len() - 1;
        der[last] ^= 0x01;
        let altered = pem::encode(&pem::Pem::new("CERTIFICATE REQUEST", der));
        assert!(refuse(&altered).contains("signature") || refuse(&altered).contains("parse"), "{}", refuse(&altered));
    }

    #[test]
    fn ids_survive_encoding_and_only_encoded_text_decodes() {
        for id in ["simple", "with space/and:colon", "ünï", "a%b"] {
            assert_eq!(decode(&encode(id)).as_deref(), Some(id));
        }
        assert_eq!(decode("a b"), None);
        assert_eq!(decode("%G0"), None);
        assert_eq!(decode(""), None);
        assert_eq!(parse_spiffe_id("spiffe://other/tenant/t/agent/a"), None);
        assert_eq!(parse_spiffe_id("spiffe://brainstorm/tenant/t/agent/a"), Some(("t".to_string(), "a".to_string())));
    }
}
