//! Destination types: which config members each requires, which are secret, and the HTTP request a
//! batch of events becomes for each.
//!
//! Observability: `webhook` and `custom` (`{events: [...]}`, an HMAC-SHA256 `X-BR-Signature` with a
//! `secret`), `otlp` (OTLP/HTTP JSON logs), `datadog` (the logs intake), `splunk` (an HTTP Event
//! Collector), `posthog` (the batch capture API) and `s3` (one JSON-lines object per batch, signed
//! with AWS Signature Version 4). XDR connectors send OCSF 1.3.0: `splunk` (HEC), `sentinel` (the
//! Log Analytics data collector, SharedKey-signed), `elastic` (the bulk API), `crowdstrike` (Falcon
//! LogScale / Next-Gen SIEM HEC ingest) and `sumo_logic` (an HTTP source).

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use crate::events::{Event, ocsf};

/// Observability destination types.
pub const OBSERVABILITY_TYPES: [&str; 7] = ["webhook", "otlp", "s3", "custom", "datadog", "splunk", "posthog"];
/// XDR connector types.
pub const XDR_TYPES: [&str; 5] = ["splunk", "sentinel", "elastic", "crowdstrike", "sumo_logic"];
/// Config members that are secret whatever the type (camelCase and snake_case): sealed at rest,
/// never returned.
pub const SECRET_MEMBERS: [&str; 14] = [
    "apiKey",
    "api_key",
    "clientSecret",
    "client_secret",
    "hecToken",
    "hec_token",
    "workspaceKey",
    "workspace_key",
    "secretAccessKey",
    "secret_access_key",
    "secret",
    "token",
    "password",
    "ingest_token",
];

/// Datadog's log statuses by severity.
const DATADOG_STATUSES: [&str; 6] = ["info", "info", "notice", "warning", "error", "critical"];

/// The kinds of destination.
pub const KINDS: [&str; 2] = ["observability", "xdr"];

/// A member by either spelling.
fn member<'a>(config: &'a Map<String, Value>, snake: &str) -> Option<&'a str> {
    let camel: String =
        snake.split('_').enumerate().map(|(index, part)| if index == 0 { part.to_string() } else { capitalized(part) }).collect();
    config.get(snake).or_else(|| config.get(&camel)).and_then(Value::as_str).filter(|value| !value.trim().is_empty())
}

fn capitalized(part: &str) -> String {
    let mut characters = part.chars();
    characters.next().map(|first| first.to_uppercase().collect::<String>() + characters.as_str()).unwrap_or_default()
}

/// The members a type requires (snake_case; camelCase accepted).
pub fn required(kind: &str, kind_type: &str) -> Option<&'static [&'static str]> {
    Some(match (kind, kind_type) {
        ("observability", "webhook" | "custom") => &["url"],
        ("observability", "otlp") => &["endpoint"],
        ("observability", "datadog" | "posthog") => &["api_key"],
        ("observability", "splunk") | ("xdr", "splunk") => &["hec_url", "hec_token"],
        ("observability", "s3") => &["bucket", "access_key_id", "secret_access_key"],
        ("xdr", "sentinel") => &["workspace_id", "workspace_key"],
        ("xdr", "elastic") => &["url", "api_key"],
        ("xdr", "crowdstrike") => &["url", "api_key"],
        ("xdr", "sumo_logic") => &["url"],
        _ => return None,
    })
}

/// Checks a type and its config (the secrets merged in): the required members and the URLs.
pub fn validate(kind: &str, kind_type: &str, config: &Map<String, Value>) -> Result<(), String> {
    let types: &[&str] = if kind == "xdr" { &XDR_TYPES } else { &OBSERVABILITY_TYPES };
    let needed = required(kind, kind_type).ok_or_else(|| format!("type `{kind_type}` is not one of {}", types.join(", ")))?;
    for name in needed {
        if member(config, name).is_none() {
            return Err(format!("a {kind_type} destination needs config.{name}"));
        }
    }
    for name in ["url", "endpoint", "hec_url", "host"] {
        if let Some(url) = member(config, name) {
            match reqwest::Url::parse(url) {
                Ok(parsed) if matches!(parsed.scheme(), "http" | "https") => {}
                _ => return Err(format!("config.{name} must be an http(s) URL")),
            }
        }
    }
    if let Some(headers) = config.get("headers")
        && !headers.as_object().is_some_and(|headers| headers.values().all(Value::is_string))
    {
        return Err("config.headers must be an object of strings".to_string());
    }
    Ok(())
}

/// Splits a config into its public members and its secret ones.
pub fn split_secrets(config: Map<String, Value>) -> (Map<String, Value>, Map<String, Value>) {
    config.into_iter().partition(|(name, _)| !SECRET_MEMBERS.contains(&name.as_str()))
}

/// One delivery.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpRequest {
    pub method: &'static str,
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

fn extra_headers(config: &Map<String, Value>, headers: &mut Vec<(String, String)>) {
    if let Some(Value::Object(extra)) = config.get("headers") {
        for (name, value) in extra {
            if let Some(value) = value.as_str() {
                headers.push((name.clone(), value.to_string()));
            }
        }
    }
}

fn unix_seconds(event: &Event) -> i64 {
    brainstorm_common::time::parse_timestamp(&event.timestamp).map(|instant| instant.timestamp()).unwrap_or_default()
}

fn hex_sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn hmac_sha256(key: &[u8], data: &[u8]) -> Vec<u8> {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
    mac.update(data);
    mac.finalize().into_bytes().to_vec()
}

fn json_lines(values: impl Iterator<Item = Value>) -> Vec<u8> {
    let mut body = Vec::new();
    for value in values {
        body.extend_from_slice(value.to_string().as_bytes());
        body.push(b'\n');
    }
    body
}

/// HEC's event envelope, one per event, concatenated.
fn hec_body(events: &[Event], sourcetype: &str, as_ocsf: bool) -> Vec<u8> {
    let mut body = Vec::new();
    for event in events {
        let payload = if as_ocsf { ocsf(event) } else { event.to_json() };
        body.extend_from_slice(
            json!({"time": unix_seconds(event), "sourcetype": sourcetype, "source": "brainstorm", "event": payload}).to_string().as_bytes(),
        );
    }
    body
}

fn hec_url(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(parsed) if parsed.path() == "/" || parsed.path().is_empty() => format!("{}/services/collector/event", url.trim_end_matches('/')),
        _ => url.to_string(),
    }
}

fn otlp_severity(severity: u8) -> (u8, &'static str) {
    match severity {
        0 | 1 => (9, "INFO"),
        2 => (10, "INFO2"),
        3 => (13, "WARN"),
        4 => (17, "ERROR"),
        _ => (21, "FATAL"),
    }
}

/// The request a batch becomes for a destination (`config` with its secrets merged in); `now` signs S3 and Sentinel.
pub fn request(
    kind: &str,
    kind_type: &str,
    config: &Map<String, Value>,
    events: &[Event],
    now: chrono::DateTime<chrono::Utc>,
) -> Result<HttpRequest, String> {
    let get = |name: &str| member(config, name).ok_or_else(|| format!("config.{name} is missing"));
    let mut headers = vec![("content-type".to_string(), "application/json".to_string())];
    let request = match (kind, kind_type) {
        ("observability", "webhook" | "custom") => {
            let body = json!({"events": events.iter().map(Event::to_json).collect::<Vec<_>>()}).to_string().into_bytes();
            if let Some(secret) = member(config, "secret") {
                headers.push(("x-br-signature".to_string(), format!("sha256={}", hex::encode(hmac_sha256(secret.as_bytes(), &body)))));
            }
            extra_headers(config, &mut headers);
            let method = if member(config, "method").is_some_and(|method| method.eq_ignore_ascii_case("PUT")) { "PUT" } else { "POST" };
            HttpRequest { method, url: get("url")?.to_string(), headers, body }
        }
        ("observability", "otlp") => {
            let records: Vec<Value> = events
                .iter()
                .map(|event| {
                    let (number, text) = otlp_severity(event.severity);
                    let nanos = brainstorm_common::time::parse_timestamp(&event.timestamp)
                        .and_then(|instant| instant.timestamp_nanos_opt())
                        .unwrap_or_default();
                    json!({
                        "timeUnixNano": nanos.to_string(),
                        "severityNumber": number,
                        "severityText": text,
                        "body": {"stringValue": event.to_json().to_string()},
                        "attributes": [
                            {"key": "event.name", "value": {"stringValue": event.name}},
                            {"key": "event.type", "value": {"stringValue": event.event_type}},
                            {"key": "tenant.id", "value": {"stringValue": event.tenant_id}},
                            {"key": "request.id", "value": {"stringValue": event.request_id}},
                        ],
                    })
                })
                .collect();
            let body = json!({"resourceLogs": [{
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "brainstorm"}}]},
                "scopeLogs": [{"scope": {"name": "brainstorm.observability"}, "logRecords": records}],
            }]});
            extra_headers(config, &mut headers);
            let endpoint = get("endpoint")?.trim_end_matches('/');
            let url = if endpoint.ends_with("/v1/logs") { endpoint.to_string() } else { format!("{endpoint}/v1/logs") };
            HttpRequest { method: "POST", url, headers, body: body.to_string().into_bytes() }
        }
        ("observability", "datadog") => {
            let site = member(config, "site").unwrap_or("datadoghq.com");
            let url = member(config, "url").map(str::to_string).unwrap_or_else(|| format!("https://http-intake.logs.{site}/api/v2/logs"));
            let entries: Vec<Value> = events
                .iter()
                .map(|event| {
                    let status = DATADOG_STATUSES[usize::from(event.severity.min(5))];
                    json!({
                        "ddsource": "brainstorm",
                        "service": "brainstorm-gateway",
                        "ddtags": format!("tenant:{},event_type:{},event:{}", event.tenant_id, event.event_type, event.name),
                        "status": status,
                        "message": event.to_json().to_string(),
                    })
                })
                .collect();
            headers.push(("dd-api-key".to_string(), get("api_key")?.to_string()));
            HttpRequest { method: "POST", url, headers, body: Value::Array(entries).to_string().into_bytes() }
        }
        ("observability", "splunk") | ("xdr", "splunk") => {
            headers.push(("authorization".to_string(), format!("Splunk {}", get("hec_token")?)));
            let xdr = kind == "xdr";
            HttpRequest {
                method: "POST",
                url: hec_url(get("hec_url")?),
                headers,
                body: hec_body(events, if xdr { "ocsf" } else { "brainstorm:event" }, xdr),
            }
        }
        ("observability", "posthog") => {
            let host = member(config, "host").unwrap_or("https://us.i.posthog.com").trim_end_matches('/');
            let batch: Vec<Value> = events
                .iter()
                .map(|event| {
                    let distinct_id = event
                        .data
                        .get("agent_id")
                        .and_then(Value::as_str)
                        .or_else(|| event.data.get("key_id").and_then(Value::as_str))
                        .unwrap_or(&event.tenant_id);
                    let mut properties = event.data.clone();
                    if let Some(properties) = properties.as_object_mut() {
                        properties.insert("tenant_id".to_string(), json!(event.tenant_id));
                        properties.insert("request_id".to_string(), json!(event.request_id));
                        properties.insert("event_type".to_string(), json!(event.event_type));
                    }
                    json!({"event": event.name, "distinct_id": distinct_id, "timestamp": event.timestamp, "properties": properties})
                })
                .collect();
            let body = json!({"api_key": get("api_key")?, "batch": batch});
            HttpRequest { method: "POST", url: format!("{host}/batch/"), headers, body: body.to_string().into_bytes() }
        }
        ("observability", "s3") => s3_put(config, events, now)?,
        ("xdr", "sentinel") => {
            let body = Value::Array(events.iter().map(ocsf).collect()).to_string().into_bytes();
            let workspace = get("workspace_id")?;
            let key = STANDARD.decode(get("workspace_key")?).map_err(|_| "config.workspace_key must be base64".to_string())?;
            let date = now.format("%a, %d %b %Y %H:%M:%S GMT").to_string();
            let to_sign = format!("POST\n{}\napplication/json\nx-ms-date:{date}\n/api/logs", body.len());
            let signature = STANDARD.encode(hmac_sha256(&key, to_sign.as_bytes()));
            headers.push(("authorization".to_string(), format!("SharedKey {workspace}:{signature}")));
            headers.push(("log-type".to_string(), member(config, "log_type").unwrap_or("BrainstormOCSF").to_string()));
            headers.push(("x-ms-date".to_string(), date));
            headers.push(("time-generated-field".to_string(), "time".to_string()));
            let base = member(config, "endpoint")
                .map(|endpoint| endpoint.trim_end_matches('/').to_string())
                .unwrap_or_else(|| format!("https://{workspace}.ods.opinsights.azure.com"));
            HttpRequest { method: "POST", url: format!("{base}/api/logs?api-version=2016-04-01"), headers, body }
        }
        ("xdr", "elastic") => {
            let index = member(config, "index").unwrap_or("brainstorm-ocsf");
            let body = json_lines(events.iter().flat_map(|event| [json!({"create": {"_index": index}}), ocsf(event)]));
            let headers = vec![
                ("content-type".to_string(), "application/x-ndjson".to_string()),
                ("authorization".to_string(), format!("ApiKey {}", get("api_key")?)),
            ];
            HttpRequest { method: "POST", url: format!("{}/_bulk", get("url")?.trim_end_matches('/')), headers, body }
        }
        ("xdr", "crowdstrike") => {
            headers.push(("authorization".to_string(), format!("Bearer {}", get("api_key")?)));
            HttpRequest { method: "POST", url: get("url")?.to_string(), headers, body: hec_body(events, "ocsf", true) }
        }
        ("xdr", "sumo_logic") => {
            HttpRequest { method: "POST", url: get("url")?.to_string(), headers, body: json_lines(events.iter().map(ocsf)) }
        }
        (kind, kind_type) => return Err(format!("no {kind} destination type `{kind_type}`")),
    };
    Ok(request)
}

/// One batch as a JSON-lines object, `PUT` with AWS Signature Version 4 (virtual-hosted style, or
/// path style under `endpoint` for S3-compatible stores).
fn s3_put(config: &Map<String, Value>, events: &[Event], now: chrono::DateTime<chrono::Utc>) -> Result<HttpRequest, String> {
    let get = |name: &str| member(config, name).ok_or_else(|| format!("config.{name} is missing"));
    let bucket = get("bucket")?;
    let region = member(config, "region").unwrap_or("us-east-1");
    let prefix = member(config, "prefix").unwrap_or("brainstorm/");
    let tenant = events.first().map(|event| event.tenant_id.as_str()).unwrap_or("none");
    let key = format!("{prefix}{tenant}/{}/{}.jsonl", now.format("%Y/%m/%d"), uuid::Uuid::now_v7());
    let (url, host, path) = match member(config, "endpoint") {
        Some(endpoint) => {
            let parsed = reqwest::Url::parse(endpoint).map_err(|_| "config.endpoint must be a URL".to_string())?;
            let host = match parsed.port() {
                Some(port) => format!("{}:{port}", parsed.host_str().unwrap_or_default()),
                None => parsed.host_str().unwrap_or_default().to_string(),
            };
            let path = format!("/{bucket}/{key}");
            (format!("{}{path}", endpoint.trim_end_matches('/')), host, path)
        }
        None => {
            let host = format!("{bucket}.s3.{region}.amazonaws.com");
            (format!("https://{host}/{key}"), host, format!("/{key}"))
        }
    };
    let body = json_lines(events.iter().map(Event::to_json));
    let payload_hash = hex_sha256(&body);
    let amz_date = now.format("%Y%m%dT%H%M%SZ").to_string();
    let date = now.format("%Y%m%d").to_string();
    let canonical = format!(
        "PUT\n{path}\n\nhost:{host}\nx-amz-content-sha256:{payload_hash}\nx-amz-date:{amz_date}\n\nhost;x-amz-content-sha256;x-amz-date\n{payload_hash}"
    );
    let scope = format!("{date}/{region}/s3/aws4_request");
    let to_sign = format!("AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}", hex_sha256(canonical.as_bytes()));
    let mut signing_key = hmac_sha256(format!("AWS4{}", get("secret_access_key")?).as_bytes(), date.as_bytes());
    for part in [region, "s3", "aws4_request"] {
        signing_key = hmac_sha256(&signing_key, part.as_bytes());
    }
    let signature = hex::encode(hmac_sha256(&signing_key, to_sign.as_bytes()));
    let headers = vec![
        ("content-type".to_string(), "application/x-ndjson".to_string()),
        ("x-amz-content-sha256".to_string(), payload_hash),
        ("x-amz-date".to_string(), amz_date),
        (
            "authorization".to_string(),
            format!(
                "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature={signature}",
                get("access_key_id")?
            ),
        ),
    ];
    Ok(HttpRequest { method: "PUT", url, headers, body })
}

/// The platform templates (`GET /v1/observability/templates`): five platforms, each with the
/// destination type, its config schema, the event types worth sending and an example config.
pub fn templates() -> Vec<Value> {
    let schema = |required: &[&str], properties: Value| json!({"type": "object", "required": required, "properties": properties});
    vec![
        json!({
            "provider": "datadog", "name": "Datadog", "type": "datadog",
            "config_schema": schema(&["api_key"], json!({"api_key": {"type": "string", "secret": true}, "site": {"type": "string", "default": "datadoghq.com"}})),
            "recommended_event_types": ["usage", "error", "guardrail"],
            "example_config": {"api_key": "<DD_API_KEY>", "site": "datadoghq.eu"},
        }),
        json!({
            "provider": "splunk", "name": "Splunk (HTTP Event Collector)", "type": "splunk",
            "config_schema": schema(&["hec_url", "hec_token"], json!({"hec_url": {"type": "string", "format": "uri"}, "hec_token": {"type": "string", "secret": true}})),
            "recommended_event_types": ["audit", "guardrail", "error"],
            "example_config": {"hec_url": "https://splunk.example.com:8088", "hec_token": "<HEC_TOKEN>"},
        }),
        json!({
            "provider": "posthog", "name": "PostHog", "type": "posthog",
            "config_schema": schema(&["api_key"], json!({"api_key": {"type": "string", "secret": true}, "host": {"type": "string", "default": "https://us.i.posthog.com"}})),
            "recommended_event_types": ["usage"],
            "example_config": {"api_key": "<PROJECT_API_KEY>", "host": "https://eu.i.posthog.com"},
        }),
        json!({
            "provider": "opentelemetry", "name": "OpenTelemetry collector (OTLP/HTTP)", "type": "otlp",
            "config_schema": schema(&["endpoint"], json!({"endpoint": {"type": "string", "format": "uri"}, "headers": {"type": "object"}})),
            "recommended_event_types": ["usage", "audit", "guardrail", "error"],
            "example_config": {"endpoint": "http://otel-collector:4318"},
        }),
        json!({
            "provider": "aws-s3", "name": "Amazon S3", "type": "s3",
            "config_schema": schema(&["bucket", "access_key_id", "secret_access_key"], json!({
                "bucket": {"type": "string"}, "region": {"type": "string", "default": "us-east-1"}, "prefix": {"type": "string", "default": "brainstorm/"},
                "access_key_id": {"type": "string"}, "secret_access_key": {"type": "string", "secret": true}, "endpoint": {"type": "string", "format": "uri"},
            })),
            "recommended_event_types": ["usage", "audit"],
            "example_config": {"bucket": "ai-usage-archive", "region": "eu-west-1", "access_key_id": "<AKIA...>", "secret_access_key": "<SECRET>"},
        }),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::synthetic_usage;
    use chrono::TimeZone;

    fn config(value: Value) -> Map<String, Value> {
        value.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn types_need_their_members_in_either_spelling() {
        assert!(validate("observability", "splunk", &config(json!({"hecUrl": "https://s:8088", "hecToken": "t"}))).is_ok());
        assert!(validate("observability", "splunk", &config(json!({"hec_url": "https://s:8088"}))).is_err());
        assert!(validate("observability", "webhook", &config(json!({"url": "ftp://x"}))).is_err());
        assert!(validate("xdr", "webhook", &config(json!({"url": "https://x"}))).is_err());
        assert!(validate("observability", "quantum", &config(json!({}))).is_err());
        let (public, secret) = split_secrets(config(json!({"hec_url": "u", "hecToken": "t", "api_key": "k"})));
        assert_eq!((public.len(), secret.len()), (1, 2));
    }

    #[test]
    fn a_webhook_batch_is_signed_when_a_secret_is_set() {
        let events = [synthetic_usage("t1")];
        let now = chrono::Utc::now();
        let request = request(
            "observability",
            "webhook",
            &config(json!({"url": "http://h/x", "secret": "s3cr3t", "headers": {"x-team": "ai"}})),
            &events,
            now,
        );
        let request = request.unwrap_or_else(|error| unreachable!("{error}"));
        let signature = request.headers.iter().find(|(name, _)| name == "x-br-signature").map(|(_, value)| value.clone());
        assert_eq!(signature, Some(format!("sha256={}", hex::encode(hmac_sha256(b"s3cr3t", &request.body)))));
        assert!(request.headers.contains(&("x-team".to_string(), "ai".to_string())));
    }

    #[test]
    fn s3_requests_follow_signature_version_4() {
        // AWS's documented example of a signing key (the "Deriving the signing key" page).
        let mut key = hmac_sha256(b"AWS4wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", b"20120215");
        for part in ["us-east-1", "iam", "aws4_request"] {
            key = hmac_sha256(&key, part.as_bytes());
        }
        assert_eq!(hex::encode(key), "f4780e2d9f65fa895f9c67b32ce1baf0b0d8a43505a000a1a9e090d414db404d");
        let now = chrono::Utc.with_ymd_and_hms(2026, 11, 29, 12, 0, 0).single().unwrap_or_default();
        let s3 = config(
            json!({"bucket": "b", "region": "eu-west-1", "access_key_id": "AKID", "secret_access_key": "SECRET", "endpoint": "http://127.0.0.1:9000"}),
        );
        let request = request("observability", "s3", &s3, &[synthetic_usage("t1")], now).unwrap_or_else(|error| unreachable!("{error}"));
        assert_eq!(request.method, "PUT");
        assert!(request.url.starts_with("http://127.0.0.1:9000/b/brainstorm/t1/2026/11/29/"), "{}", request.url);
        let authorization =
            request.headers.iter().find(|(name, _)| name == "authorization").map(|(_, value)| value.as_str()).unwrap_or_default();
        assert!(authorization.starts_with("AWS4-HMAC-SHA256 Credential=AKID/20261129/eu-west-1/s3/aws4_request, SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature="));
    }
}
