//! The agent mesh: an agent calling through the gateway on another agent's behalf says so with the
//! `X-BR-Mesh-*` request headers. The gateway refuses a call that went round too many hops or whose
//! body is not the one its sender hashed, records the calling identity and the hop in the audit
//! record (the inventory's `mesh[]`), and answers with the headers the next hop sends on.

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use brainstorm_common::ApiError;
use sha2::{Digest, Sha256};

use crate::header_value;

/// The most hops a call may have taken before it reaches the gateway: a chain of agents calling
/// each other deeper than this is taken for a loop.
pub const MAX_HOPS: u32 = 16;

/// The longest `X-BR-Mesh-Source` kept (an agent id or a SPIFFE id).
const MAX_SOURCE_CHARS: usize = 256;

const SOURCE: HeaderName = HeaderName::from_static("x-br-mesh-source");
const TRACE_ID: HeaderName = HeaderName::from_static("x-br-mesh-trace-id");
const HOP_COUNT: HeaderName = HeaderName::from_static("x-br-mesh-hop-count");
const PAYLOAD_HASH: HeaderName = HeaderName::from_static("x-br-mesh-payload-hash");

/// One hop of a mesh call, as its request headers described it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeshHop {
    /// The identity that made the call (`X-BR-Mesh-Source`).
    pub source: String,
    /// The mesh's trace (`X-BR-Mesh-Trace-Id`), when the caller gave one.
    trace_id: Option<String>,
    /// Hops the call took before this one (`X-BR-Mesh-Hop-Count`, 0 when absent).
    hops_before: u32,
    /// SHA-256 of the body as received, lowercase hex.
    payload_hash: String,
}

impl MeshHop {
    /// The mesh hop a request's headers describe (None when it carries no `X-BR-Mesh-*` header),
    /// checked against its body. 400 for a malformed header, a hop past `MAX_HOPS`
    /// (`mesh_hop_limit`) or a body whose SHA-256 is not the `X-BR-Mesh-Payload-Hash` sent
    /// (`mesh_payload_mismatch`).
    pub fn read(headers: &HeaderMap, body: &[u8]) -> Result<Option<MeshHop>, ApiError> {
        let text = |name: &HeaderName| -> Result<Option<&str>, ApiError> {
            match headers.get(name) {
                None => Ok(None),
                Some(value) => value.to_str().map(|text| Some(text.trim())).map_err(|_| invalid(name, "must be visible ASCII")),
            }
        };
        let (source, trace_id, hop_count, payload_hash) = (text(&SOURCE)?, text(&TRACE_ID)?, text(&HOP_COUNT)?, text(&PAYLOAD_HASH)?);
        let Some(source) = source else {
            if [&trace_id, &hop_count, &payload_hash].into_iter().any(Option::is_some) {
                return Err(invalid(&SOURCE, "is required with the other X-BR-Mesh-* headers: name the identity that made the call"));
            }
            return Ok(None);
        };
        if source.is_empty() || source.chars().count() > MAX_SOURCE_CHARS {
            return Err(invalid(&SOURCE, &format!("must name the calling identity in 1 to {MAX_SOURCE_CHARS} characters")));
        }
        let trace_id = match trace_id {
            Some(id) if id.len() == 32 && id.bytes().all(|byte| byte.is_ascii_hexdigit()) && id.bytes().any(|byte| byte != b'0') => {
                Some(id.to_ascii_lowercase())
            }
            Some(_) => return Err(invalid(&TRACE_ID, "must be a W3C trace id: 32 hexadecimal digits, not all zero")),
            None => None,
        };
        let hops_before = match hop_count {
            Some(count) => count.parse::<u32>().map_err(|_| invalid(&HOP_COUNT, "must be a whole number of hops, 0 or more"))?,
            None => 0,
        };
        if hops_before >= MAX_HOPS {
            return Err(ApiError::invalid_request(
                "mesh_hop_limit",
                format!(
                    "the call already took {hops_before} hops through the mesh (at most {MAX_HOPS} are taken): agents may be calling each other in a loop"
                ),
            ));
        }
        let received = hex::encode(Sha256::digest(body));
        if let Some(sent) = payload_hash {
            let sent = sent.strip_prefix("sha256:").unwrap_or(sent);
            if sent.len() != 64 || !sent.bytes().all(|byte| byte.is_ascii_hexdigit()) {
                return Err(invalid(&PAYLOAD_HASH, "must be `sha256:` and the body's SHA-256 in 64 hexadecimal digits"));
            }
            if !sent.eq_ignore_ascii_case(&received) {
                return Err(ApiError::invalid_request(
                    "mesh_payload_mismatch",
                    format!("the body's SHA-256 is {received}, not the X-BR-Mesh-Payload-Hash sent: it changed on its way here"),
                ));
            }
        }
        Ok(Some(MeshHop { source: source.to_string(), trace_id, hops_before, payload_hash: received }))
    }

    /// The hop count with this hop: what the audit record keeps and the next hop sends on.
    pub fn hop_count(&self) -> u32 {
        self.hops_before + 1
    }

    /// The answer's mesh headers: the source, the mesh's trace (the request's own `trace_id` when
    /// the caller gave none), the hop count with this hop and the body's hash as received.
    pub fn headers(&self, trace_id: &str) -> Vec<(HeaderName, HeaderValue)> {
        let values = [
            (SOURCE, HeaderValue::from_str(&self.source).ok()),
            (TRACE_ID, HeaderValue::from_str(self.trace_id.as_deref().unwrap_or(trace_id)).ok()),
            (HOP_COUNT, header_value::shown(self.hop_count())),
            (PAYLOAD_HASH, header_value::formatted(format_args!("sha256:{}", self.payload_hash))),
        ];
        values.into_iter().filter_map(|(name, value)| Some((name, value?))).collect()
    }
}

fn invalid(name: &HeaderName, problem: &str) -> ApiError {
    ApiError::invalid_request("invalid_mesh_header", format!("{} {problem}", header_label(name)))
}

/// A mesh header's name as the documentation spells it.
fn header_label(name: &HeaderName) -> &'static str {
    match name.as_str() {
        "x-br-mesh-source" => "X-BR-Mesh-Source",
        "x-br-mesh-trace-id" => "X-BR-Mesh-Trace-Id",
        "x-br-mesh-hop-count" => "X-BR-Mesh-Hop-Count",
        _ => "X-BR-Mesh-Payload-Hash",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(HeaderName::from_static(name), HeaderValue::from_str(value).unwrap());
        }
        headers
    }

    fn code(result: Result<Option<MeshHop>, ApiError>) -> String {
        result.unwrap_err().code.clone().unwrap()
    }

    #[test]
    fn a_request_without_mesh_headers_took_no_mesh_hop() {
        assert_eq!(MeshHop::read(&HeaderMap::new(), b"{}").unwrap(), None);
        let orphan = headers(&[("x-br-mesh-hop-count", "2")]);
        assert_eq!(code(MeshHop::read(&orphan, b"{}")), "invalid_mesh_header");
    }

    #[test]
    fn a_hop_is_counted_hashed_and_answered_for_the_next_hop() {
        let body = br#"{"model":"m"}"#;
        let hash = hex::encode(Sha256::digest(body));
        let sent = headers(&[
            ("x-br-mesh-source", "spiffe://corp/agent/planner"),
            ("x-br-mesh-hop-count", "3"),
            ("x-br-mesh-payload-hash", &format!("sha256:{}", hash.to_uppercase())),
        ]);
        let hop = MeshHop::read(&sent, body).unwrap().unwrap();
        assert_eq!(hop.hop_count(), 4);
        let answer: Vec<(String, String)> = hop
            .headers("4bf92f3577b34da6a3ce929d0e0e4736")
            .into_iter()
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_string()))
            .collect();
        assert_eq!(
            answer,
            [
                ("x-br-mesh-source".to_string(), "spiffe://corp/agent/planner".to_string()),
                ("x-br-mesh-trace-id".to_string(), "4bf92f3577b34da6a3ce929d0e0e4736".to_string()),
                ("x-br-mesh-hop-count".to_string(), "4".to_string()),
                ("x-br-mesh-payload-hash".to_string(), format!("sha256:{hash}")),
            ]
        );
        // The mesh's own trace wins over the request's.
        let traced = headers(&[("x-br-mesh-source", "planner"), ("x-br-mesh-trace-id", "AAAABBBBCCCCDDDDEEEEFFFF00001111")]);
        let hop = MeshHop::read(&traced, body).unwrap().unwrap();
        assert_eq!(hop.hop_count(), 1);
        assert_eq!(hop.headers("4bf92f3577b34da6a3ce929d0e0e4736")[1].1, "aaaabbbbccccddddeeeeffff00001111");
    }

    #[test]
    fn a_changed_body_a_loop_and_malformed_headers_are_refused() {
        let other = hex::encode(Sha256::digest(b"another body"));
        let tampered = headers(&[("x-br-mesh-source", "planner"), ("x-br-mesh-payload-hash", &other)]);
        assert_eq!(code(MeshHop::read(&tampered, b"{}")), "mesh_payload_mismatch");
        let looping = headers(&[("x-br-mesh-source", "planner"), ("x-br-mesh-hop-count", &MAX_HOPS.to_string())]);
        assert_eq!(code(MeshHop::read(&looping, b"{}")), "mesh_hop_limit");
        let last = headers(&[("x-br-mesh-source", "planner"), ("x-br-mesh-hop-count", &(MAX_HOPS - 1).to_string())]);
        assert_eq!(MeshHop::read(&last, b"{}").unwrap().unwrap().hop_count(), MAX_HOPS);
        for bad in [
            headers(&[("x-br-mesh-source", "")]),
            headers(&[("x-br-mesh-source", &"a".repeat(MAX_SOURCE_CHARS + 1))]),
            headers(&[("x-br-mesh-source", "p"), ("x-br-mesh-hop-count", "-1")]),
            headers(&[("x-br-mesh-source", "p"), ("x-br-mesh-hop-count", "two")]),
            headers(&[("x-br-mesh-source", "p"), ("x-br-mesh-trace-id", "00000000000000000000000000000000")]),
            headers(&[("x-br-mesh-source", "p"), ("x-br-mesh-trace-id", "xyz")]),
            headers(&[("x-br-mesh-source", "p"), ("x-br-mesh-payload-hash", "sha256:abc")]),
        ] {
            assert_eq!(code(MeshHop::read(&bad, b"{}")), "invalid_mesh_header", "{bad:?}");
        }
    }
}
