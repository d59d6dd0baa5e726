//! OAuth (PKCE, S256): a tenant registers apps; the consent is given with the dashboard user's JWT
//! (an identity-provider user who claimed the tenant, `X-BR-Tenant-Id` choosing among several, whose
//! role holds `config.write`) or a tenant key holding `config.write`; the app trades the code and its
//! verifier for an API key limited to the granted scopes.

use crate::extract::{Path, Query};
use axum::Json;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use brainstorm_common::ApiError;
use brainstorm_proto::identity::*;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::EdgeState;
use crate::auth::Caller;
use crate::extract::JsonBody;
use crate::routes::bridge::DashboardCaller;

fn app_view(app: &OAuthApp) -> Value {
    json!({
        "client_id": app.client_id,
        "name": app.name,
        "callback_urls": app.callback_urls,
        "scopes": app.scopes,
        "created_at": app.created_at,
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppBody {
    name: Option<String>,
    callback_urls: Option<Vec<String>>,
    scopes: Option<Vec<String>>,
}

/// `POST /v1/oauth/apps` (config.write): `{name, callback_urls, scopes?}`; 201 with the app and its
/// `client_id` (`br_app_...`; no secret exists: PKCE proves the client).
pub async fn create_app(
    State(state): State<EdgeState>,
    caller: Caller,
    JsonBody(body): JsonBody<AppBody>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    caller.require("config.write")?;
    let request = CreateOAuthAppRequest {
        tenant_id: caller.tenant_id()?.to_string(),
        name: body.name.unwrap_or_default(),
        callback_urls: body.callback_urls.unwrap_or_default(),
        scopes: body.scopes.unwrap_or_default(),
        created_by: caller.identity.key_id.clone(),
    };
    let app = state.identity.create_oauth_app(request).await?;
    Ok((StatusCode::CREATED, Json(app_view(&app))))
}

/// `GET /v1/oauth/apps` (config.read): the tenant's apps.
pub async fn list_apps(State(state): State<EdgeState>, caller: Caller) -> Result<Json<Value>, ApiError> {
    caller.require("config.read")?;
    let list = state.identity.list_oauth_apps(TenantRef { tenant_id: caller.tenant_id()?.to_string() }).await?;
    Ok(Json(json!({"apps": list.apps.iter().map(app_view).collect::<Vec<_>>(), "total": list.apps.len()})))
}

/// `DELETE /v1/oauth/apps/{id}` (config.write): the app and its unused codes go; keys already issued
/// stay until revoked or expired.
pub async fn delete_app(State(state): State<EdgeState>, caller: Caller, Path(client_id): Path<String>) -> Result<Json<Value>, ApiError> {
    caller.require("config.write")?;
    let app = state.identity.delete_oauth_app(OAuthAppRef { tenant_id: caller.tenant_id()?.to_string(), client_id }).await?;
    Ok(Json(json!({"deleted": true, "client_id": app.client_id})))
}

#[derive(Deserialize)]
pub struct AuthorizeQuery {
    client_id: Option<String>,
    redirect_uri: Option<String>,
    code_challenge: Option<String>,
    code_challenge_method: Option<String>,
    scope: Option<String>,
    state: Option<String>,
}

/// A required, non-empty parameter (OAuth's `invalid_request` when missing).
fn required(name: &str, value: Option<String>) -> Result<String, ApiError> {
    value.filter(|value| !value.is_empty()).ok_or_else(|| ApiError::invalid_request("invalid_request", format!("{name} is required")))
}

/// The authorization request's parameters, checked: S256 only, scopes space- or plus-separated.
struct Authorization {
    client_id: String,
    redirect_uri: String,
    code_challenge: String,
    scopes: Vec<String>,
    state: Option<String>,
}

impl AuthorizeQuery {
    fn checked(self) -> Result<Authorization, ApiError> {
        let method = self.code_challenge_method.unwrap_or_default();
        if method != "S256" {
            return Err(ApiError::invalid_request("invalid_request", "code_challenge_method must be S256 (plain is not accepted)"));
        }
        Ok(Authorization {
            client_id: required("client_id", self.client_id)?,
            redirect_uri: required("redirect_uri", self.redirect_uri)?,
            code_challenge: required("code_challenge", self.code_challenge)?,
            scopes: self.scope.unwrap_or_default().split([' ', '+']).filter(|scope| !scope.is_empty()).map(str::to_string).collect(),
            state: self.state,
        })
    }
}

/// `GET /auth/oauth/authorize` (a tenant key with config.write): what the approval would grant, for
/// the consent screen: the app, the scopes and the permissions they give, the redirect.
pub async fn authorize_view(
    State(state): State<EdgeState>,
    DashboardCaller(caller): DashboardCaller,
    Query(query): Query<AuthorizeQuery>,
) -> Result<Json<Value>, ApiError> {
    caller.require("config.write")?;
    let request = query.checked()?;
    let app = state.identity.get_oauth_app(OAuthClientRef { client_id: request.client_id.clone() }).await?;
    if !app.callback_urls.contains(&request.redirect_uri) {
        return Err(ApiError::invalid_request("invalid_redirect_uri", "redirect_uri is not one of the app's callback URLs"));
    }
    let scopes = if request.scopes.is_empty() { app.scopes.clone() } else { request.scopes };
    if let Some(unknown) = scopes.iter().find(|scope| !app.scopes.contains(scope)) {
        return Err(ApiError::invalid_request("invalid_scope", format!("the app did not register scope `{unknown}`")));
    }
    Ok(Json(json!({
        "app": {"client_id": app.client_id, "name": app.name},
        "tenant_id": caller.tenant_id()?,
        "scopes": scopes,
        "redirect_uri": request.redirect_uri,
        "approve": {"method": "POST", "endpoint": "/auth/oauth/authorize"},
    })))
}

/// `POST /auth/oauth/authorize` (a tenant key with config.write), the same query: approves, and
/// answers 302 to `redirect_uri?code=...` (with `state` when given). The code is single use, for ten
/// minutes; the key it buys holds at most the approving key's permissions.
pub async fn authorize(
    State(state): State<EdgeState>,
    DashboardCaller(caller): DashboardCaller,
    Query(query): Query<AuthorizeQuery>,
) -> Result<Response, ApiError> {
    caller.require("config.write")?;
    let request = query.checked()?;
    let issued = state
        .identity
        .issue_oauth_code(IssueOAuthCodeRequest {
            client_id: request.client_id,
            tenant_id: caller.tenant_id()?.to_string(),
            redirect_uri: request.redirect_uri.clone(),
            code_challenge: request.code_challenge,
            scopes: request.scopes,
            authorizer_permissions: caller.identity.permissions.iter().cloned().collect(),
            authorized_by: caller.identity.key_id.clone(),
        })
        .await?;
    let separator = if request.redirect_uri.contains('?') { '&' } else { '?' };
    let mut location = format!("{}{separator}code={}", request.redirect_uri, issued.code);
    if let Some(client_state) = request.state.filter(|value| !value.is_empty()) {
        location.push_str("&state=");
        location.push_str(&percent_encode(&client_state));
    }
    let location =
        HeaderValue::from_str(&location).map_err(|_| ApiError::invalid_request("invalid_request", "state cannot be carried in a URL"))?;
    let mut response =
        (StatusCode::FOUND, Json(json!({"code": issued.code, "expires_at": issued.expires_at, "scopes": issued.scopes}))).into_response();
    response.headers_mut().insert(header::LOCATION, location);
    Ok(response)
}

/// `value` with every byte outside RFC 3986's unreserved set percent-encoded.
fn percent_encode(value: &str) -> String {
    value
        .bytes()
        .map(|byte| {
            if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
                (byte as char).to_string()
            } else {
                format!("%{byte:02X}")
            }
        })
        .collect()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenBody {
    grant_type: Option<String>,
    code: Option<String>,
    redirect_uri: Option<String>,
    code_verifier: Option<String>,
    client_id: Option<String>,
}

/// `POST /auth/oauth/token` (no authentication: the verifier proves the client): `{grant_type:
/// authorization_code, code, redirect_uri, code_verifier, client_id}` -> `{key, scopes, expires_at}`,
/// an API key of the approving tenant for 90 days.
pub async fn token(State(state): State<EdgeState>, JsonBody(body): JsonBody<TokenBody>) -> Result<Json<Value>, ApiError> {
    if body.grant_type.as_deref() != Some("authorization_code") {
        return Err(ApiError::invalid_request("unsupported_grant_type", "grant_type must be authorization_code"));
    }
    let request = RedeemOAuthCodeRequest {
        client_id: required("client_id", body.client_id)?,
        code: required("code", body.code)?,
        redirect_uri: required("redirect_uri", body.redirect_uri)?,
        code_verifier: required("code_verifier", body.code_verifier)?,
    };
    let token = state.identity.redeem_oauth_code(request).await?;
    Ok(Json(json!({"key": token.key, "scopes": token.scopes, "expires_at": token.expires_at, "key_id": token.key_id})))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_is_percent_encoded_and_scopes_split_on_spaces_and_pluses() {
        assert_eq!(percent_encode("a b&c=d/é"), "a%20b%26c%3Dd%2F%C3%A9");
        let query = AuthorizeQuery {
            client_id: Some("br_app_1".into()),
            redirect_uri: Some("https://app.example/cb".into()),
            code_challenge: Some("x".into()),
            code_challenge_method: Some("S256".into()),
            scope: Some("completions+models memory".into()),
            state: None,
        };
        let checked = query.checked().map(|request| request.scopes);
        assert_eq!(checked.ok(), Some(vec!["completions".to_string(), "models".to_string(), "memory".to_string()]));
        let plain = AuthorizeQuery {
            client_id: Some("br_app_1".into()),
            redirect_uri: Some("https://app.example/cb".into()),
            code_challenge: Some("x".into()),
            code_challenge_method: Some("plain".into()),
            scope: None,
            state: None,
        };
        assert!(plain.checked().is_err());
    }
}
