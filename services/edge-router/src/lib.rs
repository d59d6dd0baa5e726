//! The public REST edge: authentication, RBAC, the identity and admin endpoints, and completions in the
//! OpenAI and Anthropic formats. Handlers stay thin: extract, call a service client, map the error.

mod auth;
mod extract;
mod routes;
mod sandbox;
mod views;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{Method, Uri};
use axum::routing::{delete, get, post};
use brainstorm_common::ApiError;
use brainstorm_common::config::Secret;
use brainstorm_proto::identity::IdentityClient;

pub use auth::Authenticator;

/// Largest request body accepted (long prompts and tool schemas fit comfortably).
const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

/// How the edge is set up.
#[derive(Debug, Clone)]
pub struct EdgeOptions {
    pub platform_admin_key: Option<Secret>,
    /// How long a resolved key is trusted without asking identity again.
    pub auth_cache_ttl: Duration,
}

/// Everything a handler can reach.
#[derive(Clone)]
pub struct EdgeState {
    identity: IdentityClient,
    authenticator: Arc<Authenticator>,
}

/// The edge's router and its authenticator (whose cache the caller keeps fresh from the bus).
pub fn edge_router(identity: IdentityClient, options: &EdgeOptions) -> (Router, Arc<Authenticator>) {
    let authenticator = Arc::new(Authenticator::new(identity.clone(), options.platform_admin_key.as_ref(), options.auth_cache_ttl));
    let state = EdgeState { identity, authenticator: authenticator.clone() };
    let router = Router::new()
        .route("/health", get(routes::health))
        .route("/v1/register", post(routes::identity::register))
        .route("/v1/account", get(routes::identity::get_account).patch(routes::identity::update_account))
        .route("/v1/account/users", get(routes::identity::list_users))
        .route("/v1/account/users/invite", post(routes::identity::invite_user))
        .route("/v1/account/users/{id}", delete(routes::identity::delete_user))
        .route("/v1/tenant/claim-link", post(routes::identity::create_claim_link))
        .route("/v1/api-keys", post(routes::identity::create_api_key).get(routes::identity::list_api_keys))
        .route("/v1/api-keys/{id}", delete(routes::identity::revoke_api_key))
        .route("/v1/admin/tenants", get(routes::admin::list_tenants))
        .route("/v1/admin/tenants/{id}", get(routes::admin::get_tenant))
        .route("/v1/admin/tenants/{id}/approve", post(routes::admin::approve_tenant))
        .route("/v1/admin/tenants/{id}/reject", post(routes::admin::reject_tenant))
        .route("/v1/admin/invite-codes", post(routes::admin::create_invite_code).get(routes::admin::list_invite_codes))
        .route("/v1/admin/invite-codes/{id}", delete(routes::admin::delete_invite_code))
        .route("/v1/admin/digest", get(routes::admin::digest))
        .route("/v1/chat/completions", post(routes::completions::chat_completions))
        .route("/v1/messages", post(routes::completions::messages))
        .route("/v1/models", get(routes::completions::list_models))
        .fallback(route_not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn(extract::assign_request_id))
        .with_state(state);
    (router, authenticator)
}

async fn route_not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::route_not_found(method.as_str(), uri.path())
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::method_not_allowed(method.as_str(), uri.path())
}
