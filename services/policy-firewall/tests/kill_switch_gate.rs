//! The edge's kill-switch gate against a fake source: the 500 ms cache, refreshes, the outage rules
//! (a gate that saw the switch active keeps blocking; a fresh gate allows until it reads; scoped
//! switches fail open) and snapshots applied from events at once. Time is paused and moved by hand.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use brainstorm_policy_firewall::{BlockScope, GateOptions, KillSwitchDecision, KillSwitchGate, KillSwitchSource, RequestFacts};
use brainstorm_proto::policy::{KillSwitchSnapshot, PolicyEvent, ScopedSwitch, policy_event};
use brainstorm_proto::{ServiceError, ServiceResult};

const TENANT: &str = "tenant-1";

/// What the fake answers: a snapshot, or the store is down.
#[derive(Clone)]
enum Answer {
    Snapshot(KillSwitchSnapshot),
    Down,
}

struct FakeSource {
    answer: Mutex<Answer>,
    reads: AtomicUsize,
    delay: Duration,
}

impl FakeSource {
    fn new(answer: Answer) -> Arc<Self> {
        Arc::new(FakeSource { answer: Mutex::new(answer), reads: AtomicUsize::new(0), delay: Duration::ZERO })
    }

    fn slow(answer: Answer, delay: Duration) -> Arc<Self> {
        Arc::new(FakeSource { answer: Mutex::new(answer), reads: AtomicUsize::new(0), delay })
    }

    fn set(&self, answer: Answer) {
        *self.answer.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = answer;
    }

    fn reads(&self) -> usize {
        self.reads.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl KillSwitchSource for FakeSource {
    async fn snapshot(&self, tenant_id: &str) -> ServiceResult<KillSwitchSnapshot> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        let answer = self.answer.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        match answer {
            Answer::Snapshot(mut snapshot) => {
                snapshot.tenant_id = tenant_id.to_string();
                Ok(snapshot)
            }
            Answer::Down => Err(ServiceError::unavailable("database_unavailable", "the policy-firewall store is unavailable")),
        }
    }
}

fn snapshot(version: i64, active: bool, scopes: Vec<ScopedSwitch>) -> Answer {
    Answer::Snapshot(KillSwitchSnapshot {
        tenant_id: TENANT.to_string(),
        version,
        active,
        reason: active.then(|| "incident".to_string()),
        activated_at: None,
        scopes,
    })
}

fn agent_scope(agent: &str) -> ScopedSwitch {
    ScopedSwitch {
        r#type: "agent".to_string(),
        id: agent.to_string(),
        reason: "runaway agent".to_string(),
        activated_by: "key-1".to_string(),
        activated_at: "2026-01-01T00:00:00.000Z".to_string(),
        active: true,
        deactivated_at: None,
    }
}

fn gate(source: &Arc<FakeSource>) -> KillSwitchGate {
    KillSwitchGate::new(source.clone(), GateOptions::default())
}

const COMPLETIONS: RequestFacts<'static> =
    RequestFacts { path: "/v1/chat/completions", method: "POST", agent_id: None, tool_names: &[], model: None };
const PLANNER: RequestFacts<'static> =
    RequestFacts { path: "/v1/chat/completions", method: "POST", agent_id: Some("planner"), tool_names: &[], model: None };

fn tenant_blocked(decision: &KillSwitchDecision) -> bool {
    matches!(decision, KillSwitchDecision::Blocked { scope: BlockScope::Tenant, .. })
}

async fn advance(milliseconds: u64) {
    tokio::time::advance(Duration::from_millis(milliseconds)).await;
}

#[tokio::test(start_paused = true)]
async fn state_is_cached_for_500_ms_then_read_again() {
    let source = FakeSource::new(snapshot(1, false, Vec::new()));
    let gate = gate(&source);
    assert_eq!(gate.check(TENANT, &COMPLETIONS).await, KillSwitchDecision::Allow);
    source.set(snapshot(2, true, Vec::new()));
    advance(499).await;
    assert_eq!(gate.check(TENANT, &COMPLETIONS).await, KillSwitchDecision::Allow, "cached for the TTL");
    assert_eq!(source.reads(), 1);
    advance(1).await;
    assert!(tenant_blocked(&gate.check(TENANT, &COMPLETIONS).await), "read again once the TTL passed");
    assert_eq!(source.reads(), 2);
    assert!(gate.check("another-tenant", &COMPLETIONS).await.is_blocked(), "tenants are cached separately");
    assert_eq!(source.reads(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_gate_that_saw_the_switch_active_keeps_blocking_while_the_store_is_down() {
    let source = FakeSource::new(snapshot(1, true, Vec::new()));
    let gate = gate(&source);
    assert!(tenant_blocked(&gate.check(TENANT, &COMPLETIONS).await));
    source.set(Answer::Down);
    for _ in 0..4 {
        advance(600).await;
        assert!(tenant_blocked(&gate.check(TENANT, &COMPLETIONS).await), "the last known state holds");
    }
    let reads = source.reads();
    advance(100).await;
    assert!(tenant_blocked(&gate.check(TENANT, &COMPLETIONS).await));
    assert_eq!(source.reads(), reads, "a failed read is retried after the TTL, not on every request");
    source.set(snapshot(2, false, Vec::new()));
    advance(500).await;
    assert_eq!(gate.check(TENANT, &COMPLETIONS).await, KillSwitchDecision::Allow, "recovers with the store");
}

#[tokio::test(start_paused = true)]
async fn a_fresh_gate_allows_during_an_outage_until_it_reads_the_state() {
    let source = FakeSource::new(Answer::Down);
    let gate = gate(&source);
    assert_eq!(gate.check(TENANT, &COMPLETIONS).await, KillSwitchDecision::Allow);
    source.set(snapshot(1, true, Vec::new()));
    advance(200).await;
    assert_eq!(gate.check(TENANT, &COMPLETIONS).await, KillSwitchDecision::Allow, "no read before the TTL after a failure");
    advance(300).await;
    assert!(tenant_blocked(&gate.check(TENANT, &COMPLETIONS).await), "blocks once it could read");
}

#[tokio::test(start_paused = true)]
async fn scoped_switches_fail_open_while_unreadable() {
    let source = FakeSource::new(snapshot(1, false, vec![agent_scope("planner")]));
    let gate = gate(&source);
    let decision = gate.check(TENANT, &PLANNER).await;
    assert!(matches!(decision, KillSwitchDecision::Blocked { scope: BlockScope::Agent(ref agent), .. } if agent == "planner"));
    assert_eq!(gate.check(TENANT, &COMPLETIONS).await, KillSwitchDecision::Allow, "other agents pass");
    source.set(Answer::Down);
    advance(500).await;
    assert_eq!(gate.check(TENANT, &PLANNER).await, KillSwitchDecision::Allow, "scope checks fail open during an outage");
    source.set(snapshot(2, false, vec![agent_scope("planner")]));
    advance(500).await;
    assert!(gate.check(TENANT, &PLANNER).await.is_blocked(), "enforced again once readable");
}

#[tokio::test(start_paused = true)]
async fn events_apply_at_once_and_older_snapshots_never_win() {
    let source = FakeSource::new(snapshot(3, false, Vec::new()));
    let gate = gate(&source);
    assert_eq!(gate.check(TENANT, &COMPLETIONS).await, KillSwitchDecision::Allow);
    let Answer::Snapshot(active) = snapshot(5, true, Vec::new()) else { unreachable!("a snapshot") };
    let event =
        PolicyEvent { tenant_id: TENANT.to_string(), occurred_at: String::new(), kind: Some(policy_event::Kind::KillSwitch(active)) };
    assert!(gate.apply_event(&event));
    assert!(tenant_blocked(&gate.check(TENANT, &COMPLETIONS).await), "no need to wait for the TTL");
    assert_eq!(source.reads(), 1);
    let Answer::Snapshot(stale) = snapshot(4, false, Vec::new()) else { unreachable!("a snapshot") };
    gate.apply_snapshot(&stale);
    assert!(tenant_blocked(&gate.check(TENANT, &COMPLETIONS).await), "a delayed older event is ignored");
    source.set(snapshot(4, false, Vec::new()));
    advance(500).await;
    assert!(tenant_blocked(&gate.check(TENANT, &COMPLETIONS).await), "a read older than an applied event does not overwrite it");
    source.set(snapshot(6, false, Vec::new()));
    advance(500).await;
    assert_eq!(gate.check(TENANT, &COMPLETIONS).await, KillSwitchDecision::Allow);
}

#[tokio::test(start_paused = true)]
async fn concurrent_requests_share_one_read_and_a_hung_read_times_out() {
    let source = FakeSource::slow(snapshot(1, true, Vec::new()), Duration::from_millis(100));
    let gate = Arc::new(gate(&source));
    let mut tasks = Vec::new();
    for _ in 0..10 {
        let gate = gate.clone();
        tasks.push(tokio::spawn(async move { gate.check(TENANT, &COMPLETIONS).await }));
    }
    for task in tasks {
        let decision = task.await.unwrap_or(KillSwitchDecision::Allow);
        assert!(tenant_blocked(&decision));
    }
    assert_eq!(source.reads(), 1, "one read for ten concurrent requests");

    let hung = FakeSource::slow(snapshot(1, true, Vec::new()), Duration::from_secs(30));
    let gate =
        KillSwitchGate::new(hung.clone(), GateOptions { ttl: Duration::from_millis(500), fetch_timeout: Duration::from_millis(200) });
    let started = tokio::time::Instant::now();
    assert_eq!(gate.check(TENANT, &COMPLETIONS).await, KillSwitchDecision::Allow, "a fresh gate whose read hangs allows");
    assert!(started.elapsed() < Duration::from_secs(1), "the read was abandoned at the fetch timeout");
}

#[tokio::test(start_paused = true)]
async fn under_steady_traffic_the_entry_is_renewed_before_it_expires() {
    let source = FakeSource::slow(snapshot(1, false, Vec::new()), Duration::from_millis(100));
    let gate = gate(&source);
    assert_eq!(gate.check(TENANT, &COMPLETIONS).await, KillSwitchDecision::Allow, "the first read is waited for");
    source.set(snapshot(2, true, Vec::new()));
    for _ in 0..20 {
        advance(50).await;
        let started = tokio::time::Instant::now();
        gate.check(TENANT, &COMPLETIONS).await;
        assert!(started.elapsed().is_zero(), "no request waits for a read while traffic is steady");
    }
    assert!(tenant_blocked(&gate.check(TENANT, &COMPLETIONS).await), "the entry was renewed in the background");
    assert!(source.reads() >= 3, "renewed about every half TTL: {} reads", source.reads());
}

#[tokio::test(start_paused = true)]
async fn exempt_paths_are_decided_without_reading_the_state() {
    let source = FakeSource::new(snapshot(1, true, Vec::new()));
    let gate = gate(&source);
    let status = RequestFacts { path: "/v1/killswitch/deactivate", method: "POST", ..COMPLETIONS };
    assert_eq!(gate.check(TENANT, &status).await, KillSwitchDecision::Allow);
    assert_eq!(source.reads(), 0);
    assert!(tenant_blocked(&gate.check(TENANT, &COMPLETIONS).await));
    assert_eq!(gate.check(TENANT, &status).await, KillSwitchDecision::Allow, "exempt while active");
}
