//! Fan-out events: what a settlement or an audit record becomes, and its OCSF 1.3.0 form.
//!
//! Types and names (dot-delimited, for filter globs):
//! - `usage`: every settlement, named `usage.<outcome>` (`usage.succeeded`, `usage.failed`, ...).
//! - `guardrail`: an audit record denied by a guardrail, the tool firewall, a policy or an approval
//!   rule, named `guardrail.<reason_code>`.
//! - `error`: an audit record whose outcome is `error`, named `error.<reason_code>`.
//! - `audit`: every other audit record, named `audit.<outcome>[.<reason_code>]`, and each
//!   control-plane action (`audit.<action>`: `audit.agent_certificate.revoked`,
//!   `audit.kill_switch.activated`, ...).
//!
//! Severities (OCSF's 1 Informational to 5 Critical): allowed requests and usage 1, errors 2, other
//! denials 3 (budget, rate limits, permissions), guardrail denials 4, the kill switch 5.

use brainstorm_common::money::Usd;
use brainstorm_proto::audit::AuditRecord;
use brainstorm_proto::budget::{Settlement, budget_event};
use serde_json::{Value, json};

/// The event types destinations may subscribe to.
pub const EVENT_TYPES: [&str; 5] = ["usage", "audit", "quality", "guardrail", "error"];

/// One event on its way to destinations.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub tenant_id: String,
    pub event_type: &'static str,
    pub name: String,
    pub severity: u8,
    /// RFC 3339.
    pub timestamp: String,
    pub request_id: String,
    pub data: Value,
}

impl Event {
    /// The JSON a destination receives (outside OCSF).
    pub fn to_json(&self) -> Value {
        json!({
            "event_type": self.event_type,
            "event": self.name,
            "severity": self.severity,
            "timestamp": self.timestamp,
            "tenant_id": self.tenant_id,
            "request_id": self.request_id,
            "data": self.data,
        })
    }
}

fn usd(nanos: i64) -> Value {
    Usd::from_nanos(nanos).to_json()
}

/// A settlement as a `usage` event.
pub fn from_settlement(settlement: &Settlement) -> Event {
    Event {
        tenant_id: settlement.tenant_id.clone(),
        event_type: "usage",
        name: format!("usage.{}", settlement.outcome),
        severity: 1,
        timestamp: settlement.occurred_at.clone(),
        request_id: settlement.request_id.clone(),
        data: json!({
            "key_id": settlement.key_id,
            "agent_id": settlement.agent_id,
            "model": settlement.model,
            "provider": settlement.provider,
            "input_tokens": settlement.input_tokens,
            "output_tokens": settlement.output_tokens,
            "cost_usd": usd(settlement.cost_nanos),
            "outcome": settlement.outcome,
            "latency_ms": settlement.latency_ms,
        }),
    }
}

/// An evaluation run as a `quality` event: `quality.evaluation.passed` when every case passed,
/// `quality.evaluation.failed` (severity 3) when some did not.
pub fn from_quality(event: &brainstorm_proto::observability::QualityEvent) -> Event {
    let outcome = if event.fail_count == 0 { "passed" } else { "failed" };
    Event {
        tenant_id: event.tenant_id.clone(),
        event_type: "quality",
        name: format!("quality.evaluation.{outcome}"),
        severity: if event.fail_count == 0 { 1 } else { 3 },
        timestamp: event.occurred_at.clone(),
        request_id: event.run_id.clone(),
        data: json!({
            "run_id": event.run_id,
            "prompt_id": event.prompt_id,
            "version": event.version,
            "scorer": event.scorer,
            "model": (!event.model.is_empty()).then_some(&event.model),
            "test_case_count": event.test_case_count,
            "pass_count": event.pass_count,
            "fail_count": event.fail_count,
            "avg_score": event.avg_score,
            "key_id": event.key_id,
        }),
    }
}

/// A control-plane action `actor` (`key:<id>`, `agent:<id>`, `kubernetes:<namespace>/<name>`) took
/// now on `subject`, at `severity` (1 to 5), as the edge and the operator hand it to `RecordEvents`.
pub fn activity(
    tenant_id: &str,
    action: &str,
    actor: String,
    subject: &str,
    severity: u32,
) -> brainstorm_proto::observability::ActivityEvent {
    brainstorm_proto::observability::ActivityEvent {
        tenant_id: tenant_id.to_string(),
        action: action.to_string(),
        actor,
        subject: subject.to_string(),
        occurred_at: brainstorm_common::time::now_timestamp(),
        severity,
        ..Default::default()
    }
}

/// Hands a control-plane action to the fan-out, off the caller's path (a slow or absent fan-out
/// holds nothing up; a failure is logged, the action stands).
pub fn announce(
    observability: &brainstorm_proto::observability::ObservabilityFanoutClient,
    event: brainstorm_proto::observability::ActivityEvent,
) {
    let observability = observability.clone();
    tokio::spawn(async move {
        let action = event.action.clone();
        let events = brainstorm_proto::observability::FanoutEvents { activity_events: vec![event], ..Default::default() };
        if let Err(error) = observability.record_events(events).await {
            tracing::warn!(%error, %action, "a control-plane action could not be handed to the fan-out");
        }
    });
}

/// A tenant moved from status `from` to `to` (`active`, `pending`, `rejected`): severity 4 when it
/// leaves `active` (every key of the tenant stops), 1 otherwise.
pub fn tenant_status_changed(tenant_id: &str, actor: String, from: &str, to: &str) -> brainstorm_proto::observability::ActivityEvent {
    let severity = if from == "active" && to != "active" { 4 } else { 1 };
    let mut event = activity(tenant_id, "tenant.status_changed", actor, tenant_id, severity);
    event.data_json = json!({"from": from, "status": to}).to_string();
    event
}

/// A control-plane action as an `audit` event named `audit.<action>`, graded as its source says
/// (1 to 5); its data: actor, subject, reason and the action's own members.
pub fn from_activity(event: &brainstorm_proto::observability::ActivityEvent) -> Event {
    let mut data = serde_json::from_str::<serde_json::Map<String, Value>>(&event.data_json).unwrap_or_default();
    data.insert("actor".to_string(), json!(event.actor));
    data.insert("subject".to_string(), json!(event.subject));
    data.insert("reason".to_string(), if event.reason.is_empty() { Value::Null } else { json!(event.reason) });
    data.insert("outcome".to_string(), json!("succeeded"));
    Event {
        tenant_id: event.tenant_id.clone(),
        event_type: "audit",
        name: format!("audit.{}", event.action),
        severity: u8::try_from(event.severity.clamp(1, 5)).unwrap_or(1),
        timestamp: event.occurred_at.clone(),
        request_id: format!("{}:{}", event.action, event.subject),
        data: Value::Object(data),
    }
}

/// The settlement in a budget event, as an event (other budget events are not fanned out).
pub fn from_budget_event(event: &brainstorm_proto::budget::BudgetEvent) -> Option<Event> {
    match &event.kind {
        Some(budget_event::Kind::Settlement(settlement)) => Some(from_settlement(settlement)),
        _ => None,
    }
}

/// Whether a denial's reason is a guardrail's (guardrails, the tool firewall, policies, approvals).
fn is_guardrail(reason: &str) -> bool {
    ["guardrail", "firewall", "tool", "policy", "approval", "prompt_injection", "pii", "secret", "content_filter"]
        .iter()
        .any(|marker| reason.contains(marker))
}

/// An audit record as an `audit`, `guardrail` or `error` event.
pub fn from_audit(record: &AuditRecord) -> Event {
    let reason = record.reason_code.as_str();
    let (event_type, name, severity) = match record.outcome.as_str() {
        // A kill switch refuses with 503, which the record keeps as an error: it is a denial.
        _ if reason == "kill_switch_active" => ("audit", format!("audit.denied.{reason}"), 5),
        "error" => ("error", format!("error.{}", if reason.is_empty() { "unknown" } else { reason }), 2),
        "denied" if is_guardrail(reason) => ("guardrail", format!("guardrail.{reason}"), 4),
        "denied" => ("audit", format!("audit.denied.{}", if reason.is_empty() { "unknown" } else { reason }), 3),
        outcome => ("audit", format!("audit.{outcome}"), 1),
    };
    Event {
        tenant_id: record.tenant_id.clone(),
        event_type,
        name,
        severity,
        timestamp: record.occurred_at.clone(),
        request_id: record.request_id.clone(),
        data: json!({
            "endpoint": record.endpoint,
            "key_id": record.key_id,
            "agent_id": record.agent_id,
            "model_requested": record.model_requested,
            "model_executed": record.model_executed,
            "provider": record.provider,
            "outcome": record.outcome,
            "reason_code": record.reason_code,
            "input_tokens": record.input_tokens,
            "output_tokens": record.output_tokens,
            "cost_usd": usd(record.cost_nanos),
            "latency_ms": record.latency_ms,
        }),
    }
}

/// The synthetic event a destination test sends.
pub fn synthetic_usage(tenant_id: &str) -> Event {
    Event {
        tenant_id: tenant_id.to_string(),
        event_type: "usage",
        name: "usage.test".to_string(),
        severity: 1,
        timestamp: brainstorm_common::time::now_timestamp(),
        request_id: format!("req_test_{}", uuid::Uuid::new_v4().simple()),
        data: json!({
            "synthetic": true,
            "model": "brainstorm/sandbox",
            "provider": "brainstorm",
            "input_tokens": 12,
            "output_tokens": 34,
            "cost_usd": 0,
            "outcome": "succeeded",
        }),
    }
}

const SEVERITIES: [&str; 6] = ["Unknown", "Informational", "Low", "Medium", "High", "Critical"];

/// The event as OCSF 1.3.0 API Activity (class 6003): the request as the API call, the key and
/// agent as the actor, the outcome as the status, the rest unmapped.
pub fn ocsf(event: &Event) -> Value {
    let time = brainstorm_common::time::parse_timestamp(&event.timestamp).map(|instant| instant.timestamp_millis()).unwrap_or_default();
    let outcome = event.data.get("outcome").and_then(Value::as_str).unwrap_or_default();
    let (status_id, status) = match outcome {
        "allowed" | "succeeded" => (1, "Success"),
        "" => (0, "Unknown"),
        _ => (2, "Failure"),
    };
    let severity = usize::from(event.severity.min(5));
    json!({
        "class_uid": 6003,
        "class_name": "API Activity",
        "category_uid": 6,
        "category_name": "Application Activity",
        "activity_id": 99,
        "activity_name": event.event_type,
        "type_uid": 600399,
        "type_name": "API Activity: Other",
        "severity_id": severity,
        "severity": SEVERITIES[severity],
        "status_id": status_id,
        "status": status,
        "status_code": event.data.get("reason_code").and_then(Value::as_str).unwrap_or_default(),
        "time": time,
        "message": event.name,
        "metadata": {
            "version": "1.3.0",
            "uid": event.request_id,
            "event_code": event.name,
            "tenant_uid": event.tenant_id,
            "product": {"name": "Brainstorm", "vendor_name": "Brainstorm", "version": env!("CARGO_PKG_VERSION")},
        },
        "api": {
            "operation": event.data.get("endpoint").and_then(Value::as_str).unwrap_or("/v1/chat/completions"),
            "request": {"uid": event.request_id},
            "service": {"name": "brainstorm-gateway"},
        },
        "actor": {
            "user": {"uid": event.data.get("key_id").cloned().unwrap_or(Value::Null), "type": "API key"},
            "app_name": event.data.get("agent_id").cloned().unwrap_or(Value::Null),
        },
        "unmapped": event.data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(outcome: &str, reason: &str) -> AuditRecord {
        AuditRecord {
            tenant_id: "t1".into(),
            request_id: "req_1".into(),
            outcome: outcome.into(),
            reason_code: reason.into(),
            occurred_at: "2026-11-29T10:00:00.000Z".into(),
            ..AuditRecord::default()
        }
    }

    #[test]
    fn audit_records_are_typed_named_and_graded() {
        let graded = |outcome: &str, reason: &str| {
            let event = from_audit(&record(outcome, reason));
            (event.event_type, event.name, event.severity)
        };
        assert_eq!(graded("allowed", ""), ("audit", "audit.allowed".to_string(), 1));
        assert_eq!(graded("denied", "budget_exceeded"), ("audit", "audit.denied.budget_exceeded".to_string(), 3));
        assert_eq!(graded("denied", "guardrail_blocked"), ("guardrail", "guardrail.guardrail_blocked".to_string(), 4));
        assert_eq!(graded("error", "kill_switch_active"), ("audit", "audit.denied.kill_switch_active".to_string(), 5));
        assert_eq!(graded("error", "provider_error"), ("error", "error.provider_error".to_string(), 2));
    }

    #[test]
    fn ocsf_carries_the_class_severity_status_and_time() {
        let event = from_audit(&record("denied", "guardrail_blocked"));
        let ocsf = ocsf(&event);
        assert_eq!(
            (ocsf["class_uid"].as_i64(), ocsf["severity"].as_str(), ocsf["status"].as_str()),
            (Some(6003), Some("High"), Some("Failure"))
        );
        assert_eq!(ocsf["metadata"]["version"], "1.3.0");
        assert_eq!(ocsf["time"].as_i64(), Some(1_795_946_400_000));
        assert_eq!(ocsf["api"]["request"]["uid"], "req_1");
    }

    #[test]
    fn activities_are_audit_events_graded_by_their_source() {
        let activity = |action: &str, severity: u32, reason: &str, data_json: &str| brainstorm_proto::observability::ActivityEvent {
            tenant_id: "t1".into(),
            action: action.into(),
            actor: "key:k1".into(),
            subject: "4a0b".into(),
            occurred_at: "2026-11-29T10:00:00.000Z".into(),
            reason: reason.into(),
            severity,
            data_json: data_json.into(),
        };
        let issued = from_activity(&activity("agent_certificate.issued", 1, "", r#"{"agent_id": "scout"}"#));
        assert_eq!((issued.event_type, issued.name.as_str(), issued.severity), ("audit", "audit.agent_certificate.issued", 1));
        assert_eq!((issued.request_id.as_str(), issued.data["reason"].is_null()), ("agent_certificate.issued:4a0b", true));
        assert_eq!((issued.data["agent_id"].as_str(), issued.data["subject"].as_str()), (Some("scout"), Some("4a0b")));
        let switched = from_activity(&activity("kill_switch.activated", 9, "breach", ""));
        assert_eq!((switched.name.as_str(), switched.severity), ("audit.kill_switch.activated", 5));
        assert_eq!((switched.data["actor"].as_str(), switched.data["reason"].as_str()), (Some("key:k1"), Some("breach")));
        assert_eq!(ocsf(&switched)["status"], "Success");
        assert_eq!(from_activity(&activity("api_key.created", 0, "", "not json")).severity, 1);
    }

    #[test]
    fn a_tenant_leaving_active_is_graded_above_one_coming_back() {
        let suspended = from_activity(&tenant_status_changed("t1", "key:platform-admin".into(), "active", "rejected"));
        assert_eq!((suspended.name.as_str(), suspended.severity), ("audit.tenant.status_changed", 4));
        assert_eq!((suspended.data["from"].as_str(), suspended.data["status"].as_str()), (Some("active"), Some("rejected")));
        assert_eq!(suspended.data["subject"], "t1");
        assert_eq!(from_activity(&tenant_status_changed("t1", "key:x".into(), "rejected", "active")).severity, 1);
        assert_eq!(from_activity(&tenant_status_changed("t1", "key:x".into(), "pending", "rejected")).severity, 1);
    }
}
