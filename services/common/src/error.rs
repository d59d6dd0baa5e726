//! The spec's error envelope: every failure a client sees, with its recovery hint, in one place.

use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use brainstorm_proto::{ErrorKind, ServiceError};
use serde_json::{Map, Value, json};

const DOCS_BASE_URL: &str = "https://docs.brainstorm.dev/errors";

/// What a client can do about an error: present on every error body.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Recovery {
    pub action: &'static str,
    pub endpoint: String,
    pub method: &'static str,
    pub body_template: Value,
    pub message: String,
    pub wait_ms: Option<u64>,
    /// Why the action is needed, where a refusal names one (`renegotiate`'s `model_outside_grant`).
    pub reason: Option<String>,
}

/// An error as the REST edge answers it: status, `error{...}`, `recovery{...}` and headers. Boxed, so
/// `Result<_, ApiError>` stays one pointer wide on the hot path.
#[derive(Debug, Clone)]
pub struct ApiError(Box<ApiErrorParts>);

/// The parts of an `ApiError`, reachable through `Deref`.
#[derive(Debug, Clone)]
pub struct ApiErrorParts {
    pub status: StatusCode,
    pub error_type: &'static str,
    pub code: Option<String>,
    pub message: String,
    pub provider: Option<String>,
    /// Extra fields of the `error` object (for example `approval_id`).
    pub details: Map<String, Value>,
    pub recovery: Recovery,
    pub headers: Vec<(HeaderName, HeaderValue)>,
}

impl ApiError {
    fn new(status: StatusCode, error_type: &'static str, code: Option<&str>, message: impl Into<String>, recovery: Recovery) -> Self {
        ApiError(Box::new(ApiErrorParts {
            status,
            error_type,
            code: code.map(str::to_string),
            message: message.into(),
            provider: None,
            details: Map::new(),
            recovery,
            headers: Vec::new(),
        }))
    }

    /// 400: the body or a parameter is invalid; `code` names the rule broken.
    pub fn invalid_request(code: &str, message: impl Into<String>) -> Self {
        let message = message.into();
        let recovery = Recovery::same_endpoint("fix_request", format!("correct the request: {message}"));
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", Some(code), message, recovery)
    }

    /// 401: missing, malformed, revoked or expired credential.
    pub fn unauthenticated(code: &str, message: impl Into<String>) -> Self {
        let recovery = Recovery {
            action: "authenticate",
            endpoint: "/v1/register".to_string(),
            method: "POST",
            body_template: json!({"tenant_name": "<name>", "accept_tos": true}),
            message: "send a valid key as `Authorization: Bearer br_live_...`, or register to get one".to_string(),
            wait_ms: None,
            reason: None,
        };
        Self::new(StatusCode::UNAUTHORIZED, "authentication_error", Some(code), message, recovery)
    }

    /// 401 for an agent JWT that is missing, malformed, expired or revoked: bootstrap for a fresh one.
    pub fn agent_unauthenticated(code: &str, message: impl Into<String>) -> Self {
        let recovery = Recovery {
            action: "bootstrap_agent",
            endpoint: "/v1/agent/bootstrap".to_string(),
            method: "POST",
            body_template: json!({"agent_id": "<agent id>"}),
            message: "bootstrap with the tenant API key to get a fresh agent JWT, then send it as `Authorization: Bearer <jwt>`"
                .to_string(),
            wait_ms: None,
            reason: None,
        };
        Self::new(StatusCode::UNAUTHORIZED, "authentication_error", Some(code), message, recovery)
    }

    /// 402 `insufficient_budget`: a budget to give from (a parent agent's, when delegating) is too small.
    pub fn insufficient_budget(message: impl Into<String>) -> Self {
        let recovery = Recovery::same_endpoint("reduce_allocation", "allocate less, or have an operator raise the parent's daily budget");
        let mut error = Self::new(StatusCode::PAYMENT_REQUIRED, "budget_exceeded", Some("insufficient_budget"), message, recovery);
        error.recovery.body_template = json!({"budget_allocation_usd": "<a smaller amount>"});
        error
    }

    /// 403: the caller lacks a permission.
    pub fn forbidden(code: &str, message: impl Into<String>) -> Self {
        let recovery = Recovery {
            action: "request_permission",
            endpoint: "/v1/api-keys".to_string(),
            method: "POST",
            body_template: json!({"name": "<name>", "role": "<role with the permission>"}),
            message: "use a key whose role grants the permission, or ask a tenant admin for one".to_string(),
            wait_ms: None,
            reason: None,
        };
        Self::new(StatusCode::FORBIDDEN, "forbidden", Some(code), message, recovery)
    }

    /// 403 for a key that lacks `permission`.
    pub fn missing_permission(permission: &str) -> Self {
        let mut error = Self::forbidden("forbidden", format!("this key lacks the `{permission}` permission"));
        error.details.insert("required_permission".to_string(), json!(permission));
        error
    }

    /// 404: the resource does not exist.
    pub fn not_found(code: &str, message: impl Into<String>) -> Self {
        let recovery = Recovery::same_endpoint("check_identifier", "list the collection to find a valid identifier");
        Self::new(StatusCode::NOT_FOUND, "not_found_error", Some(code), message, recovery)
    }

    /// 404 for a path the gateway does not serve.
    pub fn route_not_found(method: &str, path: &str) -> Self {
        let mut error = Self::not_found("route_not_found", format!("no route for {method} {path}"));
        error.recovery = Recovery {
            action: "check_endpoint",
            endpoint: "/openapi.json".to_string(),
            method: "GET",
            body_template: Value::Null,
            message: "see the API reference for the available endpoints".to_string(),
            wait_ms: None,
            reason: None,
        };
        error
    }

    /// 405 for a known path called with the wrong method.
    pub fn method_not_allowed(method: &str, path: &str) -> Self {
        let recovery = Recovery::same_endpoint("fix_request", "use a method this endpoint accepts");
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            Some("method_not_allowed"),
            format!("{method} is not allowed on {path}"),
            recovery,
        )
    }

    /// 409: the request conflicts with the current state.
    pub fn conflict(code: &str, message: impl Into<String>) -> Self {
        let recovery = Recovery::same_endpoint("check_state", "read the resource's current state before retrying");
        Self::new(StatusCode::CONFLICT, "conflict_error", Some(code), message, recovery)
    }

    /// 413: the body exceeds the accepted size.
    pub fn payload_too_large(message: impl Into<String>) -> Self {
        let recovery = Recovery::same_endpoint("fix_request", "send a smaller body");
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "invalid_request_error", Some("payload_too_large"), message, recovery)
    }

    /// 503: a dependency is down; retry later.
    pub fn unavailable(code: &str, message: impl Into<String>) -> Self {
        let recovery = Recovery::retry("a dependency is unavailable; retry shortly", 1000);
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "service_unavailable", Some(code), message, recovery)
    }

    /// 503 with `Retry-After`: every candidate model's circuit is open (its provider kept failing);
    /// `wait_ms` until the first lets a trial request through.
    pub fn circuit_open(message: impl Into<String>, wait_ms: u64) -> Self {
        let recovery =
            Recovery::retry("the model's provider is failing; retry after the wait, or name fallback models in route.models", wait_ms);
        let mut error = Self::new(StatusCode::SERVICE_UNAVAILABLE, "service_unavailable", Some("circuit_open"), message, recovery);
        error.push_header(HeaderName::from_static("retry-after"), &wait_ms.div_ceil(1000).max(1).to_string());
        error
    }

    /// 429 with `Retry-After`.
    pub fn rate_limited(message: impl Into<String>, wait_ms: u64) -> Self {
        let recovery = Recovery::retry("wait, then retry the same request", wait_ms);
        let mut error = Self::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", Some("rate_limit_exceeded"), message, recovery);
        let seconds = wait_ms.div_ceil(1000).max(1);
        error.push_header(HeaderName::from_static("retry-after"), &seconds.to_string());
        error
    }

    /// The upstream provider failed: its status is forwarded, as `provider_error` naming the provider.
    pub fn provider_error(status: u16, provider: &str, message: impl Into<String>) -> Self {
        let status = StatusCode::from_u16(status)
            .ok()
            .filter(|status| status.is_client_error() || status.is_server_error())
            .unwrap_or(StatusCode::BAD_GATEWAY);
        let recovery = Recovery::same_endpoint("retry_with_fallback", "retry, or name fallback models in route.models");
        let mut error = Self::new(status, "provider_error", Some("upstream_error"), message, recovery);
        error.provider = Some(provider.to_string());
        error
    }

    /// 404: the requested model is unknown.
    pub fn model_not_found(message: impl Into<String>) -> Self {
        let mut error = Self::not_found("model_not_found", message);
        error.recovery = Recovery::runnable_models("use a model from the runnable catalog");
        error
    }

    /// 404: no runnable model satisfies the request (filters, capabilities, open circuits).
    pub fn model_unavailable(message: impl Into<String>) -> Self {
        let mut error = Self::not_found("model_unavailable", message);
        error.error_type = "model_unavailable";
        error.recovery = Recovery::runnable_models("relax the route filters or pick another model");
        error
    }

    /// 400: a provider model was asked for without that provider's key.
    pub fn byok_required(provider: &str, message: impl Into<String>) -> Self {
        let recovery = Recovery {
            action: "register_provider",
            endpoint: "/v1/providers".to_string(),
            method: "POST",
            body_template: serde_json::json!({"provider": provider, "api_key": "<your provider key>"}),
            message: format!("register a {provider} key, then retry"),
            wait_ms: None,
            reason: None,
        };
        Self::new(StatusCode::BAD_REQUEST, "byok_required", Some("byok_required"), message, recovery)
    }

    /// 500: an unexpected failure; the message never carries internals.
    pub fn internal() -> Self {
        let recovery = Recovery::retry("an unexpected error occurred; retry in a few seconds", 5000);
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", Some("internal_error"), "internal server error", recovery)
    }

    /// 403 `plan_scope_exceeded` (`permission_error`): a completion asks for more than its liaison
    /// plan grants; `reason` says what (`model_outside_grant`, ...).
    pub fn plan_scope_exceeded(reason: &str, message: impl Into<String>, liaison_id: &str) -> Self {
        let mut error = Self::new(StatusCode::FORBIDDEN, "permission_error", Some("plan_scope_exceeded"), message, Recovery::default());
        error.details.insert("reason".to_string(), json!(reason));
        error.renegotiate(liaison_id, Some(reason))
    }

    /// 402 `ceiling_exceeds_max`: a plan's estimate is above the caller's `max_cost_usd`.
    pub fn ceiling_exceeds_max(message: impl Into<String>) -> Self {
        let recovery = Recovery::same_endpoint(
            "reduce_scope",
            "raise max_cost_usd, lower max_tokens, shorten the conversation or name a cheaper model",
        );
        Self::new(StatusCode::PAYMENT_REQUIRED, "budget_exceeded", Some("ceiling_exceeds_max"), message, recovery)
    }

    /// This error's recovery made `renegotiate`: mint a new plan in the liaison session.
    pub fn renegotiate(mut self, liaison_id: &str, reason: Option<&str>) -> Self {
        self.recovery = Recovery {
            action: "renegotiate",
            endpoint: format!("/v1/liaison/{liaison_id}/plan"),
            method: "POST",
            body_template: json!({"messages": "<the conversation>", "model": "<model>", "allowed_models": ["<model>"], "allowed_tools": []}),
            message: "mint a new plan whose grant covers the request, then retry with its X-BR-Plan-Id and X-BR-Liaison".to_string(),
            wait_ms: None,
            reason: reason.map(str::to_string),
        };
        self
    }

    /// Adds a response header (ignored if the value is not a valid header value).
    pub fn push_header(&mut self, name: HeaderName, value: &str) {
        if let Ok(value) = HeaderValue::from_str(value) {
            self.push_header_value(name, value);
        }
    }

    /// Adds a header already made a value.
    pub fn push_header_value(&mut self, name: HeaderName, value: HeaderValue) {
        self.headers.push((name, value));
    }

    /// The JSON body: `{error{message,type,code,...}, recovery{...}}`.
    pub fn body(&self) -> Value {
        let mut error = Map::new();
        error.insert("message".to_string(), json!(self.message));
        error.insert("type".to_string(), json!(self.error_type));
        if let Some(code) = &self.code {
            error.insert("code".to_string(), json!(code));
        }
        if let Some(provider) = &self.provider {
            error.insert("provider".to_string(), json!(provider));
        }
        for (key, value) in &self.details {
            error.insert(key.clone(), value.clone());
        }
        let mut recovery = json!({
            "action": self.recovery.action,
            "endpoint": self.recovery.endpoint,
            "method": self.recovery.method,
            "body_template": self.recovery.body_template,
            "docs_url": self.docs_url(),
            "message": self.recovery.message,
        });
        if let Some(object) = recovery.as_object_mut() {
            if let Some(wait_ms) = self.recovery.wait_ms {
                object.insert("wait_ms".to_string(), json!(wait_ms));
            }
            if let Some(reason) = &self.recovery.reason {
                object.insert("reason".to_string(), json!(reason));
            }
        }
        json!({"error": Value::Object(error), "recovery": recovery})
    }

    fn docs_url(&self) -> String {
        format!("{DOCS_BASE_URL}#{}", self.code.as_deref().unwrap_or(self.error_type))
    }
}

impl std::ops::Deref for ApiError {
    type Target = ApiErrorParts;

    fn deref(&self) -> &ApiErrorParts {
        &self.0
    }
}

impl std::ops::DerefMut for ApiError {
    fn deref_mut(&mut self) -> &mut ApiErrorParts {
        &mut self.0
    }
}

impl Recovery {
    /// Retry or correct the same request.
    fn same_endpoint(action: &'static str, message: impl Into<String>) -> Self {
        Recovery {
            action,
            endpoint: "same".to_string(),
            method: "same",
            body_template: Value::Null,
            message: message.into(),
            wait_ms: None,
            reason: None,
        }
    }

    /// `use_alternative_model`, pointing at the runnable catalog.
    fn runnable_models(message: &str) -> Self {
        Recovery {
            action: "use_alternative_model",
            endpoint: "/v1/catalog/runnable".to_string(),
            method: "GET",
            body_template: Value::Null,
            message: message.to_string(),
            wait_ms: None,
            reason: None,
        }
    }

    /// `retry_after` with a wait.
    fn retry(message: &str, wait_ms: u64) -> Self {
        Recovery { wait_ms: Some(wait_ms), ..Recovery::same_endpoint("retry_after", message) }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut headers = HeaderMap::new();
        let recovery_headers = [
            ("x-br-recovery-action", self.recovery.action.to_string()),
            ("x-br-recovery-endpoint", self.recovery.endpoint.clone()),
            ("x-br-recovery-docs", self.docs_url()),
        ];
        for (name, value) in recovery_headers {
            if let Ok(value) = HeaderValue::from_str(&value) {
                headers.insert(HeaderName::from_static(name), value);
            }
        }
        for (name, value) in &self.headers {
            headers.insert(name.clone(), value.clone());
        }
        let body = axum::Json(self.body());
        (self.status, headers, body).into_response()
    }
}

/// The single mapping from service errors to what the edge answers.
impl From<ServiceError> for ApiError {
    fn from(error: ServiceError) -> Self {
        match error.kind {
            ErrorKind::InvalidArgument => ApiError::invalid_request(&error.reason, error.message),
            ErrorKind::Unauthenticated if error.reason.contains("agent_token") => {
                ApiError::agent_unauthenticated(&error.reason, error.message)
            }
            ErrorKind::Unauthenticated => ApiError::unauthenticated(&error.reason, error.message),
            ErrorKind::PermissionDenied => ApiError::forbidden(&error.reason, error.message),
            ErrorKind::NotFound => ApiError::not_found(&error.reason, error.message),
            ErrorKind::Conflict => ApiError::conflict(&error.reason, error.message),
            ErrorKind::ResourceExhausted if error.reason == "insufficient_budget" => ApiError::insufficient_budget(error.message),
            ErrorKind::ResourceExhausted => ApiError::rate_limited(error.message, 1000),
            ErrorKind::Unavailable => ApiError::unavailable(&error.reason, error.message),
            ErrorKind::Internal => {
                tracing::error!(reason = %error.reason, message = %error.message, "service call failed");
                ApiError::internal()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_carries_a_complete_recovery() {
        let errors = [
            ApiError::invalid_request("missing_field", "model is required"),
            ApiError::unauthenticated("invalid_api_key", "bad key"),
            ApiError::agent_unauthenticated("agent_token_expired", "expired"),
            ApiError::insufficient_budget("too little"),
            ApiError::missing_permission("config.write"),
            ApiError::not_found("user_not_found", "no such user"),
            ApiError::conflict("exists", "exists"),
            ApiError::unavailable("db_down", "down"),
            ApiError::rate_limited("slow down", 1500),
            ApiError::internal(),
        ];
        for error in errors {
            let body = error.body();
            for field in ["action", "endpoint", "method", "body_template", "docs_url", "message"] {
                assert!(body["recovery"].get(field).is_some(), "{field} missing in {body}");
            }
            assert!(body["error"]["message"].is_string());
            assert!(body["error"]["type"].is_string());
        }
    }

    #[test]
    fn rate_limit_rounds_retry_after_up_and_reports_wait_ms() {
        let error = ApiError::rate_limited("slow down", 1500);
        assert_eq!(error.body()["recovery"]["wait_ms"], 1500);
        let retry_after = error.headers.iter().find(|(name, _)| name == "retry-after").map(|(_, value)| value.clone());
        assert_eq!(retry_after, Some(HeaderValue::from_static("2")));
    }

    #[test]
    fn internal_errors_never_leak_their_message() {
        let error = ApiError::from(ServiceError::internal("password=hunter2 in the connection string"));
        assert_eq!(error.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(!error.body().to_string().contains("hunter2"));
    }

    #[test]
    fn unauthenticated_points_at_registration() {
        let body = ApiError::unauthenticated("missing_api_key", "no key").body();
        assert_eq!(body["recovery"]["action"], "authenticate");
        assert_eq!(body["recovery"]["endpoint"], "/v1/register");
        assert_eq!(body["error"]["type"], "authentication_error");
    }
}
