//! The guardian on a completion's reply: the tool firewall on the tool calls the model asked for, and
//! human approvals for the calls a security policy holds. Streams and whole replies use the same guard:
//! a stream holds back only its tool-call events (text flows as it arrives) until the calls are known.

use std::sync::Arc;

use axum::http::{HeaderName, HeaderValue};
use brainstorm_common::ApiError;
use brainstorm_policy_firewall::firewall::Step;
use brainstorm_policy_firewall::{ApprovalContext, FirewallAction, FirewallMode, Guardian, ToolCall, ToolCaller, approval_required_error};
use brainstorm_providers::chat::{ChatReply, FinishReason, Part};

use crate::auth::CallerIdentity;

/// Everything the tool firewall needs about one request, owned so a stream can carry it. The
/// firewall's view of the caller is built only when a reply carries tool calls.
pub struct ReplyGuard {
    pub guardian: Arc<Guardian>,
    pub tenant_id: String,
    pub identity: Arc<CallerIdentity>,
    pub agent_id: Option<String>,
    /// The request's `x_firewall_mode` (it may only tighten the tenant's mode).
    pub requested_mode: Option<FirewallMode>,
    /// `chat_completions` or `messages`.
    pub surface: &'static str,
    pub request_id: String,
}

/// What the guardian decided about a reply's tool calls.
#[derive(Debug, PartialEq)]
pub enum ToolVerdict {
    /// Pass these calls on (renamed and redacted where the firewall enforces).
    Calls(Vec<ToolCall>),
    /// Drop every tool call: the reply finishes with `content_filter`.
    Blocked,
}

/// The headers and status the guard adds to a response.
#[derive(Debug, Default)]
pub struct GuardReport {
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// `blocked`, `approved` or `warned` when the guard acted; None leaves the guardian status as is.
    pub status: Option<&'static str>,
}

impl GuardReport {
    /// Adds header `name` with `text` (left out when the text is no valid header value).
    fn add(&mut self, name: &'static str, text: &str) {
        if let Ok(value) = HeaderValue::from_str(text) {
            self.headers.push((HeaderName::from_static(name), value));
        }
    }
}

impl ReplyGuard {
    /// Who makes the calls, for the firewall's RBAC step.
    fn tool_caller(&self) -> ToolCaller {
        let agent_id = self.agent_id.as_deref();
        ToolCaller {
            actor_id: agent_id.map_or_else(|| self.identity.key_id.clone(), str::to_string),
            actor_type: if agent_id.is_some() { "agent" } else { "api_key" }.to_string(),
            role: self.identity.role.clone(),
            permissions: self.identity.permissions.iter().cloned().collect(),
            allowed_tools: None,
            agent_id: self.agent_id.clone(),
        }
    }

    /// Where a held call came from, for the approval record reviewers see.
    fn approval_context(&self) -> ApprovalContext {
        ApprovalContext {
            surface: self.surface.to_string(),
            agent_id: self.agent_id.clone(),
            owner_id: self.identity.key.as_ref().and_then(|key| key.created_by.clone()),
            request_id: self.request_id.clone(),
        }
    }

    /// Runs the nine firewall steps on `calls`, then resolves the approvals a policy asks for. An
    /// error is the `approval_required` refusal, or the policy service being unreachable with nothing
    /// cached (fail closed).
    pub async fn inspect(&self, calls: Vec<ToolCall>, report: &mut GuardReport) -> Result<ToolVerdict, ApiError> {
        if calls.is_empty() {
            return Ok(ToolVerdict::Calls(calls));
        }
        let outcome = self
            .guardian
            .inspect_tool_calls(&self.tenant_id, &calls, &self.tool_caller(), self.requested_mode, Some(&self.request_id))
            .await?;
        report.headers.extend(outcome.headers());
        if let Some(denied) = outcome.verdicts.iter().find(|verdict| verdict.step == Step::SemanticPolicy) {
            report.add("x-br-policy-denied", &denied.reason);
        }
        if let Some(held) = outcome.approvals.first() {
            report.add("x-br-policy-match", &held.rule_id);
        }
        if !outcome.enforced {
            if outcome.action != FirewallAction::Pass {
                report.status = Some("warned");
            }
            return Ok(ToolVerdict::Calls(calls));
        }
        if outcome.action == FirewallAction::Block {
            report.status = Some("blocked");
            return Ok(ToolVerdict::Blocked);
        }
        let approval_context = self.approval_context();
        for needed in &outcome.approvals {
            let resolution = self.guardian.resolve_approval(&self.tenant_id, needed, &approval_context).await?;
            let approval = resolution.approval.unwrap_or_default();
            if !resolution.allowed {
                report.status = Some("blocked");
                report.add("x-br-approval-id", &approval.id);
                return Err(approval_required_error(&approval));
            }
            report.add("x-br-approval-id", &approval.id);
            report.status = Some("approved");
        }
        if report.status.is_none() && outcome.action != FirewallAction::Pass {
            report.status = Some("warned");
        }
        Ok(ToolVerdict::Calls(outcome.calls.into_iter().map(|inspected| inspected.call).collect()))
    }

    /// Guards a whole reply in place: its tool-call parts are replaced by what the firewall lets
    /// through, or dropped with finish reason `content_filter`.
    pub async fn guard_reply(&self, reply: &mut ChatReply, report: &mut GuardReport) -> Result<(), ApiError> {
        let calls: Vec<ToolCall> = reply
            .parts
            .iter()
            .filter_map(|part| match part {
                Part::ToolCall { id, name, arguments } => {
                    Some(ToolCall { id: id.clone(), name: name.clone(), arguments: arguments.clone() })
                }
                _ => None,
            })
            .collect();
        if calls.is_empty() {
            return Ok(());
        }
        let verdict = self.inspect(calls, report).await?;
        reply.parts.retain(|part| !matches!(part, Part::ToolCall { .. }));
        match verdict {
            ToolVerdict::Calls(calls) => {
                reply.parts.extend(calls.into_iter().map(|call| Part::ToolCall {
                    id: call.id,
                    name: call.name,
                    arguments: call.arguments,
                }));
            }
            ToolVerdict::Blocked => reply.finish = FinishReason::ContentFilter,
        }
        Ok(())
    }
}
