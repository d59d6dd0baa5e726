//! Budget alerts: which thresholds a projection crosses, and webhook delivery with retries.
//!
//! An alert fires when a period's projected spend reaches `threshold`% of its limit
//! (`projected * 100 >= threshold * limit`, exact in i128). It fires once per threshold per period: the
//! crossing is recorded under the period key, so the same threshold fires again only in the next
//! period. Alerts are always recorded in the history; they are posted to the webhook only when the
//! configuration is enabled and names a URL.

use std::time::Duration;

use brainstorm_common::money::Usd;
use brainstorm_proto::budget::AlertRecord;
use serde_json::{Value, json};

/// Thresholds of a tenant that never configured any.
pub const DEFAULT_THRESHOLDS: [u32; 3] = [80, 90, 95];

/// Delivery states recorded with an alert.
pub const DELIVERY_NOT_SENT: &str = "not_sent";
pub const DELIVERY_PENDING: &str = "pending";
pub const DELIVERY_DELIVERED: &str = "delivered";
pub const DELIVERY_FAILED: &str = "failed";

/// How webhooks are posted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookOptions {
    /// Attempts in all, the first included.
    pub attempts: u32,
    /// Wait before the second attempt; doubles after each failure.
    pub initial_backoff: Duration,
    /// Per attempt.
    pub timeout: Duration,
}

impl Default for WebhookOptions {
    fn default() -> Self {
        WebhookOptions { attempts: 4, initial_backoff: Duration::from_millis(500), timeout: Duration::from_secs(5) }
    }
}

/// One period's projection against its limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeriodProjection {
    /// `daily` or `monthly`.
    pub scope: &'static str,
    pub period_key: String,
    pub projected_nanos: i64,
    pub limit_nanos: i64,
}

impl PeriodProjection {
    /// `projected / limit` in basis points (hundredths of a percent), floored; 0 without a positive limit.
    pub fn ratio_basis_points(&self) -> i64 {
        if self.limit_nanos <= 0 {
            return 0;
        }
        i64::try_from(i128::from(self.projected_nanos) * 10_000 / i128::from(self.limit_nanos)).unwrap_or(i64::MAX)
    }

    /// The thresholds this projection has reached, ascending. A limit of zero crosses none: there is
    /// no ratio to a zero budget, and every request is refused anyway.
    pub fn crossed(&self, thresholds: &[u32]) -> Vec<u32> {
        if self.limit_nanos <= 0 {
            return Vec::new();
        }
        let mut crossed: Vec<u32> = thresholds
            .iter()
            .copied()
            .filter(|threshold| i128::from(self.projected_nanos) * 100 >= i128::from(*threshold) * i128::from(self.limit_nanos))
            .collect();
        crossed.sort_unstable();
        crossed.dedup();
        crossed
    }
}

/// The webhook body: `{type: "budget.alert", alert: {...}}` with the spec's alert record fields.
pub fn webhook_payload(alert: &AlertRecord) -> Value {
    json!({
        "type": "budget.alert",
        "alert": {
            "id": alert.id,
            "scope": alert.scope,
            "periodKey": alert.period_key,
            "ratioPercent": alert.ratio_percent,
            "threshold": alert.threshold,
            "projectedUsd": Usd::from_nanos(alert.projected_nanos).to_json(),
            "limitUsd": Usd::from_nanos(alert.limit_nanos).to_json(),
            "tenantId": alert.tenant_id,
            "timestamp": alert.timestamp,
        }
    })
}

/// How a delivery ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryOutcome {
    /// `delivered` or `failed`.
    pub status: &'static str,
    pub attempts: u32,
    /// The last failure, when it failed.
    pub error: Option<String>,
}

/// POSTs `payload` to `url` until a 2xx answer or `options.attempts` attempts, backing off exponentially.
pub async fn deliver(client: &reqwest::Client, url: &str, payload: &Value, options: &WebhookOptions) -> DeliveryOutcome {
    let attempts = options.attempts.max(1);
    let mut backoff = options.initial_backoff;
    let mut last_error = String::new();
    for attempt in 1..=attempts {
        match client.post(url).timeout(options.timeout).json(payload).send().await {
            Ok(response) if response.status().is_success() => {
                return DeliveryOutcome { status: DELIVERY_DELIVERED, attempts: attempt, error: None };
            }
            Ok(response) => last_error = format!("webhook answered {}", response.status()),
            Err(error) => last_error = format!("webhook unreachable: {error}"),
        }
        tracing::warn!(url, attempt, error = %last_error, "budget alert webhook delivery failed");
        if attempt < attempts {
            tokio::time::sleep(backoff).await;
            backoff = backoff.saturating_mul(2);
        }
    }
    DeliveryOutcome { status: DELIVERY_FAILED, attempts, error: Some(last_error) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn projection(projected_nanos: i64, limit_nanos: i64) -> PeriodProjection {
        PeriodProjection { scope: "daily", period_key: "2026-11-22".to_string(), projected_nanos, limit_nanos }
    }

    #[test]
    fn thresholds_are_crossed_exactly_at_their_percent() {
        let thresholds = [95, 80, 90];
        assert_eq!(projection(799_999_999, 1_000_000_000).crossed(&thresholds), Vec::<u32>::new());
        assert_eq!(projection(800_000_000, 1_000_000_000).crossed(&thresholds), vec![80]);
        assert_eq!(projection(950_000_000, 1_000_000_000).crossed(&thresholds), vec![80, 90, 95]);
        assert_eq!(projection(5, 0).crossed(&thresholds), Vec::<u32>::new());
        assert_eq!(projection(1_234_567_890, 1_000_000_000).ratio_basis_points(), 12_345);
    }

    #[test]
    fn the_payload_carries_the_alert_record_in_dollars() {
        let alert = AlertRecord {
            id: "a1".to_string(),
            tenant_id: "t1".to_string(),
            scope: "monthly".to_string(),
            period_key: "2026-11".to_string(),
            threshold: 90,
            ratio_percent: 91.5,
            projected_nanos: 9_150_000_000,
            limit_nanos: 10_000_000_000,
            timestamp: "2026-11-22T00:00:00.000Z".to_string(),
            ..AlertRecord::default()
        };
        let payload = webhook_payload(&alert);
        assert_eq!(payload["type"], "budget.alert");
        assert_eq!(payload["alert"]["projectedUsd"], json!(9.15));
        assert_eq!(payload["alert"]["limitUsd"], json!(10));
        assert_eq!(payload["alert"]["ratioPercent"], json!(91.5));
        assert_eq!(payload["alert"]["tenantId"], "t1");
    }
}
