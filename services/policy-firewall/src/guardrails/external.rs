//! External guardrail providers: templates, result mappings and the HTTP call. A provider receives
//! `POST {"text": ...}` (with `Authorization: Bearer <api_key>` when it has a key) and answers JSON that
//! the mapping's JSONPaths turn into `{safe, confidence, reason}`.

use std::time::Duration;

use brainstorm_common::net::UrlRefusal;
use brainstorm_proto::policy::{GuardrailTemplate, ResultMapping};
use serde_json::{Value, json};

use super::jsonpath::JsonPath;

/// Timeout of a provider call when none is configured.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(3000);
/// The longest timeout a provider may be given.
pub const MAX_TIMEOUT: Duration = Duration::from_millis(30_000);
/// A custom provider names its own mapping.
pub const CUSTOM_TEMPLATE: &str = "custom";

/// A provider answer shape.
pub struct Template {
    pub id: &'static str,
    pub description: &'static str,
    pub safe: &'static str,
    pub confidence: &'static str,
    pub reason: &'static str,
}

/// The shapes a provider can answer in without a custom mapping.
pub const TEMPLATES: [Template; 3] = [
    Template {
        id: "generic",
        description: "answers {\"safe\": bool, \"confidence\": 0..1, \"reason\": string}",
        safe: "$.safe",
        confidence: "$.confidence",
        reason: "$.reason",
    },
    Template {
        id: "flagged",
        description: "answers {\"flagged\": bool, \"score\": 0..1, \"category\": string} (flagged means unsafe)",
        safe: "!$.flagged",
        confidence: "$.score",
        reason: "$.category",
    },
    Template {
        id: "moderation",
        description: "answers {\"results\": [{\"flagged\": bool, \"score\": 0..1, \"category\": string}]} (moderation-style)",
        safe: "!$.results[0].flagged",
        confidence: "$.results[0].score",
        reason: "$.results[0].category",
    },
];

/// The templates as the contract lists them.
pub fn templates() -> Vec<GuardrailTemplate> {
    TEMPLATES
        .iter()
        .map(|template| GuardrailTemplate {
            id: template.id.to_string(),
            description: template.description.to_string(),
            result_mapping: Some(ResultMapping {
                safe: template.safe.to_string(),
                confidence: template.confidence.to_string(),
                reason: template.reason.to_string(),
            }),
        })
        .collect()
}

/// The mapping a provider uses: its template's, or its own for `custom` (which requires one).
pub fn resolve_mapping(template: &str, custom: Option<&ResultMapping>) -> Result<ResultMapping, String> {
    if template == CUSTOM_TEMPLATE {
        let mapping = custom.ok_or("a custom provider needs result_mapping {safe, confidence, reason}")?;
        Mapping::compile(mapping)?;
        return Ok(mapping.clone());
    }
    let known = TEMPLATES.iter().find(|known| known.id == template).ok_or_else(|| {
        let ids: Vec<&str> = TEMPLATES.iter().map(|known| known.id).collect();
        format!("unknown template `{template}`: use one of {}, or `custom` with result_mapping", ids.join(", "))
    })?;
    let mapping = custom.cloned().unwrap_or_else(|| ResultMapping {
        safe: known.safe.to_string(),
        confidence: known.confidence.to_string(),
        reason: known.reason.to_string(),
    });
    Mapping::compile(&mapping)?;
    Ok(mapping)
}

/// Accepts `http(s)://` endpoints; private, loopback and link-local addresses only when allowed (a
/// tenant must not make the service call into its own network). Host names are judged when the
/// service's client resolves them (`common::net::tenant_http_client`).
pub fn validate_endpoint(endpoint: &str, allow_private: bool) -> Result<(), String> {
    match brainstorm_common::net::tenant_url(endpoint, allow_private) {
        Ok(_) => Ok(()),
        Err(UrlRefusal::NotUrl) => Err(format!("endpoint `{endpoint}` is not a URL")),
        Err(UrlRefusal::NotHttp) => Err("the endpoint must be an http:// or https:// URL".to_string()),
        Err(UrlRefusal::NoHost) => Err("the endpoint has no host".to_string()),
        Err(UrlRefusal::Private(_)) => Err("the endpoint must not be a private, loopback or link-local address".to_string()),
    }
}

/// A compiled result mapping.
#[derive(Debug, Clone)]
pub struct Mapping {
    safe: JsonPath,
    safe_negated: bool,
    confidence: Option<JsonPath>,
    reason: Option<JsonPath>,
}

impl Mapping {
    /// Parses the three paths (`confidence` and `reason` may be empty).
    pub fn compile(mapping: &ResultMapping) -> Result<Self, String> {
        let safe = mapping.safe.trim();
        let (safe_negated, safe) = match safe.strip_prefix('!') {
            Some(rest) => (true, rest.trim()),
            None => (false, safe),
        };
        let optional = |path: &str| if path.trim().is_empty() { Ok(None) } else { JsonPath::parse(path).map(Some) };
        Ok(Mapping {
            safe: JsonPath::parse(safe).map_err(|error| format!("result_mapping.safe: {error}"))?,
            safe_negated,
            confidence: optional(&mapping.confidence).map_err(|error| format!("result_mapping.confidence: {error}"))?,
            reason: optional(&mapping.reason).map_err(|error| format!("result_mapping.reason: {error}"))?,
        })
    }

    /// Reads a provider's answer.
    pub fn read(&self, answer: &Value) -> Result<ExternalVerdict, String> {
        let safe_value = self.safe.select(answer).ok_or("the answer has no value at the `safe` path")?;
        let safe = truthy(safe_value).ok_or("the `safe` value is not a boolean")? != self.safe_negated;
        let confidence = match self.confidence.as_ref().and_then(|path| path.select(answer)) {
            Some(Value::Number(number)) => number.as_f64().filter(|value| value.is_finite()).map(|value| value.clamp(0.0, 1.0)),
            Some(Value::String(text)) => {
                text.trim().parse::<f64>().ok().filter(|value| value.is_finite()).map(|value| value.clamp(0.0, 1.0))
            }
            _ => None,
        };
        let reason = match self.reason.as_ref().and_then(|path| path.select(answer)) {
            None | Some(Value::Null) => None,
            Some(Value::String(text)) => Some(text.clone()),
            Some(other) => Some(other.to_string()),
        };
        // Without a confidence the provider's own verdict stands: certain either way.
        Ok(ExternalVerdict { safe, confidence: confidence.unwrap_or(1.0), reason })
    }
}

fn truthy(value: &Value) -> Option<bool> {
    match value {
        Value::Bool(flag) => Some(*flag),
        Value::String(text) => match text.trim().to_ascii_lowercase().as_str() {
            "true" | "safe" | "pass" | "passed" | "allow" | "allowed" | "ok" => Some(true),
            "false" | "unsafe" | "fail" | "failed" | "block" | "blocked" | "flagged" | "deny" => Some(false),
            _ => None,
        },
        _ => None,
    }
}

/// What a provider said.
#[derive(Debug, Clone, PartialEq)]
pub struct ExternalVerdict {
    pub safe: bool,
    pub confidence: f64,
    pub reason: Option<String>,
}

/// A provider ready to call (its key opened).
#[derive(Clone)]
pub struct ExternalProvider {
    pub id: String,
    pub endpoint: String,
    pub api_key: Option<String>,
    pub mapping: Mapping,
    pub timeout: Duration,
}

impl std::fmt::Debug for ExternalProvider {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("ExternalProvider")
            .field("id", &self.id)
            .field("endpoint", &self.endpoint)
            .field("api_key", &self.api_key.as_ref().map(|_| "***"))
            .finish()
    }
}

/// Calls a provider. Errors name what failed, never the key or the provider's body.
pub async fn call(http: &reqwest::Client, provider: &ExternalProvider, text: &str) -> Result<ExternalVerdict, String> {
    let mut request = http.post(&provider.endpoint).timeout(provider.timeout).json(&json!({"text": text}));
    if let Some(key) = &provider.api_key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.map_err(|error| {
        if error.is_timeout() {
            format!("timed out after {} ms", provider.timeout.as_millis())
        } else if error.is_connect() {
            "could not connect".to_string()
        } else {
            "request failed".to_string()
        }
    })?;
    let status = response.status();
    if !status.is_success() {
        return Err(format!("answered HTTP {}", status.as_u16()));
    }
    let answer: Value = response.json().await.map_err(|_| "answered something that is not JSON".to_string())?;
    provider.mapping.read(&answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(safe: &str, confidence: &str, reason: &str) -> ResultMapping {
        ResultMapping { safe: safe.to_string(), confidence: confidence.to_string(), reason: reason.to_string() }
    }

    #[test]
    fn mappings_read_answers_and_negate_flags() -> Result<(), String> {
        let flagged = Mapping::compile(&mapping("!$.results[0].flagged", "$.results[0].score", "$.results[0].category"))?;
        let verdict = flagged.read(&json!({"results": [{"flagged": true, "score": 0.82, "category": "violence"}]}))?;
        assert_eq!(verdict, ExternalVerdict { safe: false, confidence: 0.82, reason: Some("violence".to_string()) });
        let generic = Mapping::compile(&mapping("$.safe", "$.confidence", ""))?;
        assert_eq!(
            generic.read(&json!({"safe": "pass", "confidence": "0.3"}))?,
            ExternalVerdict { safe: true, confidence: 0.3, reason: None }
        );
        assert_eq!(generic.read(&json!({"safe": false}))?.confidence, 1.0, "no confidence reads as certain");
        assert!(generic.read(&json!({"verdict": true})).is_err());
        assert!(generic.read(&json!({"safe": 3})).is_err());
        Ok(())
    }

    #[test]
    fn templates_resolve_and_custom_needs_a_mapping() {
        assert_eq!(resolve_mapping("flagged", None).map(|mapping| mapping.safe), Ok("!$.flagged".to_string()));
        assert!(resolve_mapping("custom", None).is_err());
        assert!(resolve_mapping("custom", Some(&mapping("$.ok", "", ""))).is_ok());
        assert!(resolve_mapping("custom", Some(&mapping("ok", "", ""))).is_err());
        assert!(resolve_mapping("nope", None).is_err());
        assert_eq!(templates().len(), TEMPLATES.len());
    }

    #[test]
    fn endpoints_must_be_public_http_urls_unless_private_ones_are_allowed() {
        assert!(validate_endpoint("https://guard.example.com/v1/scan", false).is_ok());
        for endpoint in [
            "ftp://guard.example.com",
            "not a url",
            "http://127.0.0.1:9000/scan",
            "http://169.254.169.254/latest",
            "http://10.0.0.5/x",
            "http://localhost/x",
            "http://[::1]/x",
        ] {
            assert!(validate_endpoint(endpoint, false).is_err(), "{endpoint}");
        }
        assert!(validate_endpoint("http://127.0.0.1:9000/scan", true).is_ok());
    }
}
