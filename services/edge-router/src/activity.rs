//! Control-plane actions (agent certificates issued and revoked, kill switches, API keys, agents'
//! lifecycle) handed to the tenant's observability destinations and XDR connectors as `audit`
//! events (`audit.<action>`), off the answer: a SIEM sees who pulled a credential or switched a
//! tenant off, beside the requests those actions affect. An edge without the fan-out hands nothing.

use brainstorm_proto::observability::ActivityEvent;

use crate::EdgeState;
use crate::auth::{AgentCaller, Caller};

/// A key that acted, as activity events (and revocation records) name it: `key:<key id>`.
pub fn key_actor(caller: &Caller) -> String {
    format!("key:{}", caller.identity.key_id)
}

/// An agent that acted on its own behalf: `agent:<agent id>`.
pub fn agent_actor(agent: &AgentCaller) -> String {
    format!("agent:{}", agent.profile.agent_id)
}

pub use brainstorm_observability_fanout::events::{activity, tenant_status_changed};

/// Hands an action to the fan-out, when the edge has one.
pub fn announce(state: &EdgeState, event: ActivityEvent) {
    if let Some(observability) = &state.observability {
        brainstorm_observability_fanout::events::announce(observability, event);
    }
}
