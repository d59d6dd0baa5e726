//! The agents inventory of a window, built one record at a time.
//!
//! Classes: an agent is `registered` when the caller's registry (identity's agent profiles) lists it,
//! or, when no registry is given, when its records carry `agent.registered`; otherwise `unregistered`.
//! Requests naming no agent are attributed to their API key (`untagged_keys`). `asserted` lists agent
//! ids that arrived by a header or body field rather than an agent credential (JWT, mTLS): identities a
//! caller asserted, not proven. `mesh` lists `X-BR-Mesh-Source` identities.
//! `shadow_requests` = requests of unregistered agents + untagged requests; `shadow_ratio` =
//! shadow_requests / total_requests, unset for an empty window.

use std::collections::{BTreeMap, BTreeSet};

use brainstorm_proto::audit::{
    AgentInventory, AgentRegistry, AssertedAgent, AssertedList, AuditRecord, InventoryAgent, InventorySummary, InventoryWindow,
    MeshIdentity, UntaggedKey,
};

/// Identity sources that prove an agent id; anything else is only asserted.
const PROVING_SOURCES: [&str; 2] = ["agent_jwt", "mtls"];

#[derive(Debug, Default)]
struct AgentTally {
    requests: u64,
    cost_nanos: i64,
    last_seen: Option<String>,
    key_ids: BTreeSet<String>,
    identity_sources: BTreeSet<String>,
    flagged_registered: bool,
    owner: Option<(String, String)>,
    lifecycle_state: Option<String>,
}

/// A registered agent's owner and lifecycle state, by agent id.
type Registry = BTreeMap<String, (Option<String>, Option<String>)>;

#[derive(Debug, Default)]
struct KeyTally {
    requests: u64,
    cost_nanos: i64,
    last_seen: Option<String>,
}

/// Accumulates records into an inventory.
#[derive(Debug)]
pub struct InventoryBuilder {
    registry: Option<Registry>,
    total: u64,
    agents: BTreeMap<String, AgentTally>,
    keys: BTreeMap<String, KeyTally>,
    asserted: BTreeMap<String, (u64, BTreeSet<String>)>,
    mesh: BTreeMap<String, (u64, i64)>,
}

fn later(current: &mut Option<String>, candidate: &str) {
    if current.as_deref().is_none_or(|seen| seen < candidate) {
        *current = Some(candidate.to_string());
    }
}

impl InventoryBuilder {
    /// A builder; `registry`, when given, decides who is registered.
    pub fn new(registry: Option<&AgentRegistry>) -> Self {
        let registry = registry.map(|registry| {
            registry
                .agents
                .iter()
                .map(|agent| {
                    (agent.agent_id.clone(), (agent.owner_id.clone().filter(|owner| !owner.is_empty()), agent.lifecycle_state.clone()))
                })
                .collect()
        });
        InventoryBuilder {
            registry,
            total: 0,
            agents: BTreeMap::new(),
            keys: BTreeMap::new(),
            asserted: BTreeMap::new(),
            mesh: BTreeMap::new(),
        }
    }

    /// Counts one record.
    pub fn add(&mut self, record: &AuditRecord) {
        self.total += 1;
        let agent = record.agent.clone().unwrap_or_default();
        if let Some(source) = agent.mesh_source.as_ref().filter(|source| !source.is_empty()) {
            let entry = self.mesh.entry(source.clone()).or_default();
            entry.0 += 1;
            entry.1 = entry.1.max(agent.mesh_hop_count);
        }
        match record.agent_id.as_ref().filter(|agent_id| !agent_id.is_empty()) {
            Some(agent_id) => {
                let tally = self.agents.entry(agent_id.clone()).or_default();
                tally.requests += 1;
                tally.cost_nanos = tally.cost_nanos.saturating_add(record.cost_nanos);
                later(&mut tally.last_seen, &record.occurred_at);
                if let Some(key_id) = record.key_id.as_ref().filter(|key| !key.is_empty()) {
                    tally.key_ids.insert(key_id.clone());
                }
                if !agent.identity_source.is_empty() {
                    tally.identity_sources.insert(agent.identity_source.clone());
                }
                tally.flagged_registered |= agent.registered;
                if let Some(owner) = agent.owner_id.as_ref().filter(|owner| !owner.is_empty()) {
                    let source = if agent.owner_source.is_empty() { "agent_profile".to_string() } else { agent.owner_source.clone() };
                    tally.owner = Some((owner.clone(), source));
                }
                if agent.lifecycle_state.is_some() {
                    tally.lifecycle_state = agent.lifecycle_state.clone();
                }
                if !PROVING_SOURCES.contains(&agent.identity_source.as_str()) {
                    let entry = self.asserted.entry(agent_id.clone()).or_default();
                    entry.0 += 1;
                    if !agent.identity_source.is_empty() {
                        entry.1.insert(agent.identity_source.clone());
                    }
                }
            }
            None => {
                let key_id = record
                    .key_id
                    .clone()
                    .filter(|key| !key.is_empty())
                    .or_else(|| record.principal.as_ref().map(|principal| principal.id.clone()).filter(|id| !id.is_empty()))
                    .unwrap_or_else(|| "unknown".to_string());
                let tally = self.keys.entry(key_id).or_default();
                tally.requests += 1;
                tally.cost_nanos = tally.cost_nanos.saturating_add(record.cost_nanos);
                later(&mut tally.last_seen, &record.occurred_at);
            }
        }
    }

    fn is_registered(&self, agent_id: &str, tally: &AgentTally) -> bool {
        match &self.registry {
            Some(registry) => registry.contains_key(agent_id),
            None => tally.flagged_registered,
        }
    }

    /// The inventory of `window`.
    pub fn finish(mut self, window: InventoryWindow) -> AgentInventory {
        let mut notes = Vec::new();
        match &self.registry {
            Some(registry) => {
                notes.push(
                    "registered agents come from the agent registry passed with the request; idle ones are listed with 0 requests"
                        .to_string(),
                );
                for agent_id in registry.keys() {
                    self.agents.entry(agent_id.clone()).or_default();
                }
            }
            None => {
                notes.push("no agent registry was passed: an agent is registered when its records carry the registered flag".to_string())
            }
        }
        notes.push("asserted agents presented their id by header or body field, not by an agent credential".to_string());

        let mut agents = Vec::with_capacity(self.agents.len());
        let mut shadow_requests: u64 = 0;
        for (agent_id, tally) in &self.agents {
            let registered = self.is_registered(agent_id, tally);
            let registry_entry = self.registry.as_ref().and_then(|registry| registry.get(agent_id));
            let owner = match registry_entry {
                Some((Some(owner), _)) => Some((owner.clone(), "agent_profile".to_string())),
                _ => tally.owner.clone(),
            };
            if !registered {
                shadow_requests += tally.requests;
            }
            agents.push(InventoryAgent {
                agent_id: agent_id.clone(),
                class: if registered { "registered" } else { "unregistered" }.to_string(),
                owner_id: owner.as_ref().map(|(owner, _)| owner.clone()),
                owner_source: owner.map(|(_, source)| source),
                requests: tally.requests,
                cost_nanos: tally.cost_nanos,
                last_seen: tally.last_seen.clone(),
                key_ids: tally.key_ids.iter().cloned().collect(),
                identity_sources: tally.identity_sources.iter().cloned().collect(),
                lifecycle_state: registry_entry.and_then(|(_, state)| state.clone()).or_else(|| tally.lifecycle_state.clone()),
            });
        }
        let untagged_keys: Vec<UntaggedKey> = self
            .keys
            .into_iter()
            .map(|(key_id, tally)| UntaggedKey {
                key_id,
                requests: tally.requests,
                cost_nanos: tally.cost_nanos,
                last_seen: tally.last_seen,
            })
            .collect();
        shadow_requests += untagged_keys.iter().map(|key| key.requests).sum::<u64>();
        let asserted = self
            .asserted
            .into_iter()
            .map(|(agent_id, (requests, sources))| AssertedAgent {
                registered: agents.iter().any(|agent| agent.agent_id == agent_id && agent.class == "registered"),
                agent_id,
                requests,
                sources: sources.into_iter().collect(),
            })
            .collect();
        let mesh: Vec<MeshIdentity> =
            self.mesh.into_iter().map(|(identity, (requests, max_hop_count))| MeshIdentity { identity, requests, max_hop_count }).collect();
        let registered: Vec<&InventoryAgent> = agents.iter().filter(|agent| agent.class == "registered").collect();
        let summary = InventorySummary {
            total_requests: self.total,
            registered_agents: registered.len() as u64,
            ownerless_agents: registered.iter().filter(|agent| agent.owner_id.is_none()).count() as u64,
            unregistered_agents: agents.iter().filter(|agent| agent.class == "unregistered").count() as u64,
            untagged_keys: untagged_keys.len() as u64,
            mesh_identities: mesh.len() as u64,
            shadow_ratio: shadow_ratio(shadow_requests, self.total),
            shadow_requests,
        };
        AgentInventory {
            window: Some(window),
            summary: Some(summary),
            agents,
            untagged_keys,
            asserted: Some(AssertedList { agents: asserted }),
            mesh,
            notes,
        }
    }
}

/// shadow / total, None for an empty window.
pub fn shadow_ratio(shadow_requests: u64, total_requests: u64) -> Option<f64> {
    (total_requests > 0).then(|| shadow_requests as f64 / total_requests as f64)
}

#[cfg(test)]
mod tests {
    use brainstorm_proto::audit::{AgentContext, AgentRegistration};

    use super::*;

    fn record(agent: Option<&str>, key: &str, registered: bool, source: &str) -> AuditRecord {
        AuditRecord {
            request_id: uuid::Uuid::now_v7().to_string(),
            tenant_id: "t".to_string(),
            occurred_at: "2026-11-22T10:00:00.000Z".to_string(),
            key_id: Some(key.to_string()),
            agent_id: agent.map(str::to_string),
            cost_nanos: 10,
            agent: Some(AgentContext { registered, identity_source: source.to_string(), ..AgentContext::default() }),
            ..AuditRecord::default()
        }
    }

    fn window() -> InventoryWindow {
        InventoryWindow { period: "day".to_string(), since: String::new(), until: String::new() }
    }

    #[test]
    fn the_shadow_ratio_counts_unregistered_and_untagged_requests() {
        let mut builder = InventoryBuilder::new(None);
        for _ in 0..5 {
            builder.add(&record(Some("planner"), "k1", true, "agent_jwt"));
        }
        for _ in 0..2 {
            builder.add(&record(Some("rogue"), "k1", false, "header"));
        }
        for _ in 0..3 {
            builder.add(&record(None, "k2", false, ""));
        }
        let inventory = builder.finish(window());
        let summary = inventory.summary.unwrap_or_default();
        assert_eq!(summary.total_requests, 10);
        assert_eq!(summary.shadow_requests, 5);
        assert_eq!(summary.shadow_ratio, Some(0.5));
        assert_eq!((summary.registered_agents, summary.unregistered_agents, summary.untagged_keys), (1, 1, 1));
        assert_eq!(summary.ownerless_agents, 1, "planner has no owner");
        let asserted = inventory.asserted.unwrap_or_default().agents;
        assert_eq!(asserted.len(), 1);
        assert_eq!((asserted[0].agent_id.as_str(), asserted[0].requests, asserted[0].registered), ("rogue", 2, false));
    }

    #[test]
    fn a_registry_overrides_record_flags_and_lists_idle_agents() {
        let registry = AgentRegistry {
            agents: vec![
                AgentRegistration { agent_id: "rogue".to_string(), owner_id: Some("u1".to_string()), lifecycle_state: None },
                AgentRegistration { agent_id: "idle".to_string(), owner_id: None, lifecycle_state: Some("active".to_string()) },
            ],
        };
        let mut builder = InventoryBuilder::new(Some(&registry));
        builder.add(&record(Some("planner"), "k1", true, "agent_jwt"));
        builder.add(&record(Some("rogue"), "k1", false, "header"));
        let inventory = builder.finish(window());
        let class_of = |id: &str| inventory.agents.iter().find(|agent| agent.agent_id == id).map(|agent| agent.class.clone());
        assert_eq!(class_of("planner").as_deref(), Some("unregistered"), "the registry decides, not the flag");
        assert_eq!(class_of("rogue").as_deref(), Some("registered"));
        assert_eq!(class_of("idle").as_deref(), Some("registered"));
        let summary = inventory.summary.unwrap_or_default();
        assert_eq!((summary.registered_agents, summary.ownerless_agents), (2, 1));
        assert_eq!(summary.shadow_ratio, Some(0.5));
    }

    #[test]
    fn an_empty_window_has_no_ratio() {
        let summary = InventoryBuilder::new(None).finish(window()).summary.unwrap_or_default();
        assert_eq!((summary.total_requests, summary.shadow_ratio), (0, None));
    }
}
