//! The observability-fanout suite (store and service), run against SQLite and PostgreSQL alike: a
//! small axum server on 127.0.0.1:0 stands for destinations.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use brainstorm_common::on_both_engines;
use brainstorm_common::store::Database;
use brainstorm_observability_fanout::ObservabilityFanoutServiceImpl;
use brainstorm_proto::ErrorKind;
use brainstorm_proto::audit::AuditRecord;
use brainstorm_proto::budget::{BudgetEvent, Settlement, budget_event};
use brainstorm_proto::observability::*;
use brainstorm_providers::vault::MasterKey;
use prost::Message;
use serde_json::{Value, json};

type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;
type Received = Arc<Mutex<Vec<(String, HeaderMap, Bytes)>>>;

async fn receiver() -> Result<(String, Received), Box<dyn std::error::Error + Send + Sync>> {
    let received: Received = Arc::default();
    async fn take(State(received): State<Received>, uri: axum::http::Uri, headers: HeaderMap, body: Bytes) -> StatusCode {
        let path = uri.path().to_string();
        let mut received = received.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // `/flaky` fails its first two requests (a destination restarting), `/reject` every one.
        let earlier = received.iter().filter(|(at, _, _)| *at == path).count();
        received.push((path.clone(), headers, body));
        match path.as_str() {
            failing if failing.starts_with("/fail") => StatusCode::BAD_GATEWAY,
            "/flaky" if earlier < 2 => StatusCode::SERVICE_UNAVAILABLE,
            "/reject" => StatusCode::BAD_REQUEST,
            _ => StatusCode::OK,
        }
    }
    let router = Router::new().route("/{*path}", post(take)).with_state(received.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, router).await });
    Ok((format!("http://{address}"), received))
}

/// The service as the tests' receiver needs it: private addresses allowed (it listens on 127.0.0.1).
fn service(database: Database) -> Result<ObservabilityFanoutServiceImpl, Box<dyn std::error::Error + Send + Sync>> {
    service_with(database, &MasterKey::generate_hex(), true)
}

fn service_with(
    database: Database,
    master_key_hex: &str,
    allow_private_urls: bool,
) -> Result<ObservabilityFanoutServiceImpl, Box<dyn std::error::Error + Send + Sync>> {
    Ok(ObservabilityFanoutServiceImpl::new(
        database,
        MasterKey::from_hex(master_key_hex)?,
        &tokio::runtime::Handle::current(),
        allow_private_urls,
    ))
}

fn create(kind: &str, kind_type: &str, config: Value) -> CreateDestinationRequest {
    CreateDestinationRequest {
        tenant_id: "t1".into(),
        kind: kind.into(),
        name: format!("{kind_type} destination"),
        r#type: kind_type.into(),
        config_json: config.to_string(),
        event_types: Vec::new(),
        batch_max_size: 0,
        batch_flush_interval_ms: 50,
        filter_rules_json: String::new(),
    }
}

fn settlement(request_id: &str) -> Vec<u8> {
    let settlement = Settlement {
        request_id: request_id.into(),
        tenant_id: "t1".into(),
        model: "gpt-4o-mini".into(),
        provider: "openai".into(),
        input_tokens: 10,
        output_tokens: 5,
        cost_nanos: 1_500,
        outcome: "succeeded".into(),
        occurred_at: "2026-11-29T10:00:00.000Z".into(),
        ..Settlement::default()
    };
    BudgetEvent { kind: Some(budget_event::Kind::Settlement(settlement)) }.encode_to_vec()
}

async fn wait_for(received: &Received, path: &str, count: usize) -> Vec<Value> {
    for _ in 0..100 {
        let bodies: Vec<Value> = received
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .filter(|(at, _, _)| at == path)
            .filter_map(|(_, _, body)| serde_json::from_slice(body).ok())
            .collect();
        if bodies.iter().map(|body| body["events"].as_array().map_or(0, Vec::len)).sum::<usize>() >= count {
            return bodies;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Vec::new()
}

async fn destinations_seal_secrets_batch_and_count(database: Database) -> TestResult {
    let (base, received) = receiver().await?;
    let service = service(database)?;
    let webhook =
        service.create_destination(create("observability", "webhook", json!({"url": format!("{base}/hook"), "secret": "hush"}))).await?;
    assert_eq!(webhook.secrets_set, ["secret"]);
    assert!(!webhook.config_json.contains("hush"));
    let invalid = service.create_destination(create("observability", "datadog", json!({}))).await;
    assert_eq!(invalid.err().map(|error| error.reason), Some("invalid_destination".into()));
    let wrong_kind = service.create_destination(create("xdr", "webhook", json!({"url": base.clone()}))).await;
    assert_eq!(wrong_kind.err().map(|error| error.kind), Some(ErrorKind::InvalidArgument));

    // Three usage events and an audit record, relayed as an edge without a shared bus sends them.
    let record = AuditRecord {
        request_id: "req_4".into(),
        tenant_id: "t1".into(),
        outcome: "allowed".into(),
        occurred_at: "2026-11-29T10:00:00.000Z".into(),
        ..AuditRecord::default()
    };
    let other_tenant = AuditRecord { tenant_id: "t2".into(), ..record.clone() };
    let events = FanoutEvents {
        budget_events: vec![settlement("req_1"), settlement("req_2"), settlement("req_3")],
        audit_records: vec![record.encode_to_vec(), other_tenant.encode_to_vec()],
        quality_events: vec![QualityEvent {
            tenant_id: "t1".into(),
            run_id: "run_1".into(),
            prompt_id: "prompt_1".into(),
            test_case_count: 2,
            pass_count: 1,
            fail_count: 1,
            avg_score: 0.5,
            occurred_at: "2026-11-29T10:00:00.000Z".into(),
            ..QualityEvent::default()
        }],
        activity_events: vec![ActivityEvent {
            tenant_id: "t1".into(),
            action: "agent_certificate.revoked".into(),
            actor: "key:k1".into(),
            subject: "4a0b".into(),
            occurred_at: "2026-11-29T10:00:00.000Z".into(),
            severity: 3,
            ..ActivityEvent::default()
        }],
    };
    assert_eq!(service.record_events(events).await?.events, 7);
    let bodies = wait_for(&received, "/hook", 5).await;
    let names: Vec<String> = bodies
        .iter()
        .flat_map(|body| body["events"].as_array().cloned().unwrap_or_default())
        .filter_map(|event| event["event"].as_str().map(str::to_string))
        .collect();
    assert_eq!(names.iter().filter(|name| *name == "usage.succeeded").count(), 3);
    assert_eq!(names.iter().filter(|name| *name == "audit.allowed").count(), 1, "t2's record is not t1's");
    assert_eq!(names.iter().filter(|name| *name == "quality.evaluation.failed").count(), 1, "an evaluation with a failed case");
    assert_eq!(names.iter().filter(|name| *name == "audit.agent_certificate.revoked").count(), 1, "a certificate pulled");

    // Merging config: a member set to null goes, the secret stays sealed.
    let update = UpdateDestinationRequest {
        tenant_id: "t1".into(),
        kind: "observability".into(),
        id: webhook.id.clone(),
        config_json: Some(json!({"headers": {"x-team": "ai"}}).to_string()),
        set_event_types: true,
        event_types: vec!["audit".into()],
        ..UpdateDestinationRequest::default()
    };
    let updated = service.update_destination(update).await?;
    assert_eq!(
        (updated.event_types.as_slice(), updated.secrets_set.as_slice()),
        (["audit".to_string()].as_slice(), ["secret".to_string()].as_slice())
    );
    let bad_types = UpdateDestinationRequest {
        tenant_id: "t1".into(),
        kind: "observability".into(),
        id: webhook.id.clone(),
        set_event_types: true,
        event_types: vec!["billing".into()],
        ..UpdateDestinationRequest::default()
    };
    assert!(service.update_destination(bad_types).await.is_err());
    // A new type without a config keeps the stored one when it suits it (webhook and custom both
    // need a url), secrets included; one that does not suit is refused and changes nothing.
    let retype = |kind_type: &str| UpdateDestinationRequest {
        tenant_id: "t1".into(),
        kind: "observability".into(),
        id: webhook.id.clone(),
        r#type: Some(kind_type.into()),
        ..UpdateDestinationRequest::default()
    };
    let retyped = service.update_destination(retype("custom")).await?;
    assert_eq!((retyped.r#type.as_str(), retyped.secrets_set.as_slice()), ("custom", ["secret".to_string()].as_slice()));
    assert!(service.update_destination(retype("splunk")).await.is_err(), "splunk needs hec_url and hec_token");
    assert_eq!(service.update_destination(retype("webhook")).await?.r#type, "webhook");

    let failing = service.create_destination(create("observability", "custom", json!({"url": format!("{base}/fail")}))).await?;
    let reference = |id: &str| DestinationRef { tenant_id: "t1".into(), id: id.into(), kind: "observability".into() };
    let tested = service.test_destination(reference(&failing.id)).await?;
    assert!(!tested.delivered && tested.error.contains("502"), "{}", tested.error);
    assert!(service.test_destination(reference(&webhook.id)).await?.delivered);
    let stats = service.destination_stats(reference(&webhook.id)).await?;
    assert!(stats.sent >= 5 && !stats.last_delivery_at.is_empty(), "{stats:?}");
    assert_eq!(service.destination_stats(reference(&failing.id)).await?.failed, 1);
    let xdr_view = DestinationRef { kind: "xdr".into(), ..reference(&webhook.id) };
    assert_eq!(service.destination_stats(xdr_view).await.err().map(|error| error.kind), Some(ErrorKind::NotFound));

    assert!(service.get_config(TenantRef { tenant_id: "t1".into() }).await?.enabled, "on until switched off");
    service.put_config(FanoutConfig { tenant_id: "t1".into(), enabled: false }).await?;
    assert!(!service.get_config(TenantRef { tenant_id: "t1".into() }).await?.enabled);
    service.delete_destination(reference(&failing.id)).await?;
    assert_eq!(
        service
            .list_destinations(ListDestinationsRequest { tenant_id: "t1".into(), kind: "observability".into() })
            .await?
            .destinations
            .len(),
        1
    );
    Ok(())
}

fn requests_to(received: &Received, path: &str) -> usize {
    received.lock().unwrap_or_else(std::sync::PoisonError::into_inner).iter().filter(|(at, _, _)| at == path).count()
}

/// A batch a destination failed for a reason that may pass (503) is sent again until it goes; one
/// refused as malformed (400) is not.
async fn transient_failures_are_retried(database: Database) -> TestResult {
    let (base, received) = receiver().await?;
    let service = service(database)?;
    let flaky = service.create_destination(create("observability", "webhook", json!({"url": format!("{base}/flaky")}))).await?;
    let rejecting = service.create_destination(create("observability", "webhook", json!({"url": format!("{base}/reject")}))).await?;
    let events = FanoutEvents { budget_events: vec![settlement("req_9")], ..FanoutEvents::default() };
    assert_eq!(service.record_events(events).await?.events, 1);
    let reference = |id: &str| DestinationRef { tenant_id: "t1".into(), id: id.into(), kind: "observability".into() };
    let mut flaky_stats = DeliveryStats::default();
    for _ in 0..100 {
        flaky_stats = service.destination_stats(reference(&flaky.id)).await?;
        if flaky_stats.sent > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!((flaky_stats.sent, flaky_stats.failed), (1, 0), "delivered on the third attempt");
    assert_eq!(requests_to(&received, "/flaky"), 3);
    let rejected = service.destination_stats(reference(&rejecting.id)).await?;
    assert_eq!((rejected.sent, rejected.failed), (0, 1));
    assert_eq!(requests_to(&received, "/reject"), 1, "a 400 is not sent again");
    Ok(())
}

/// At a stop, events waiting for their batch's interval are sent at once, and the stop waits for them.
async fn a_stop_sends_what_waits(database: Database) -> TestResult {
    let (base, received) = receiver().await?;
    let service = service(database)?;
    let patient = CreateDestinationRequest {
        batch_max_size: 1_000,
        batch_flush_interval_ms: 300_000,
        ..create("observability", "webhook", json!({"url": format!("{base}/later")}))
    };
    service.create_destination(patient).await?;
    let events = FanoutEvents { budget_events: vec![settlement("req_20"), settlement("req_21")], ..FanoutEvents::default() };
    assert_eq!(service.record_events(events).await?.events, 2);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(requests_to(&received, "/later"), 0, "the batch waits for its interval");
    service.finish_deliveries().await;
    let bodies = wait_for(&received, "/later", 2).await;
    assert_eq!(bodies.len(), 1, "one batch of both events, sent by the stop");
    Ok(())
}

on_both_engines!(
    destinations_seal_secrets_batch_and_count,
    transient_failures_are_retried,
    a_stop_sends_what_waits,
    destinations_inside_the_network_are_refused_unless_allowed
);

async fn destinations_inside_the_network_are_refused_unless_allowed(database: Database) -> TestResult {
    let (base, received) = receiver().await?;
    let master_key = MasterKey::generate_hex();
    let strict = service_with(database.clone(), &master_key, false)?;
    let refused = |error: Option<brainstorm_proto::ServiceError>| {
        error.is_some_and(|error| error.reason == "invalid_destination" && error.message.contains("BR_OBSERVABILITY_ALLOW_PRIVATE_URLS"))
    };
    // By URL, by endpoint, and by the pieces an S3 URL is built from.
    for (kind, kind_type, config) in [
        ("observability", "webhook", json!({"url": format!("{base}/hook")})),
        ("observability", "webhook", json!({"url": "http://169.254.169.254/latest/meta-data"})),
        ("observability", "otlp", json!({"endpoint": "http://localhost:4318"})),
        ("xdr", "splunk", json!({"hec_url": "https://10.0.0.8:8088", "hec_token": "t"})),
        ("observability", "s3", json!({"bucket": "b@127.0.0.1#", "region": "eu-west-1", "access_key_id": "A", "secret_access_key": "S"})),
    ] {
        let answer = strict.create_destination(create(kind, kind_type, config.clone())).await;
        assert!(refused(answer.as_ref().err().cloned()), "{kind_type} {config}: {answer:?}");
    }
    // A public one is accepted, and cannot be moved inside the network.
    let public = strict.create_destination(create("observability", "webhook", json!({"url": "https://hooks.example.com/x"}))).await?;
    let inward = UpdateDestinationRequest {
        tenant_id: "t1".into(),
        kind: "observability".into(),
        id: public.id.clone(),
        config_json: Some(json!({"url": format!("{base}/moved")}).to_string()),
        ..UpdateDestinationRequest::default()
    };
    assert!(refused(strict.update_destination(inward).await.err()));
    strict.delete_destination(DestinationRef { tenant_id: "t1".into(), id: public.id.clone(), kind: "observability".into() }).await?;

    // Saved while the operator allowed private addresses, it is not reached once they do not.
    let lenient = service_with(database.clone(), &master_key, true)?;
    let inside = lenient.create_destination(create("observability", "webhook", json!({"url": format!("{base}/inside")}))).await?;
    let inside_ref = DestinationRef { tenant_id: "t1".into(), id: inside.id.clone(), kind: "observability".into() };
    assert!(lenient.test_destination(inside_ref.clone()).await?.delivered);
    let strict_test = strict.test_destination(inside_ref.clone()).await?;
    assert!(!strict_test.delivered && strict_test.error.contains("BR_OBSERVABILITY_ALLOW_PRIVATE_URLS"), "{strict_test:?}");
    let before = received.lock().unwrap_or_else(std::sync::PoisonError::into_inner).len();
    assert_eq!(
        strict.record_events(FanoutEvents { budget_events: vec![settlement("req_40")], ..FanoutEvents::default() }).await?.events,
        1
    );
    strict.finish_deliveries().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(received.lock().unwrap_or_else(std::sync::PoisonError::into_inner).len(), before, "nothing reaches the private address");
    let stats =
        strict.destination_stats(DestinationRef { tenant_id: "t1".into(), id: inside.id.clone(), kind: "observability".into() }).await?;
    assert!(stats.failed >= 2, "{stats:?}");
    Ok(())
}
