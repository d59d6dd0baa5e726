//! Causal episodes: the records of one trace ordered by span parentage, their edge labels, and the
//! anomalies found on the way.
//!
//! A record's parent is the record of the same trace whose `span_id` is its `parent_span_id`. The
//! episode lists parents before children (depth first); roots and siblings go by time, then sequence.
//! Edge labels say how far a record's place in the episode can be trusted:
//! - `verified`: the row checks on its own (its provenance is not `failed` or `missing_lineage`) and its
//!   parent link is the gateway's own doing: the edge generated the trace, the inbound trace context
//!   came over an authenticated hop, or the parent span is itself a chained record;
//! - `claimed`: the row checks, but its parent link rests on a caller's unauthenticated `traceparent`;
//! - `unverified`: the row does not check, or carries no trace context.

use std::collections::{BTreeSet, HashMap};

use brainstorm_proto::audit::{AuditRecord, LineageAnomaly};

use crate::chain::{ChainRow, Provenance};

/// One record of an episode.
#[derive(Debug, Clone)]
pub struct EpisodeNode {
    pub row: ChainRow,
    /// None when the payload does not decode.
    pub record: Option<AuditRecord>,
    pub provenance: Provenance,
}

impl EpisodeNode {
    fn span_id(&self) -> &str {
        self.record.as_ref().and_then(|record| record.trace.as_ref()).map(|trace| trace.span_id.as_str()).unwrap_or_default()
    }

    fn parent_span_id(&self) -> Option<&str> {
        self.record
            .as_ref()
            .and_then(|record| record.trace.as_ref())
            .and_then(|trace| trace.parent_span_id.as_deref())
            .filter(|parent| !parent.is_empty())
    }

    fn trace_trusted(&self) -> bool {
        self.record
            .as_ref()
            .and_then(|record| record.trace.as_ref())
            .is_some_and(|trace| trace.origin == "generated" || trace.inbound_trusted)
    }
}

/// An episode in causal order.
#[derive(Debug, Clone)]
pub struct OrderedEpisode {
    /// Indexes into the nodes, parents first, with their depth (roots at 0).
    pub order: Vec<(usize, u64)>,
    /// Each node's parent node, when that parent is recorded.
    pub parent: Vec<Option<usize>>,
    pub labels: Vec<&'static str>,
    pub anomalies: Vec<LineageAnomaly>,
}

/// The edge label of a node, given whether its parent span is a chained record.
fn edge_label(node: &EpisodeNode, parent_recorded: bool) -> &'static str {
    match node.provenance {
        Provenance::Failed | Provenance::MissingLineage => "unverified",
        Provenance::Ok | Provenance::Redacted | Provenance::SampledOut | Provenance::ExpiredByRetention => {
            if node.trace_trusted() || parent_recorded { "verified" } else { "claimed" }
        }
    }
}

/// Orders the records of one trace by span parentage.
pub fn order_episode(nodes: &[EpisodeNode]) -> OrderedEpisode {
    let mut anomalies = Vec::new();
    let mut by_span: HashMap<&str, usize> = HashMap::new();
    for (index, node) in nodes.iter().enumerate() {
        let span = node.span_id();
        if span.is_empty() {
            continue;
        }
        if let Some(first) = by_span.get(span) {
            anomalies.push(anomaly(
                "duplicate_span_id",
                &node.row.request_id,
                format!("span {span} is also the span of {}", nodes[*first].row.request_id),
            ));
        } else {
            by_span.insert(span, index);
        }
    }
    let parent: Vec<Option<usize>> = nodes
        .iter()
        .enumerate()
        .map(|(index, node)| node.parent_span_id().and_then(|span| by_span.get(span).copied()).filter(|parent| *parent != index))
        .collect();
    let time_key = |index: &usize| (nodes[*index].row.occurred_at.clone(), nodes[*index].row.sequence);
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    let mut roots = Vec::new();
    for (index, parent) in parent.iter().enumerate() {
        match parent {
            Some(parent) => children[*parent].push(index),
            None => roots.push(index),
        }
    }
    for list in &mut children {
        list.sort_by_key(time_key);
    }
    roots.sort_by_key(time_key);

    let mut order = Vec::with_capacity(nodes.len());
    let mut visited = vec![false; nodes.len()];
    let walk = |start: usize, order: &mut Vec<(usize, u64)>, visited: &mut Vec<bool>| {
        let mut stack = vec![(start, 0u64)];
        while let Some((index, depth)) = stack.pop() {
            if visited[index] {
                continue;
            }
            visited[index] = true;
            order.push((index, depth));
            for child in children[index].iter().rev() {
                stack.push((*child, depth + 1));
            }
        }
    };
    for root in roots {
        walk(root, &mut order, &mut visited);
    }
    // Whatever no root reaches sits on a parentage cycle: start from its earliest record.
    let mut unreached: Vec<usize> = (0..nodes.len()).filter(|index| !visited[*index]).collect();
    unreached.sort_by_key(time_key);
    for index in unreached {
        if !visited[index] {
            anomalies.push(anomaly("cyclic_parentage", &nodes[index].row.request_id, "span parentage forms a cycle".to_string()));
            walk(index, &mut order, &mut visited);
        }
    }
    let labels: Vec<&'static str> = nodes.iter().enumerate().map(|(index, node)| edge_label(node, parent[index].is_some())).collect();
    for node in nodes {
        if node.provenance == Provenance::Failed {
            anomalies.push(anomaly("chain_row_unverified", &node.row.request_id, "the row does not recompute".to_string()));
        }
    }
    OrderedEpisode { order, parent, labels, anomalies }
}

/// How `other` relates to `subject` in an ordered episode.
pub fn relation(episode: &OrderedEpisode, subject: usize, other: usize) -> &'static str {
    if episode.parent[subject] == Some(other) {
        return "parent";
    }
    if episode.parent[other] == Some(subject) {
        return "child";
    }
    if ancestors(episode, subject).contains(&other) {
        return "ancestor";
    }
    if ancestors(episode, other).contains(&subject) {
        return "descendant";
    }
    if episode.parent[subject].is_some() && episode.parent[subject] == episode.parent[other] {
        return "sibling";
    }
    "related"
}

fn ancestors(episode: &OrderedEpisode, start: usize) -> BTreeSet<usize> {
    let mut seen = BTreeSet::new();
    let mut current = episode.parent[start];
    while let Some(index) = current {
        if !seen.insert(index) {
            break;
        }
        current = episode.parent[index];
    }
    seen
}

/// An anomaly entry.
pub fn anomaly(kind: &str, request_id: &str, detail: String) -> LineageAnomaly {
    LineageAnomaly { kind: kind.to_string(), request_id: request_id.to_string(), detail }
}

#[cfg(test)]
mod tests {
    use brainstorm_proto::audit::TraceContext;

    use super::*;

    fn node(request: &str, span: &str, parent: Option<&str>, at: &str, origin: &str) -> EpisodeNode {
        let record = AuditRecord {
            request_id: request.to_string(),
            trace: Some(TraceContext {
                trace_id: "t".repeat(32),
                span_id: span.to_string(),
                parent_span_id: parent.map(str::to_string),
                origin: origin.to_string(),
                inbound_trusted: false,
            }),
            ..AuditRecord::default()
        };
        EpisodeNode {
            row: ChainRow {
                tenant_id: "t".to_string(),
                sequence: 0,
                request_id: request.to_string(),
                occurred_at: at.to_string(),
                trace_id: "t".repeat(32),
                chain_schema_version: 2,
                payload: String::new(),
                commitment: String::new(),
                prev_hash: String::new(),
                hash: String::new(),
                recorded_at: String::new(),
            },
            record: Some(record),
            provenance: Provenance::Ok,
        }
    }

    fn names(nodes: &[EpisodeNode], episode: &OrderedEpisode) -> Vec<(String, u64)> {
        episode.order.iter().map(|(index, depth)| (nodes[*index].row.request_id.clone(), *depth)).collect()
    }

    #[test]
    fn parents_come_before_children_and_siblings_go_by_time() {
        // Chained out of causal order on purpose.
        let nodes = vec![
            node("grandchild", "c1c1", Some("b2b2"), "2026-01-01T00:00:04.000Z", "inbound"),
            node("late-child", "b1b1", Some("a0a0"), "2026-01-01T00:00:05.000Z", "inbound"),
            node("root", "a0a0", Some("ffff"), "2026-01-01T00:00:01.000Z", "inbound"),
            node("early-child", "b2b2", Some("a0a0"), "2026-01-01T00:00:02.000Z", "inbound"),
        ];
        let episode = order_episode(&nodes);
        let expected = [("root", 0), ("early-child", 1), ("grandchild", 2), ("late-child", 1)];
        assert_eq!(names(&nodes, &episode), expected.map(|(name, depth)| (name.to_string(), depth)).to_vec());
        // The root's parent is the caller's own span, not a gateway record, over an untrusted hop.
        assert_eq!(episode.labels[2], "claimed");
        assert_eq!(episode.labels[0], "verified");
        assert_eq!(relation(&episode, 0, 2), "ancestor");
        assert_eq!(relation(&episode, 3, 0), "child");
        assert_eq!(relation(&episode, 1, 3), "sibling");
        assert_eq!(relation(&episode, 2, 0), "descendant");
        assert!(episode.anomalies.is_empty());
    }

    #[test]
    fn cycles_and_duplicate_spans_are_reported_not_looped_on() {
        let mut nodes = vec![
            node("a", "aaaa", Some("bbbb"), "2026-01-01T00:00:01.000Z", "generated"),
            node("b", "bbbb", Some("aaaa"), "2026-01-01T00:00:02.000Z", "generated"),
            node("c", "bbbb", None, "2026-01-01T00:00:03.000Z", "generated"),
        ];
        nodes[2].provenance = Provenance::Failed;
        let episode = order_episode(&nodes);
        assert_eq!(episode.order.len(), 3);
        let kinds: Vec<&str> = episode.anomalies.iter().map(|anomaly| anomaly.kind.as_str()).collect();
        assert!(kinds.contains(&"duplicate_span_id"));
        assert!(kinds.contains(&"cyclic_parentage"));
        assert!(kinds.contains(&"chain_row_unverified"));
        assert_eq!(episode.labels[2], "unverified");
    }
}
