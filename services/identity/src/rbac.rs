//! Roles and permissions: which permissions a key's role and scopes grant.

use std::collections::BTreeSet;

/// Roles a tenant key or user can hold, most powerful first.
pub const ROLES: [&str; 5] = ["admin", "operator", "developer", "agent", "auditor"];

/// Permissions that only the platform administrator holds; no tenant key can be granted them.
pub const PLATFORM_PERMISSIONS: [&str; 3] = ["admin.read", "admin.write", "platform.admin"];

/// Every tenant-grantable permission.
pub const TENANT_PERMISSIONS: [&str; 13] = [
    "config.read",
    "config.write",
    "router.read",
    "router.write",
    "security.read",
    "security.write",
    "governance.read",
    "approvals.write",
    "agent.profile.read",
    "agent.lifecycle.manage",
    "audit.read",
    "memory.read",
    "memory.write",
];

/// The permissions a role grants.
pub fn role_permissions(role: &str) -> Option<&'static [&'static str]> {
    let permissions: &'static [&'static str] = match role {
        "admin" => &TENANT_PERMISSIONS,
        "operator" => &[
            "config.read",
            "config.write",
            "router.read",
            "router.write",
            "security.read",
            "governance.read",
            "agent.profile.read",
            "agent.lifecycle.manage",
            "audit.read",
            "memory.read",
            "memory.write",
        ],
        "developer" => &["config.read", "router.read", "router.write", "memory.read", "memory.write"],
        "agent" => &["router.read", "router.write", "memory.read", "memory.write"],
        "auditor" => &["config.read", "router.read", "security.read", "governance.read", "audit.read", "agent.profile.read"],
        _ => return None,
    };
    Some(permissions)
}

/// Why a scope list was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScopeError {
    #[error("unknown scope `{0}`: use a role ({roles}) or a permission", roles = ROLES.join(", "))]
    Unknown(String),
    #[error("scope `{0}` is reserved to the platform administrator")]
    Reserved(String),
}

/// The permissions granted by a list of scopes, each a role name or a single permission.
pub fn resolve_permissions<S: AsRef<str>>(scopes: &[S]) -> Result<BTreeSet<String>, ScopeError> {
    let mut granted = BTreeSet::new();
    for scope in scopes {
        let scope = scope.as_ref();
        if let Some(permissions) = role_permissions(scope) {
            granted.extend(permissions.iter().map(|permission| permission.to_string()));
        } else if TENANT_PERMISSIONS.contains(&scope) {
            granted.insert(scope.to_string());
        } else if PLATFORM_PERMISSIONS.contains(&scope) {
            return Err(ScopeError::Reserved(scope.to_string()));
        } else {
            return Err(ScopeError::Unknown(scope.to_string()));
        }
    }
    Ok(granted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_grant_what_the_spec_requires() -> Result<(), ScopeError> {
        let admin = resolve_permissions(&["admin"])?;
        let operator = resolve_permissions(&["operator"])?;
        let developer = resolve_permissions(&["developer"])?;
        let auditor = resolve_permissions(&["auditor"])?;
        // PUT /v1/aliases and POST /v1/api-keys need config.write: admin and operator only.
        assert!(admin.contains("config.write") && operator.contains("config.write"));
        assert!(!developer.contains("config.write") && !auditor.contains("config.write"));
        // Completions need router.write, models need router.read.
        assert!(developer.contains("router.write") && resolve_permissions(&["agent"])?.contains("router.write"));
        assert!(!auditor.contains("router.write") && auditor.contains("router.read"));
        // Every role's permissions are within admin's.
        for role in ROLES {
            assert!(resolve_permissions(&[role])?.is_subset(&admin), "{role}");
        }
        Ok(())
    }

    #[test]
    fn scopes_mix_roles_and_permissions_and_refuse_the_rest() {
        let granted = resolve_permissions(&["auditor", "memory.write"]).unwrap_or_default();
        assert!(granted.contains("audit.read") && granted.contains("memory.write"));
        assert_eq!(resolve_permissions(&["superuser"]), Err(ScopeError::Unknown("superuser".to_string())));
        assert_eq!(resolve_permissions(&["platform.admin"]), Err(ScopeError::Reserved("platform.admin".to_string())));
    }
}
