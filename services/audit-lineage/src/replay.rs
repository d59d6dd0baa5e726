//! Replays over recorded routing decisions: the decision list, re-pricing under another strategy, and
//! per-strategy comparison. Money stays in integer nano-dollars; only averages and ratios are floats.
//!
//! A request counts when it reached a provider (`model_executed` is set). Simulation re-picks among the
//! request's own recorded candidates (the decision path's candidates that were not filtered out, plus
//! the executed model), priced by the caller's price table on the request's actual tokens:
//! - `price`: the cheapest; ties go to the higher quality;
//! - `quality`: the highest quality prior; ties go to the cheaper;
//! - `latency`, `throughput`: the smallest tier, then the cheaper (the router's proxies until probes measure);
//! - `priority`, `cascade`: the first candidate in recorded order (the order the router tried them).
//!
//! A request whose candidates are all missing from the table keeps its recorded cost. The simulated
//! latency of a request is the mean recorded latency of the chosen model over the window, or the
//! request's own latency when that model never answered in the window. p95 is the nearest rank:
//! the value at position ceil(0.95 * n) of the sorted latencies.

use std::collections::{BTreeMap, HashMap};

use brainstorm_common::money::Usd;
use brainstorm_proto::audit::{AuditRecord, ModelPrice, ReplayDecision, StrategyStats};
use brainstorm_providers::catalog::{ModelCatalog, Price};
use brainstorm_providers::chat::Usage;

/// Strategies a simulation may ask for.
pub const STRATEGIES: [&str; 6] = ["price", "latency", "throughput", "quality", "cascade", "priority"];

/// Whether a record is a routing decision (an upstream was called).
pub fn is_decision(record: &AuditRecord) -> bool {
    !record.model_executed.is_empty()
}

/// The replay view of a recorded decision.
pub fn decision(record: &AuditRecord) -> ReplayDecision {
    ReplayDecision {
        request_id: record.request_id.clone(),
        timestamp: record.occurred_at.clone(),
        model: record.model_executed.clone(),
        provider: record.provider.clone(),
        endpoint_id: if record.provider.is_empty() || record.model_executed.contains('/') {
            record.model_executed.clone()
        } else {
            format!("{}/{}", record.provider, record.model_executed)
        },
        strategy: record.strategy.clone(),
        input_tokens: record.input_tokens,
        output_tokens: record.output_tokens,
        latency_ms: record.latency_ms,
        cost_nanos: record.cost_nanos,
    }
}

/// The price table rows of a model catalog's chat models (a replay re-routes conversations), for
/// `SimulateRequest.prices`.
pub fn price_table(catalog: &ModelCatalog) -> Vec<ModelPrice> {
    catalog
        .models()
        .iter()
        .filter(|model| model.can("chat"))
        .map(|model| ModelPrice {
            provider: model.provider.clone(),
            model: model.model.clone(),
            input_per_million_nanos: model.price.input_per_million.nanos(),
            output_per_million_nanos: model.price.output_per_million.nanos(),
            quality_micros: (model.quality * 1_000_000.0).round() as i64,
            tier: u32::from(model.tier),
        })
        .collect()
}

/// A price table keyed by `provider/model`.
#[derive(Debug, Clone, Default)]
pub struct PriceTable {
    by_id: HashMap<String, ModelPrice>,
}

impl PriceTable {
    pub fn new(prices: &[ModelPrice]) -> Self {
        PriceTable { by_id: prices.iter().map(|price| (format!("{}/{}", price.provider, price.model), price.clone())).collect() }
    }

    fn get(&self, model_id: &str) -> Option<&ModelPrice> {
        self.by_id.get(model_id)
    }
}

/// The exact cost of a request's tokens at a table price.
pub fn cost_at(price: &ModelPrice, input_tokens: i64, output_tokens: i64) -> i64 {
    let price = Price::uncached(Usd::from_nanos(price.input_per_million_nanos), Usd::from_nanos(price.output_per_million_nanos));
    let usage = Usage::uncached(u64::try_from(input_tokens).unwrap_or(0), u64::try_from(output_tokens).unwrap_or(0));
    price.cost(usage).nanos()
}

fn executed_id(record: &AuditRecord) -> String {
    decision(record).endpoint_id
}

/// The model ids a request could have gone to, in recorded order.
fn candidates(record: &AuditRecord) -> Vec<String> {
    let mut ids: Vec<String> = record
        .decision
        .as_ref()
        .map(|decision| {
            decision.candidates.iter().filter(|candidate| candidate.status != "filtered").map(|candidate| candidate.model.clone()).collect()
        })
        .unwrap_or_default();
    let executed = executed_id(record);
    if !ids.contains(&executed) {
        ids.push(executed);
    }
    ids
}

/// What `strategy` would have picked for a request, and its cost; None when nothing is priced.
pub fn choose<'a>(record: &AuditRecord, strategy: &str, table: &'a PriceTable) -> Option<(&'a ModelPrice, i64)> {
    let priced: Vec<(&ModelPrice, i64)> = candidates(record)
        .iter()
        .filter_map(|id| table.get(id))
        .map(|price| (price, cost_at(price, record.input_tokens, record.output_tokens)))
        .collect();
    match strategy {
        "price" => priced.into_iter().min_by(|a, b| a.1.cmp(&b.1).then(b.0.quality_micros.cmp(&a.0.quality_micros))),
        "quality" => priced.into_iter().min_by(|a, b| b.0.quality_micros.cmp(&a.0.quality_micros).then(a.1.cmp(&b.1))),
        "latency" | "throughput" => priced.into_iter().min_by(|a, b| a.0.tier.cmp(&b.0.tier).then(a.1.cmp(&b.1))),
        _ => priced.into_iter().next(),
    }
}

/// Totals of a simulation.
#[derive(Debug, Clone, PartialEq)]
pub struct SimulationTotals {
    pub requests: u64,
    pub actual_cost_nanos: i64,
    pub actual_avg_latency_ms: f64,
    pub simulated_cost_nanos: i64,
    pub simulated_avg_latency_ms: f64,
}

impl SimulationTotals {
    /// actual - simulated.
    pub fn savings_nanos(&self) -> i64 {
        self.actual_cost_nanos.saturating_sub(self.simulated_cost_nanos)
    }

    /// savings / actual * 100, None when nothing was spent.
    pub fn savings_pct(&self) -> Option<f64> {
        (self.actual_cost_nanos > 0).then(|| self.savings_nanos() as f64 * 100.0 / self.actual_cost_nanos as f64)
    }
}

/// Re-prices the decisions of a window under `strategy`.
pub fn simulate(records: &[AuditRecord], strategy: &str, table: &PriceTable) -> SimulationTotals {
    let decisions: Vec<&AuditRecord> = records.iter().filter(|record| is_decision(record)).collect();
    let mut latency_by_model: HashMap<String, (i64, i64)> = HashMap::new();
    for record in &decisions {
        let entry = latency_by_model.entry(executed_id(record)).or_default();
        entry.0 += record.latency_ms;
        entry.1 += 1;
    }
    let mut totals = SimulationTotals {
        requests: decisions.len() as u64,
        actual_cost_nanos: 0,
        actual_avg_latency_ms: 0.0,
        simulated_cost_nanos: 0,
        simulated_avg_latency_ms: 0.0,
    };
    let (mut actual_latency, mut simulated_latency) = (0f64, 0f64);
    for record in &decisions {
        totals.actual_cost_nanos = totals.actual_cost_nanos.saturating_add(record.cost_nanos);
        actual_latency += record.latency_ms as f64;
        let (cost, latency) = match choose(record, strategy, table) {
            Some((price, cost)) => {
                let id = format!("{}/{}", price.provider, price.model);
                let latency = match latency_by_model.get(&id) {
                    Some((sum, count)) if *count > 0 => *sum as f64 / *count as f64,
                    _ => record.latency_ms as f64,
                };
                (cost, latency)
            }
            None => (record.cost_nanos, record.latency_ms as f64),
        };
        totals.simulated_cost_nanos = totals.simulated_cost_nanos.saturating_add(cost);
        simulated_latency += latency;
    }
    if totals.requests > 0 {
        totals.actual_avg_latency_ms = actual_latency / totals.requests as f64;
        totals.simulated_avg_latency_ms = simulated_latency / totals.requests as f64;
    }
    totals
}

/// The nearest-rank p95 of some latencies (0 for none).
pub fn p95(latencies: &mut [i64]) -> i64 {
    if latencies.is_empty() {
        return 0;
    }
    latencies.sort_unstable();
    let rank = (latencies.len() * 95).div_ceil(100);
    latencies[rank.saturating_sub(1)]
}

/// Per-strategy aggregates of recorded decisions (a record without a strategy counts as `unspecified`).
pub fn compare(records: &[AuditRecord]) -> Vec<StrategyStats> {
    let mut groups: BTreeMap<String, Vec<&AuditRecord>> = BTreeMap::new();
    for record in records.iter().filter(|record| is_decision(record)) {
        let strategy = if record.strategy.is_empty() { "unspecified".to_string() } else { record.strategy.clone() };
        groups.entry(strategy).or_default().push(record);
    }
    groups
        .into_iter()
        .map(|(strategy, records)| {
            let count = records.len() as i64;
            let total_cost: i64 = records.iter().fold(0i64, |sum, record| sum.saturating_add(record.cost_nanos));
            let mut latencies: Vec<i64> = records.iter().map(|record| record.latency_ms).collect();
            let latency_sum: i64 = latencies.iter().sum();
            StrategyStats {
                strategy,
                request_count: records.len() as u64,
                total_cost_nanos: total_cost,
                // Rounded half up to the nano-dollar.
                avg_cost_per_request_nanos: (total_cost + count / 2) / count.max(1),
                avg_latency_ms: latency_sum as f64 / count.max(1) as f64,
                p95_latency_ms: p95(&mut latencies),
                total_output_tokens: records.iter().map(|record| record.output_tokens).sum(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use brainstorm_proto::audit::{CandidateDecision, DecisionPath};

    use super::*;

    const USD: i64 = 1_000_000_000;

    fn price(provider: &str, model: &str, input_usd: i64, output_usd: i64, quality: i64, tier: u32) -> ModelPrice {
        ModelPrice {
            provider: provider.to_string(),
            model: model.to_string(),
            input_per_million_nanos: input_usd * USD,
            output_per_million_nanos: output_usd * USD,
            quality_micros: quality,
            tier,
        }
    }

    fn table() -> PriceTable {
        PriceTable::new(&[
            price("openai", "big", 10, 30, 900_000, 3),
            price("openai", "small", 1, 2, 600_000, 1),
            price("anthropic", "mid", 3, 15, 800_000, 2),
        ])
    }

    fn record(executed: &str, candidates: &[&str], cost_nanos: i64, latency_ms: i64, strategy: &str) -> AuditRecord {
        let (provider, _) = executed.split_once('/').unwrap_or(("", executed));
        AuditRecord {
            request_id: uuid::Uuid::now_v7().to_string(),
            model_executed: executed.to_string(),
            provider: provider.to_string(),
            strategy: strategy.to_string(),
            input_tokens: 1_000_000,
            output_tokens: 1_000_000,
            cost_nanos,
            latency_ms,
            decision: Some(DecisionPath {
                candidates: candidates
                    .iter()
                    .map(|model| CandidateDecision {
                        model: model.to_string(),
                        status: "not_tried".to_string(),
                        ..CandidateDecision::default()
                    })
                    .collect(),
                ..DecisionPath::default()
            }),
            ..AuditRecord::default()
        }
    }

    #[test]
    fn each_strategy_picks_from_the_recorded_candidates() {
        let table = table();
        let request = record("openai/big", &["openai/big", "anthropic/mid", "openai/small"], 40 * USD, 100, "quality");
        let pick = |strategy: &str| choose(&request, strategy, &table).map(|(price, cost)| (price.model.clone(), cost));
        assert_eq!(pick("price"), Some(("small".to_string(), 3 * USD)));
        assert_eq!(pick("quality"), Some(("big".to_string(), 40 * USD)));
        assert_eq!(pick("latency"), Some(("small".to_string(), 3 * USD)));
        assert_eq!(pick("cascade"), Some(("big".to_string(), 40 * USD)));
        let filtered = {
            let mut request = request.clone();
            if let Some(decision) = request.decision.as_mut() {
                decision.candidates[2].status = "filtered".to_string();
            }
            request
        };
        assert_eq!(choose(&filtered, "price", &table).map(|(price, _)| price.model.clone()), Some("mid".to_string()));
    }

    #[test]
    fn simulation_totals_are_exact_and_savings_signed() {
        let table = table();
        let records = vec![
            record("openai/big", &["openai/big", "openai/small"], 40 * USD, 900, "quality"),
            record("openai/small", &["openai/small"], 3 * USD, 100, "price"),
            record("unknown/model", &[], 7, 50, "price"),
            AuditRecord { outcome: "denied".to_string(), ..AuditRecord::default() },
        ];
        let totals = simulate(&records, "price", &table);
        assert_eq!(totals.requests, 3);
        assert_eq!(totals.actual_cost_nanos, 43 * USD + 7);
        assert_eq!(totals.simulated_cost_nanos, 6 * USD + 7, "unpriced requests keep their cost");
        assert_eq!(totals.savings_nanos(), 37 * USD);
        let pct = totals.savings_pct().unwrap_or_default();
        assert!((pct - 37.0 * 100.0 / 43.0).abs() < 1e-6, "{pct}");
        // Both big->small and small->small now take small's mean recorded latency (100 ms).
        assert!((totals.simulated_avg_latency_ms - (100.0 + 100.0 + 50.0) / 3.0).abs() < 1e-9);
        assert!((totals.actual_avg_latency_ms - 350.0).abs() < 1e-9);

        let dearer = simulate(&records, "quality", &table);
        assert!(dearer.savings_nanos() <= 0);
        assert_eq!(simulate(&[], "price", &table).savings_pct(), None);
    }

    #[test]
    fn p95_is_the_nearest_rank() {
        let mut latencies: Vec<i64> = (1..=100).rev().collect();
        assert_eq!(p95(&mut latencies), 95);
        assert_eq!(p95(&mut [7]), 7);
        assert_eq!(p95(&mut [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 1000]), 19);
        assert_eq!(p95(&mut []), 0);
    }

    #[test]
    fn strategies_are_compared_per_group() {
        let records = vec![
            record("openai/big", &[], 10, 100, "quality"),
            record("openai/big", &[], 11, 300, "quality"),
            record("openai/small", &[], 5, 50, "price"),
            record("openai/small", &[], 5, 50, ""),
        ];
        let stats = compare(&records);
        let names: Vec<&str> = stats.iter().map(|stat| stat.strategy.as_str()).collect();
        assert_eq!(names, ["price", "quality", "unspecified"]);
        let quality = &stats[1];
        assert_eq!((quality.request_count, quality.total_cost_nanos, quality.avg_cost_per_request_nanos), (2, 21, 11));
        assert_eq!((quality.p95_latency_ms, quality.total_output_tokens), (300, 2_000_000));
        assert!((quality.avg_latency_ms - 200.0).abs() < 1e-9);
    }
}
