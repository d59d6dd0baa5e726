//! The fan-out service's rules over its store: validating destinations, sealing their secrets,
//! tests, counters, the tenant switch, and events handed to the dispatcher.

use std::sync::Arc;

use async_trait::async_trait;
use brainstorm_common::store::Database;
use brainstorm_common::time::now_timestamp;
use brainstorm_proto::audit::AuditRecord;
use brainstorm_proto::budget::BudgetEvent;
use brainstorm_proto::observability::*;
use brainstorm_proto::{ServiceError, ServiceResult};
use brainstorm_providers::vault::{self, MasterKey, SealedSecret};
use prost::Message;
use serde_json::{Map, Value};

use crate::dispatcher::{Dispatcher, Source};
use crate::egress::Egress;
use crate::events::synthetic_usage;
use crate::filter::{FilterRules, validate_event_types};
use crate::formats::{self, KINDS};
use crate::store::{FanoutStore, StoredDestination};

const MAX_NAME_CHARS: usize = 200;
/// Batching: the defaults and the bounds.
const DEFAULT_BATCH: u32 = 100;
const MAX_BATCH: u32 = 1_000;
const DEFAULT_FLUSH_MS: u32 = 1_000;
const MAX_FLUSH_MS: u32 = 300_000;

/// Opens a destination's sealed secrets into its full config.
#[derive(Clone)]
pub struct Opener {
    master_key: Arc<MasterKey>,
}

fn binding(destination: &Destination) -> String {
    format!("{}/observability/{}", destination.tenant_id, destination.id)
}

impl Opener {
    /// The destination's config with its secret members.
    pub fn config(&self, stored: &StoredDestination) -> Result<Map<String, Value>, String> {
        let mut config: Map<String, Value> = serde_json::from_str(&stored.destination.config_json).map_err(|error| error.to_string())?;
        if !stored.sealed.ciphertext.is_empty() {
            let secrets =
                vault::open(&self.master_key, &stored.sealed, &binding(&stored.destination)).map_err(|error| error.to_string())?;
            let secrets: Map<String, Value> = serde_json::from_str(&secrets).map_err(|error| error.to_string())?;
            config.extend(secrets);
        }
        Ok(config)
    }

    fn seal(&self, destination: &mut Destination, config: Map<String, Value>) -> ServiceResult<SealedSecret> {
        let (public, secrets) = formats::split_secrets(config);
        destination.config_json = Value::Object(public).to_string();
        destination.secrets_set = secrets.keys().cloned().collect();
        if secrets.is_empty() {
            return Ok(SealedSecret {
                ciphertext: String::new(),
                nonce: String::new(),
                wrapped_key: String::new(),
                key_nonce: String::new(),
            });
        }
        vault::seal(&self.master_key, &Value::Object(secrets).to_string(), &binding(destination))
            .map_err(|error| ServiceError::internal(format!("cannot seal a destination's secrets: {error}")))
    }
}

/// The observability-fanout service.
#[derive(Clone)]
pub struct ObservabilityFanoutServiceImpl {
    store: FanoutStore,
    opener: Opener,
    egress: Egress,
    dispatcher: Dispatcher,
}

impl ObservabilityFanoutServiceImpl {
    /// The service over a migrated database, with its delivery task on `runtime` (`up` gives it the
    /// writers' thread, off the requests' one); destinations at private addresses only when
    /// `allow_private_urls` (`BR_OBSERVABILITY_ALLOW_PRIVATE_URLS`).
    pub fn new(
        database: Database,
        master_key: MasterKey,
        runtime: &tokio::runtime::Handle,
        allow_private_urls: bool,
    ) -> ObservabilityFanoutServiceImpl {
        let store = FanoutStore::new(database);
        let opener = Opener { master_key: Arc::new(master_key) };
        let egress = Egress::new(allow_private_urls);
        let dispatcher = Dispatcher::spawn(runtime, store.clone(), opener.clone(), egress.clone());
        ObservabilityFanoutServiceImpl { store, opener, egress, dispatcher }
    }

    /// Refuses a config whose requests would go where the egress does not let them: the URL of a
    /// request built from it, so members naming only part of it are judged as well.
    fn check_reachable(&self, kind: &str, kind_type: &str, config: &Map<String, Value>) -> ServiceResult<()> {
        let probe = synthetic_usage("probe");
        let request = formats::request(kind, kind_type, config, &[probe], chrono::Utc::now()).map_err(invalid)?;
        self.egress.permits(&request.url).map_err(invalid)
    }

    /// Hands what becomes events to delivery.
    pub(crate) async fn submit(&self, sources: Vec<Source>) {
        self.dispatcher.submit(sources).await;
    }

    /// Sends every buffered event now and waits for the deliveries under way (at a stop; the caller
    /// bounds the wait).
    pub async fn finish_deliveries(&self) {
        self.dispatcher.finish().await;
    }

    async fn existing(&self, tenant_id: &str, kind: &str, id: &str) -> ServiceResult<StoredDestination> {
        kind_of(kind)?;
        self.store
            .get(tenant_id, kind, id)
            .await
            .map_err(failure)?
            .ok_or_else(|| ServiceError::not_found("destination_not_found", format!("no {kind} destination `{id}`")))
    }
}

fn failure(error: sqlx::Error) -> ServiceError {
    ServiceError::internal(format!("the fan-out store failed: {error}"))
}

fn invalid(message: impl Into<String>) -> ServiceError {
    ServiceError::invalid("invalid_destination", message)
}

fn kind_of(kind: &str) -> ServiceResult<&str> {
    if KINDS.contains(&kind) { Ok(kind) } else { Err(invalid(format!("kind `{kind}` is not one of observability, xdr"))) }
}

fn config_object(text: &str) -> ServiceResult<Map<String, Value>> {
    match serde_json::from_str(text) {
        Ok(Value::Object(config)) => Ok(config),
        _ => Err(invalid("config must be an object")),
    }
}

fn filter_rules(text: &str) -> ServiceResult<String> {
    let trimmed = text.trim();
    if trimmed.is_empty() || trimmed == "null" {
        return Ok(String::new());
    }
    FilterRules::parse(trimmed).map_err(invalid)?;
    Ok(trimmed.to_string())
}

fn batching(max_size: u32, flush_ms: u32) -> ServiceResult<(u32, u32)> {
    let max_size = if max_size == 0 { DEFAULT_BATCH } else { max_size };
    let flush_ms = if flush_ms == 0 { DEFAULT_FLUSH_MS } else { flush_ms };
    if max_size > MAX_BATCH || flush_ms > MAX_FLUSH_MS {
        return Err(invalid(format!("batch.max_size is at most {MAX_BATCH} and batch.flush_interval_ms at most {MAX_FLUSH_MS}")));
    }
    Ok((max_size, flush_ms))
}

fn validate_name(name: &str) -> ServiceResult<String> {
    let name = name.trim();
    if name.is_empty() || name.chars().count() > MAX_NAME_CHARS {
        return Err(invalid(format!("name is required, at most {MAX_NAME_CHARS} characters")));
    }
    Ok(name.to_string())
}

/// The hour a day ago, as `YYYY-MM-DDTHH`.
fn day_ago_hour() -> String {
    brainstorm_common::time::format_timestamp(chrono::Utc::now() - chrono::Duration::hours(23)).chars().take(13).collect()
}

#[async_trait]
impl ObservabilityFanoutService for ObservabilityFanoutServiceImpl {
    async fn create_destination(&self, request: CreateDestinationRequest) -> ServiceResult<Destination> {
        let kind = kind_of(&request.kind)?.to_string();
        let config = config_object(&request.config_json)?;
        formats::validate(&kind, &request.r#type, &config).map_err(invalid)?;
        self.check_reachable(&kind, &request.r#type, &config)?;
        validate_event_types(&request.event_types).map_err(invalid)?;
        let (batch_max_size, batch_flush_interval_ms) = batching(request.batch_max_size, request.batch_flush_interval_ms)?;
        let now = now_timestamp();
        let mut destination = Destination {
            id: uuid::Uuid::new_v4().to_string(),
            tenant_id: request.tenant_id,
            kind,
            name: validate_name(&request.name)?,
            r#type: request.r#type,
            event_types: request.event_types,
            batch_max_size,
            batch_flush_interval_ms,
            filter_rules_json: filter_rules(&request.filter_rules_json)?,
            enabled: true,
            created_at: now.clone(),
            updated_at: now,
            ..Destination::default()
        };
        let sealed = self.opener.seal(&mut destination, config)?;
        let stored = StoredDestination { destination, sealed };
        self.store.put(&stored, false).await.map_err(failure)?;
        self.dispatcher.forget(&stored.destination.tenant_id).await;
        Ok(stored.destination)
    }

    async fn list_destinations(&self, request: ListDestinationsRequest) -> ServiceResult<DestinationList> {
        kind_of(&request.kind)?;
        let destinations = self.store.list(&request.tenant_id, &request.kind).await.map_err(failure)?;
        Ok(DestinationList { destinations: destinations.into_iter().map(|stored| stored.destination).collect() })
    }

    async fn update_destination(&self, request: UpdateDestinationRequest) -> ServiceResult<Destination> {
        let mut stored = self.existing(&request.tenant_id, &request.kind, &request.id).await?;
        let new_type = request.r#type.clone().filter(|kind| *kind != stored.destination.r#type);
        if request.config_json.is_some() || new_type.is_some() {
            // Members merged into the stored config (secrets included); a member set to null is
            // removed. A new type given with a config takes that config alone (the old type's members
            // mean nothing to it); without one, the stored config must suit the new type.
            let mut config = match (&new_type, &request.config_json) {
                (Some(_), Some(_)) => Map::new(),
                _ => self
                    .opener
                    .config(&stored)
                    .map_err(|error| ServiceError::internal(format!("cannot open a destination's secrets: {error}")))?,
            };
            for (name, value) in config_object(request.config_json.as_deref().unwrap_or("{}"))? {
                if value.is_null() {
                    config.remove(&name);
                } else {
                    config.insert(name, value);
                }
            }
            if let Some(new_type) = new_type {
                stored.destination.r#type = new_type;
            }
            formats::validate(&stored.destination.kind, &stored.destination.r#type, &config).map_err(invalid)?;
            self.check_reachable(&stored.destination.kind, &stored.destination.r#type, &config)?;
            stored.sealed = self.opener.seal(&mut stored.destination, config)?;
        }
        let destination = &mut stored.destination;
        if let Some(name) = &request.name {
            destination.name = validate_name(name)?;
        }
        if request.set_event_types {
            validate_event_types(&request.event_types).map_err(invalid)?;
            destination.event_types = request.event_types;
        }
        if request.batch_max_size.is_some() || request.batch_flush_interval_ms.is_some() {
            let (size, flush) = batching(
                request.batch_max_size.unwrap_or(destination.batch_max_size),
                request.batch_flush_interval_ms.unwrap_or(destination.batch_flush_interval_ms),
            )?;
            destination.batch_max_size = size;
            destination.batch_flush_interval_ms = flush;
        }
        if let Some(rules) = &request.filter_rules_json {
            destination.filter_rules_json = filter_rules(rules)?;
        }
        if let Some(enabled) = request.enabled {
            destination.enabled = enabled;
        }
        destination.updated_at = now_timestamp();
        self.store.put(&stored, true).await.map_err(failure)?;
        self.dispatcher.forget(&stored.destination.tenant_id).await;
        Ok(stored.destination)
    }

    async fn delete_destination(&self, request: DestinationRef) -> ServiceResult<Destination> {
        let stored = self.existing(&request.tenant_id, &request.kind, &request.id).await?;
        self.store.delete(&request.tenant_id, &request.id).await.map_err(failure)?;
        self.dispatcher.forget(&request.tenant_id).await;
        Ok(stored.destination)
    }

    async fn set_enabled(&self, request: SetEnabledRequest) -> ServiceResult<Destination> {
        let update = UpdateDestinationRequest {
            tenant_id: request.tenant_id,
            kind: request.kind,
            id: request.id,
            enabled: Some(request.enabled),
            ..UpdateDestinationRequest::default()
        };
        self.update_destination(update).await
    }

    async fn test_destination(&self, request: DestinationRef) -> ServiceResult<TestResult> {
        let stored = self.existing(&request.tenant_id, &request.kind, &request.id).await?;
        let config =
            self.opener.config(&stored).map_err(|error| ServiceError::internal(format!("cannot open a destination's secrets: {error}")))?;
        let event = synthetic_usage(&request.tenant_id);
        let destination = &stored.destination;
        let outcome = match formats::request(&destination.kind, &destination.r#type, &config, &[event], chrono::Utc::now()) {
            Ok(http_request) => self.egress.send(http_request).await.map_err(|error| error.message),
            Err(error) => Err(error),
        };
        let (sent, failed) = if outcome.is_ok() { (1, 0) } else { (0, 1) };
        self.store.record(&destination.id, sent, failed, 0, &now_timestamp()).await.map_err(failure)?;
        Ok(match outcome {
            Ok(()) => TestResult { delivered: true, error: String::new() },
            Err(error) => TestResult { delivered: false, error },
        })
    }

    async fn destination_stats(&self, request: DestinationRef) -> ServiceResult<DeliveryStats> {
        let stored = self.existing(&request.tenant_id, &request.kind, &request.id).await?;
        let mut stats = self.store.stats_since(&request.id, &day_ago_hour()).await.map_err(failure)?;
        stats.last_delivery_at = stored.destination.last_delivery_at;
        Ok(stats)
    }

    async fn get_config(&self, request: TenantRef) -> ServiceResult<FanoutConfig> {
        let enabled = self.store.enabled(&request.tenant_id).await.map_err(failure)?;
        Ok(FanoutConfig { tenant_id: request.tenant_id, enabled })
    }

    async fn put_config(&self, request: FanoutConfig) -> ServiceResult<FanoutConfig> {
        self.store.set_enabled(&request.tenant_id, request.enabled, &now_timestamp()).await.map_err(failure)?;
        self.dispatcher.forget(&request.tenant_id).await;
        Ok(request)
    }

    async fn record_events(&self, request: FanoutEvents) -> ServiceResult<RecordEventsResponse> {
        let mut fanned = Vec::new();
        for bytes in &request.budget_events {
            let event = BudgetEvent::decode(bytes.as_slice())
                .map_err(|error| ServiceError::invalid("invalid_event", format!("a budget event does not decode: {error}")))?;
            fanned.push(Source::Budget(Arc::new(event)));
        }
        for bytes in &request.audit_records {
            let record = AuditRecord::decode(bytes.as_slice())
                .map_err(|error| ServiceError::invalid("invalid_event", format!("an audit record does not decode: {error}")))?;
            fanned.push(Source::Audit(Arc::new(record)));
        }
        fanned.extend(request.quality_events.into_iter().map(Source::Quality));
        fanned.extend(request.activity_events.into_iter().map(Source::Activity));
        let count = u32::try_from(fanned.len()).unwrap_or(u32::MAX);
        self.submit(fanned).await;
        Ok(RecordEventsResponse { events: count })
    }
}
