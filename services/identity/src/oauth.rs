//! OAuth (PKCE, S256) rules: the scopes an app may ask for and the permissions each grants, callback
//! URLs, and the code verifier's check.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest, Sha256};

/// Scopes an app may ask for.
pub const SCOPES: [&str; 6] = ["completions", "models", "memory", "embeddings", "usage", "full"];
/// Scopes of an app registered without any.
pub const DEFAULT_SCOPES: [&str; 2] = ["completions", "models"];
/// Prefix of a client id.
pub const CLIENT_ID_PREFIX: &str = "br_app_";
/// Prefix of an authorization code.
pub const CODE_PREFIX: &str = "brac_";
/// Most callback URLs an app registers.
pub const MAX_CALLBACK_URLS: usize = 10;

/// The permissions `scope` grants; `full` grants every permission the approving key holds.
pub fn scope_permissions<'a>(scope: &str, authorizer: &'a [String]) -> Vec<&'a str> {
    let wanted: &[&str] = match scope {
        "completions" | "embeddings" => &["router.write"],
        "models" => &["router.read"],
        "memory" => &["memory.read", "memory.write"],
        "usage" => &["config.read"],
        "full" => return authorizer.iter().map(String::as_str).collect(),
        _ => &[],
    };
    authorizer.iter().map(String::as_str).filter(|permission| wanted.contains(permission)).collect()
}

/// The permissions an issued key holds for `scopes`, within the approving key's, sorted and once each.
pub fn granted_permissions(scopes: &[String], authorizer: &[String]) -> Vec<String> {
    let mut granted: Vec<String> = scopes.iter().flat_map(|scope| scope_permissions(scope, authorizer)).map(str::to_string).collect();
    granted.sort();
    granted.dedup();
    granted
}

/// The scopes asked for, checked: each known, once; empty takes `default`.
pub fn checked_scopes(asked: &[String], default: &[&str]) -> Result<Vec<String>, String> {
    if asked.is_empty() {
        return Ok(default.iter().map(|scope| scope.to_string()).collect());
    }
    let mut scopes = Vec::new();
    for scope in asked {
        if !SCOPES.contains(&scope.as_str()) {
            return Err(format!("unknown scope `{scope}`: use {}", SCOPES.join(", ")));
        }
        if !scopes.contains(scope) {
            scopes.push(scope.clone());
        }
    }
    Ok(scopes)
}

/// A callback URL: `https://`, or `http://` to a loopback host (a native app's local listener), no
/// fragment.
pub fn valid_callback_url(url: &str) -> bool {
    let (https, rest) = match (url.strip_prefix("https://"), url.strip_prefix("http://")) {
        (Some(rest), _) => (true, rest),
        (None, Some(rest)) => (false, rest),
        (None, None) => return false,
    };
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    // A user part would let `https://trusted@evil` read as trusted.
    if authority.contains('@') || authority.is_empty() {
        return false;
    }
    let host = if authority.starts_with('[') {
        authority.split_inclusive(']').next().unwrap_or_default()
    } else {
        authority.split(':').next().unwrap_or_default()
    };
    let loopback = matches!(host, "localhost" | "127.0.0.1" | "[::1]");
    let printable = url.bytes().all(|byte| byte.is_ascii_graphic());
    (https || loopback) && !host.is_empty() && printable && !url.contains('#') && url.len() <= 2048
}

/// A PKCE code verifier (RFC 7636: 43 to 128 of `A-Z a-z 0-9 - . _ ~`).
pub fn valid_verifier(verifier: &str) -> bool {
    (43..=128).contains(&verifier.len())
        && verifier.bytes().all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~'))
}

/// An S256 code challenge: 43 base64url characters (a SHA-256 digest).
pub fn valid_challenge(challenge: &str) -> bool {
    challenge.len() == 43 && challenge.bytes().all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_'))
}

/// Whether `verifier` is the one the S256 `challenge` was made from.
pub fn verifier_matches(verifier: &str, challenge: &str) -> bool {
    let computed = URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()));
    crate::secrets::digests_match(&computed, challenge)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|item| item.to_string()).collect()
    }

    #[test]
    fn the_rfc_7636_example_verifies() {
        // RFC 7636, appendix B.
        let verifier = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";
        let challenge = "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM";
        assert!(valid_verifier(verifier) && valid_challenge(challenge));
        assert!(verifier_matches(verifier, challenge));
        assert!(!verifier_matches("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXK", challenge));
        assert!(!valid_verifier("short") && !valid_challenge("plain-text-challenge"));
    }

    #[test]
    fn scopes_grant_no_more_than_the_approving_key_holds() {
        let developer = strings(&["config.read", "memory.read", "memory.write", "router.read", "router.write"]);
        assert_eq!(granted_permissions(&strings(&["completions", "models"]), &developer), strings(&["router.read", "router.write"]));
        assert_eq!(granted_permissions(&strings(&["full"]), &developer), developer);
        let auditor = strings(&["config.read", "router.read"]);
        assert_eq!(granted_permissions(&strings(&["completions", "usage"]), &auditor), strings(&["config.read"]));
        assert_eq!(checked_scopes(&[], &DEFAULT_SCOPES), Ok(strings(&["completions", "models"])));
        assert!(checked_scopes(&strings(&["admin"]), &DEFAULT_SCOPES).is_err());
        assert_eq!(checked_scopes(&strings(&["memory", "memory"]), &DEFAULT_SCOPES), Ok(strings(&["memory"])));
    }

    #[test]
    fn callbacks_are_https_or_loopback() {
        assert!(valid_callback_url("https://app.example.com/callback"));
        assert!(valid_callback_url("http://127.0.0.1:8976/callback"));
        assert!(valid_callback_url("http://localhost/cb"));
        assert!(!valid_callback_url("http://app.example.com/callback"));
        assert!(!valid_callback_url("https://app.example.com/cb#fragment"));
        assert!(!valid_callback_url("javascript:alert(1)"));
        assert!(!valid_callback_url("https://trusted.example@evil.example/cb"));
        assert!(valid_callback_url("http://[::1]:9000/cb"));
    }
}
