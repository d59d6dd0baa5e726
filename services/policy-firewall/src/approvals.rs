//! Human approvals of tool calls on the completion path: what identifies a call (its tool and the hash
//! of its canonical arguments), what reviewers may see (argument keys, never values), which tools are
//! high-risk, and the refusal a pending call answers with.

use brainstorm_common::error::{ApiError, Recovery};
use brainstorm_proto::policy::Approval;
use chrono::Duration;
use http::{HeaderName, StatusCode};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// An approved allowance lapses this long after approval.
pub const ALLOWANCE_LIFETIME: Duration = Duration::minutes(15);

/// Approval statuses.
pub const PENDING: &str = "pending";
pub const APPROVED: &str = "approved";
pub const DENIED: &str = "denied";

/// What an approval allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApprovalScope {
    /// The retry must carry the same argument hash.
    Exact,
    /// Any arguments for that tool, once.
    Tool,
}

impl ApprovalScope {
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalScope::Exact => "exact",
            ApprovalScope::Tool => "tool",
        }
    }

    /// Reads `exact` (also the default for an empty value) or `tool`.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "" | "exact" => Some(ApprovalScope::Exact),
            "tool" => Some(ApprovalScope::Tool),
            _ => None,
        }
    }
}

/// What identifies a call's arguments without keeping them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgumentFingerprint {
    /// SHA-256 hex of the canonical JSON (object keys sorted at every level, no whitespace); of the raw
    /// text when it is not JSON.
    pub hash: String,
    /// Top-level keys, sorted.
    pub keys: Vec<String>,
}

/// The fingerprint of a tool call's arguments (JSON text, as sent).
pub fn argument_fingerprint(arguments: &str) -> ArgumentFingerprint {
    match serde_json::from_str::<Value>(arguments) {
        Ok(value) => fingerprint_value(&value),
        Err(_) => ArgumentFingerprint { hash: hex::encode(Sha256::digest(arguments.as_bytes())), keys: Vec::new() },
    }
}

/// The fingerprint of parsed arguments.
pub fn fingerprint_value(arguments: &Value) -> ArgumentFingerprint {
    let mut canonical = String::new();
    write_canonical(arguments, &mut canonical);
    let mut keys: Vec<String> = arguments.as_object().map(|object| object.keys().cloned().collect()).unwrap_or_default();
    keys.sort();
    ArgumentFingerprint { hash: hex::encode(Sha256::digest(canonical.as_bytes())), keys }
}

/// Canonical JSON text: keys sorted explicitly, so the hash does not depend on how a map is ordered.
fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(object) => {
            let mut entries: Vec<(&String, &Value)> = object.iter().collect();
            entries.sort_by(|left, right| left.0.cmp(right.0));
            out.push('{');
            for (index, (key, item)) in entries.into_iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(item, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// Words that make a tool high-risk: shells, command execution and SQL.
const HIGH_RISK_WORDS: [&str; 19] = [
    "shell",
    "bash",
    "sh",
    "zsh",
    "powershell",
    "pwsh",
    "cmd",
    "terminal",
    "exec",
    "execute",
    "eval",
    "subprocess",
    "spawn",
    "command",
    "sql",
    "mysql",
    "psql",
    "postgres",
    "sqlite",
];

/// Whether approving calls of this tool needs a review note: a word of its name (split at
/// punctuation and camelCase) is a shell, exec or SQL word, or ends in `sql` (`mssql`, `runSQL`).
pub fn is_high_risk_tool(name: &str) -> bool {
    words(name).iter().any(|word| HIGH_RISK_WORDS.contains(&word.as_str()) || word.ends_with("sql"))
}

fn words(name: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut current = String::new();
    let mut previous_lower = false;
    for character in name.chars() {
        if !character.is_alphanumeric() {
            if !current.is_empty() {
                words.push(std::mem::take(&mut current));
            }
            previous_lower = false;
            continue;
        }
        if character.is_uppercase() && previous_lower && !current.is_empty() {
            words.push(std::mem::take(&mut current));
        }
        previous_lower = character.is_lowercase() || character.is_ascii_digit();
        current.extend(character.to_lowercase());
    }
    if !current.is_empty() {
        words.push(current);
    }
    words
}

/// The refusal of a call waiting for approval: 403 `approval_required` with `approval_id`,
/// `tool_name`, `surface`, `rule`, recovery `escalate` and `X-BR-Approval-Id`.
pub fn approval_required_error(approval: &Approval) -> ApiError {
    let mut error = ApiError::forbidden(
        "approval_required",
        format!("calling `{}` needs a human approval; retry once approval `{}` is approved", approval.tool_name, approval.id),
    );
    error.status = StatusCode::FORBIDDEN;
    error.error_type = "approval_required";
    error.details.insert("approval_id".to_string(), json!(approval.id));
    error.details.insert("tool_name".to_string(), json!(approval.tool_name));
    error.details.insert("surface".to_string(), json!(approval.surface));
    error.details.insert("rule".to_string(), json!(approval.rule_id));
    error.recovery = Recovery {
        action: "escalate",
        endpoint: format!("/v1/approvals/{}/approve", approval.id),
        method: "POST",
        body_template: json!({"scope": "exact", "note": "<review note>"}),
        message: "ask a reviewer with approvals.write to approve the call, then retry the same request within 15 minutes".to_string(),
        wait_ms: None,
        reason: None,
    };
    error.push_header(HeaderName::from_static("x-br-approval-id"), &approval.id);
    error
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_ignores_key_order_and_whitespace_but_not_values() {
        let first = argument_fingerprint(r#"{"b": 1, "a": {"y": [1, 2], "x": "s"}}"#);
        let second = argument_fingerprint(r#"{"a":{"x":"s","y":[1,2]},"b":1}"#);
        assert_eq!(first, second);
        assert_eq!(first.keys, vec!["a", "b"]);
        assert_ne!(first.hash, argument_fingerprint(r#"{"a":{"x":"s","y":[2,1]},"b":1}"#).hash);
        let raw = argument_fingerprint("not json");
        assert_eq!(raw.keys, Vec::<String>::new());
        assert_eq!(raw.hash.len(), 64);
    }

    #[test]
    fn shell_sql_and_exec_tools_are_high_risk() {
        for tool in ["shell", "run_shell", "bash", "execSQL", "runSql", "mssql_query", "execute_command", "Terminal", "python-eval"] {
            assert!(is_high_risk_tool(tool), "{tool}");
        }
        for tool in ["search_web", "publish_post", "get_weather", "send_email", "sharepoint_list", "execution_report_pdf", "search_query"] {
            assert!(!is_high_risk_tool(tool), "{tool}");
        }
    }

    #[test]
    fn scopes_default_to_exact() {
        assert_eq!(ApprovalScope::parse(""), Some(ApprovalScope::Exact));
        assert_eq!(ApprovalScope::parse("tool"), Some(ApprovalScope::Tool));
        assert_eq!(ApprovalScope::parse("forever"), None);
    }

    #[test]
    fn a_pending_call_answers_approval_required() {
        let approval = Approval {
            id: "ap-1".to_string(),
            tool_name: "create_payment".to_string(),
            surface: "chat_completions".to_string(),
            rule_id: Some("l3-approve-payments".to_string()),
            ..Approval::default()
        };
        let error = approval_required_error(&approval);
        let body = error.body();
        assert_eq!(error.status, StatusCode::FORBIDDEN);
        assert_eq!(body["error"]["type"], "approval_required");
        assert_eq!(body["error"]["approval_id"], "ap-1");
        assert_eq!(body["error"]["rule"], "l3-approve-payments");
        assert_eq!(body["recovery"]["action"], "escalate");
        assert!(error.headers.iter().any(|(name, value)| name.as_str() == "x-br-approval-id" && value.to_str().ok() == Some("ap-1")));
    }
}
