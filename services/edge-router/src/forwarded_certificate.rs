//! Agent client certificates forwarded by a trusted TLS-terminating proxy (an ingress controller or
//! a mesh sidecar that did the handshake, so the client proved it holds the key there): the
//! header named by `BR_CLIENT_CERT_HEADER` is read only on connections from
//! `BR_CLIENT_CERT_TRUSTED_PROXIES` and becomes the request's `ClientCertificate`, which identity
//! then judges exactly as one presented to the edge's own TLS listener. From any other peer the
//! header is ignored: there it is an assertion anyone could write.
//!
//! Formats: `x-forwarded-client-cert` is read as Envoy's (and Istio's) element list, taking the
//! `Cert` of the last element, the one the nearest proxy wrote; any other header holds the leaf as
//! percent-encoded PEM (ingress-nginx's `ssl-client-cert`, nginx's `$ssl_client_escaped_cert`) or
//! as base64 DER (Traefik's `X-Forwarded-Tls-Client-Cert`, HAProxy's `ssl_c_der,base64`), of
//! which the first is the leaf when a chain is sent comma-separated.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use base64::Engine;
use brainstorm_common::config::ForwardedClientCertificates;
use brainstorm_common::net::AddressRange;

use crate::auth::ClientCertificate;

/// Envoy's header, whose value is a list of elements rather than a certificate.
const ENVOY_HEADER: &str = "x-forwarded-client-cert";

/// Where forwarded certificates are read and whom they are taken from.
#[derive(Debug)]
pub struct CertificateForwarding {
    header: String,
    /// Whether `header` is Envoy's list of elements rather than one certificate.
    envoy: bool,
    trusted: Vec<AddressRange>,
}

/// Why a trusted proxy's header did not yield a certificate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ForwardedCertificateError {
    #[error("the header is not visible ASCII")]
    NotText,
    #[error(
        "the x-forwarded-client-cert element has no Cert (Envoy forwards the certificate itself only with set_current_client_cert_details.cert: true)"
    )]
    NoCertField,
    #[error("the x-forwarded-client-cert value is malformed: {0}")]
    MalformedEnvoyValue(&'static str),
    #[error("the value has an invalid percent-escape")]
    InvalidEscape,
    #[error("the value is neither PEM nor base64 DER of one certificate")]
    NotACertificate,
    #[error("the header came more than once")]
    SeveralValues,
}

impl CertificateForwarding {
    /// Forwarding as configured.
    pub fn new(settings: &ForwardedClientCertificates) -> Self {
        CertificateForwarding {
            header: settings.header.clone(),
            envoy: settings.header == ENVOY_HEADER,
            trusted: settings.trusted_proxies.clone(),
        }
    }

    /// Whether connections from `peer` may forward certificates.
    pub fn trusts(&self, peer: IpAddr) -> bool {
        self.trusted.iter().any(|range| range.contains(peer))
    }

    /// The DER of the certificate the header forwards: None when the header is absent or empty
    /// (the client presented none).
    pub fn certificate(&self, headers: &http::HeaderMap) -> Result<Option<Vec<u8>>, ForwardedCertificateError> {
        let mut values = headers.get_all(self.header.as_str()).iter();
        // Several lines of Envoy's list are one list, of which the nearest proxy wrote the end; any
        // other header holds one certificate, so a second line (a client's, kept by a proxy that
        // added its own) is ambiguous.
        let value = if self.envoy {
            values.next_back()
        } else {
            let first = values.next();
            if values.next().is_some() {
                return Err(ForwardedCertificateError::SeveralValues);
            }
            first
        };
        let Some(value) = value else { return Ok(None) };
        let value = value.to_str().map_err(|_| ForwardedCertificateError::NotText)?.trim();
        if value.is_empty() {
            return Ok(None);
        }
        let encoded = if self.envoy { envoy_certificate(value)? } else { value.to_string() };
        decode_certificate(&encoded).map(Some)
    }
}

/// Middleware: a trusted proxy's forwarded certificate replaces whatever the connection presented
/// (a re-encrypting proxy's own certificate); from other peers, or without a peer address, the
/// header is ignored.
pub async fn apply(State(forwarding): State<Arc<CertificateForwarding>>, mut request: Request, next: Next) -> Response {
    let peer = request.extensions().get::<ConnectInfo<SocketAddr>>().map(|ConnectInfo(address)| address.ip());
    match peer {
        Some(peer) if forwarding.trusts(peer) => match forwarding.certificate(request.headers()) {
            Ok(Some(der)) => {
                request.extensions_mut().insert(ClientCertificate(Arc::from(der)));
            }
            Ok(None) => {}
            Err(error) => {
                tracing::warn!(%error, %peer, header = %forwarding.header, "a trusted proxy forwarded a client certificate that cannot be read: ignored");
            }
        },
        _ if request.headers().contains_key(forwarding.header.as_str()) => {
            tracing::debug!(peer = ?peer, header = %forwarding.header, "a forwarded client certificate from an untrusted peer: ignored");
        }
        _ => {}
    }
    next.run(request).await
}

/// The `Cert` of the last element of an `x-forwarded-client-cert` value: elements are separated by
/// commas, their `key=value` pairs by semicolons, and a value may be double-quoted (with `\"` and
/// `\\` escapes), so separators inside quotes do not count.
fn envoy_certificate(value: &str) -> Result<String, ForwardedCertificateError> {
    // The pairs of the element being read: a comma starts the next, so the last one read is the last.
    let mut pairs = Vec::new();
    let mut pair = String::new();
    let mut quoted = false;
    let mut characters = value.chars();
    while let Some(character) = characters.next() {
        match character {
            '\\' if quoted => match characters.next() {
                Some(escaped) => pair.push(escaped),
                None => return Err(ForwardedCertificateError::MalformedEnvoyValue("an escape at the end")),
            },
            '"' => quoted = !quoted,
            ';' if !quoted => pairs.push(std::mem::take(&mut pair)),
            ',' if !quoted => {
                pairs.clear();
                pair.clear();
            }
            other => pair.push(other),
        }
    }
    if quoted {
        return Err(ForwardedCertificateError::MalformedEnvoyValue("an unclosed quote"));
    }
    pairs.push(pair);
    let mut certificate = None;
    for pair in pairs.iter().map(|pair| pair.trim()).filter(|pair| !pair.is_empty()) {
        let (key, value) = pair.split_once('=').ok_or(ForwardedCertificateError::MalformedEnvoyValue("a field without `=`"))?;
        if key.trim().eq_ignore_ascii_case("cert") {
            certificate = Some(value.trim().to_string());
        }
    }
    certificate.filter(|certificate| !certificate.is_empty()).ok_or(ForwardedCertificateError::NoCertField)
}

/// One certificate's DER from percent-encoded (or plain) PEM, or from base64 DER; of a chain, the
/// first certificate.
fn decode_certificate(encoded: &str) -> Result<Vec<u8>, ForwardedCertificateError> {
    let text = percent_decode(encoded)?;
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let body = match text.find(BEGIN) {
        Some(start) => {
            let rest = &text[start + BEGIN.len()..];
            &rest[..rest.find(END).ok_or(ForwardedCertificateError::NotACertificate)?]
        }
        None => text.split(',').next().unwrap_or_default(),
    };
    let base64: String = body.chars().filter(|character| !character.is_ascii_whitespace()).collect();
    let der = base64::engine::general_purpose::STANDARD.decode(base64).map_err(|_| ForwardedCertificateError::NotACertificate)?;
    // Every certificate is a DER SEQUENCE; identity reads the rest.
    if der.first() != Some(&0x30) {
        return Err(ForwardedCertificateError::NotACertificate);
    }
    Ok(der)
}

/// `%XX` escapes decoded (`+` stays `+`: base64 uses it).
fn percent_decode(text: &str) -> Result<String, ForwardedCertificateError> {
    if !text.contains('%') {
        return Ok(text.to_string());
    }
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%' {
            let hex = bytes.get(index + 1..index + 3).ok_or(ForwardedCertificateError::InvalidEscape)?;
            let hex = std::str::from_utf8(hex).map_err(|_| ForwardedCertificateError::InvalidEscape)?;
            decoded.push(u8::from_str_radix(hex, 16).map_err(|_| ForwardedCertificateError::InvalidEscape)?);
            index += 3;
        } else {
            decoded.push(bytes[index]);
            index += 1;
        }
    }
    String::from_utf8(decoded).map_err(|_| ForwardedCertificateError::InvalidEscape)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A DER SEQUENCE standing for a certificate (identity, not this module, parses certificates).
    const DER: &[u8] = &[0x30, 0x03, 0x02, 0x01, 0x07];

    fn base64(der: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(der)
    }

    fn pem(der: &[u8]) -> String {
        format!("-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n", base64(der))
    }

    /// Percent-encoded as nginx's `$ssl_client_escaped_cert` and Envoy's `Cert` are.
    fn escaped(text: &str) -> String {
        text.bytes()
            .map(
                |byte| {
                    if byte.is_ascii_alphanumeric() || b"-_.~".contains(&byte) {
                        (byte as char).to_string()
                    } else {
                        format!("%{byte:02X}")
                    }
                },
            )
            .collect()
    }

    fn forwarding(header: &str) -> CertificateForwarding {
        let settings = ForwardedClientCertificates {
            header: header.to_string(),
            trusted_proxies: vec!["10.0.0.0/8".parse().expect("range"), "::1".parse().expect("range")],
        };
        CertificateForwarding::new(&settings)
    }

    fn read(header: &str, value: &str) -> Result<Option<Vec<u8>>, ForwardedCertificateError> {
        let mut headers = http::HeaderMap::new();
        headers.insert(http::HeaderName::from_bytes(header.as_bytes()).expect("name"), value.parse().expect("value"));
        forwarding(header).certificate(&headers)
    }

    #[test]
    fn only_the_configured_proxies_are_trusted() {
        let forwarding = forwarding("ssl-client-cert");
        assert!(forwarding.trusts("10.1.2.3".parse().expect("address")));
        assert!(forwarding.trusts("::1".parse().expect("address")));
        assert!(forwarding.trusts("::ffff:10.0.0.9".parse().expect("address")), "a dual-stack listener's IPv4 peer");
        assert!(!forwarding.trusts("127.0.0.1".parse().expect("address")));
        assert!(!forwarding.trusts("192.168.1.1".parse().expect("address")));
    }

    #[test]
    fn nginx_traefik_and_haproxy_forms_are_read() {
        assert_eq!(read("ssl-client-cert", &escaped(&pem(DER))), Ok(Some(DER.to_vec())), "ingress-nginx: percent-encoded PEM");
        assert_eq!(read("ssl-client-cert", &pem(DER).replace('\n', " ")), Ok(Some(DER.to_vec())), "unescaped PEM on one line");
        assert_eq!(read("x-forwarded-tls-client-cert", &base64(DER)), Ok(Some(DER.to_vec())), "Traefik and HAProxy: base64 DER");
        let chain = format!("{},{}", base64(DER), base64(&[0x30, 0x00]));
        assert_eq!(read("x-forwarded-tls-client-cert", &chain), Ok(Some(DER.to_vec())), "the leaf of a chain");
        assert_eq!(read("ssl-client-cert", " "), Ok(None), "empty: no certificate");
        assert_eq!(forwarding("ssl-client-cert").certificate(&http::HeaderMap::new()), Ok(None));
    }

    #[test]
    fn envoy_elements_are_read_from_the_nearest_proxy() {
        let cert = escaped(&pem(DER));
        let value =
            format!("By=spiffe://cluster.local/ns/ai/sa/edge;Hash=abc;Cert=\"{cert}\";Subject=\"CN=scout,O=Tenant; Inc\";URI=spiffe://x");
        assert_eq!(read(ENVOY_HEADER, &value), Ok(Some(DER.to_vec())));
        // Appended by two proxies: the last element is the nearest's.
        let other = escaped(&pem(&[0x30, 0x00]));
        let appended = format!("Cert={other};Subject=\"a,b\",Hash=x;Cert={cert}");
        assert_eq!(read(ENVOY_HEADER, &appended), Ok(Some(DER.to_vec())));
        let escaped_quote = format!("Subject=\"CN=\\\"q\\\",O=x\";Cert=\"{cert}\"");
        assert_eq!(read(ENVOY_HEADER, &escaped_quote), Ok(Some(DER.to_vec())));
    }

    #[test]
    fn a_header_sent_twice_is_read_as_its_format_says() {
        let cert = escaped(&pem(DER));
        let mut headers = http::HeaderMap::new();
        headers.append(ENVOY_HEADER, "Cert=forged".parse().expect("value"));
        headers.append(ENVOY_HEADER, format!("Hash=1;Cert={cert}").parse().expect("value"));
        assert_eq!(forwarding(ENVOY_HEADER).certificate(&headers), Ok(Some(DER.to_vec())), "the last line is the nearest proxy's");
        let mut headers = http::HeaderMap::new();
        headers.append("ssl-client-cert", cert.parse().expect("value"));
        headers.append("ssl-client-cert", cert.parse().expect("value"));
        assert_eq!(forwarding("ssl-client-cert").certificate(&headers), Err(ForwardedCertificateError::SeveralValues));
    }

    #[test]
    fn unreadable_values_are_named() {
        assert_eq!(read(ENVOY_HEADER, "Hash=abc;Subject=\"CN=scout\""), Err(ForwardedCertificateError::NoCertField));
        assert_eq!(read(ENVOY_HEADER, "Cert=\"abc"), Err(ForwardedCertificateError::MalformedEnvoyValue("an unclosed quote")));
        assert_eq!(read(ENVOY_HEADER, "Cert"), Err(ForwardedCertificateError::MalformedEnvoyValue("a field without `=`")));
        assert_eq!(read(ENVOY_HEADER, "Cert=;Hash=1"), Err(ForwardedCertificateError::NoCertField));
        assert_eq!(read("ssl-client-cert", "%2"), Err(ForwardedCertificateError::InvalidEscape));
        assert_eq!(read("ssl-client-cert", "%zz"), Err(ForwardedCertificateError::InvalidEscape));
        assert_eq!(read("ssl-client-cert", "not base64!"), Err(ForwardedCertificateError::NotACertificate));
        assert_eq!(read("ssl-client-cert", &base64(b"plain text")), Err(ForwardedCertificateError::NotACertificate));
        assert_eq!(read("ssl-client-cert", "-----BEGIN CERTIFICATE-----MDAw"), Err(ForwardedCertificateError::NotACertificate));
    }
}
