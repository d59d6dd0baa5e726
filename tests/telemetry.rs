//! Trace export end to end in both shapes: with `OTEL_EXPORTER_OTLP_ENDPOINT` set, the gateway sends
//! one span per request over OTLP/gRPC to a collector (here an OTLP trace receiver served by the test,
//! from `opentelemetry-proto`), continuing the caller's `traceparent`; the audit evidence of a
//! completion (`traceparent` answer header) names that very span; and in the distributed shape a
//! service's span of a gRPC call continues the edge's trace.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use brainstorm_e2e::{Gateway, Shape, free_port};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use reqwest::Method;
use serde_json::json;

type TestResult = anyhow::Result<()>;

brainstorm_e2e::in_both_shapes!(requests_are_exported_as_spans_that_continue_the_callers_trace);

/// A span as received, with the `service.name` of the process that sent it.
#[derive(Clone, Debug)]
struct Received {
    service: String,
    span: Span,
}

#[derive(Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<Received>>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().map_err(|_| tonic::Status::internal("poisoned"))?;
        for resource_spans in request.into_inner().resource_spans {
            let service =
                resource_spans.resource.as_ref().and_then(|resource| attribute(&resource.attributes, "service.name")).unwrap_or_default();
            for scope in resource_spans.scope_spans {
                spans.extend(scope.spans.into_iter().map(|span| Received { service: service.clone(), span }));
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

fn attribute(attributes: &[KeyValue], key: &str) -> Option<String> {
    let value = attributes.iter().find(|attribute| attribute.key == key)?.value.as_ref()?.value.as_ref()?;
    Some(match value {
        AnyValue::StringValue(text) => text.clone(),
        AnyValue::IntValue(number) => number.to_string(),
        AnyValue::BoolValue(flag) => flag.to_string(),
        AnyValue::DoubleValue(number) => number.to_string(),
        other => format!("{other:?}"),
    })
}

async fn collector() -> anyhow::Result<(Collector, String)> {
    let port = free_port()?;
    let collector = Collector::default();
    let service = TraceServiceServer::new(collector.clone());
    let address = format!("127.0.0.1:{port}").parse()?;
    tokio::spawn(tonic::transport::Server::builder().add_service(service).serve(address));
    Ok((collector, format!("http://127.0.0.1:{port}")))
}

impl Collector {
    /// Waits (at most 20 s) for a span `accept` takes.
    async fn until(&self, what: &str, accept: impl Fn(&Received) -> bool) -> anyhow::Result<Received> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(found) = self.spans.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.iter().find(|span| accept(span)) {
                return Ok(found.clone());
            }
            if Instant::now() > deadline {
                let names: Vec<String> =
                    self.spans.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.iter().map(|received| received.span.name.clone()).collect();
                bail!("no span {what}; received {names:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

async fn requests_are_exported_as_spans_that_continue_the_callers_trace(shape: Shape) -> TestResult {
    let (collector, endpoint) = collector().await?;
    let gateway =
        Gateway::start_with(shape, &[("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()), ("OTEL_BSP_SCHEDULE_DELAY", "100")]).await?;
    let (key, _) = gateway.register("Traced").await?;
    let (trace_id, parent) = ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331");
    let answer = gateway
        .request(Method::POST, "/v1/chat/completions", Some(&key))
        .header("traceparent", format!("00-{trace_id}-{parent}-01"))
        .json(&json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "trace me"}]}))
        .send()
        .await?;
    assert_eq!(answer.status().as_u16(), 200);
    let header = |name: &str| answer.headers().get(name).and_then(|value| value.to_str().ok()).map(str::to_string);
    let request_id = header("x-br-request-id").context("no request id")?;
    let evidence = header("traceparent").context("no traceparent in the answer")?;
    let parts: Vec<&str> = evidence.split('-').collect();
    assert_eq!(parts.get(1).copied(), Some(trace_id), "{evidence}");
    let span_id = parts.get(2).context("no span id")?.to_string();

    let expected_service = match shape {
        Shape::Embedded => "brainstorm",
        Shape::Distributed => "brainstorm-edge-router",
    };
    // The edge's span: in the distributed shape the services' spans of the same request share its trace.
    let exported = collector
        .until("for the completion", |received| {
            hex(&received.span.trace_id) == trace_id && received.span.name == "POST /v1/chat/completions"
        })
        .await?;
    let span = &exported.span;
    assert_eq!(span.name, "POST /v1/chat/completions");
    assert_eq!(exported.service, expected_service);
    assert_eq!(hex(&span.parent_span_id), parent, "the caller's span is the parent");
    assert_eq!(hex(&span.span_id), span_id, "the evidence names the exported span");
    assert_eq!(attribute(&span.attributes, "br.request_id"), Some(request_id));
    assert_eq!(attribute(&span.attributes, "http.response.status_code"), Some("200".to_string()));
    assert_eq!(attribute(&span.attributes, "http.route"), Some("/v1/chat/completions".to_string()));
    assert!(span.end_time_unix_nano >= span.start_time_unix_nano && span.start_time_unix_nano > 0);

    // Across the gRPC hop (the distributed shape): the service's span continues the edge's.
    if shape == Shape::Distributed {
        let created = gateway.call(Method::POST, "/v1/agent/profiles", Some(&key), Some(json!({"agentId": "tracer"}))).await?;
        assert_eq!(created.status, 201, "{}", created.body);
        let edge = collector.until("for the profile creation", |received| received.span.name == "POST /v1/agent/profiles").await?;
        let hop = collector.until("in identity", |received| received.span.name == "IdentityService/create_agent_profile").await?;
        assert_eq!(hop.service, "brainstorm-identity");
        assert_eq!(hex(&hop.span.trace_id), hex(&edge.span.trace_id), "one trace across the hop");
        assert_eq!(hex(&hop.span.parent_span_id), hex(&edge.span.span_id), "the edge's span is the parent");
        assert_eq!(attribute(&hop.span.attributes, "rpc.system"), Some("grpc".to_string()));
        // The completion's own calls (the routing configuration, at least) joined the caller's trace.
        collector
            .until("of a service in the completion's trace", |received| {
                hex(&received.span.trace_id) == trace_id && received.service != "brainstorm-edge-router"
            })
            .await?;
    }

    // Without a traceparent: a new trace, rooted at the request; routes are named by their template.
    let reply = gateway.call(Method::GET, "/v1/approvals/apr_missing", Some(&key), None).await?;
    assert_eq!(reply.status, 404, "{}", reply.body);
    let root = collector.until("for the approval read", |received| received.span.name == "GET /v1/approvals/{id}").await?;
    assert!(root.span.parent_span_id.is_empty(), "a request without traceparent starts a trace");
    assert_eq!(attribute(&root.span.attributes, "http.response.status_code"), Some("404".to_string()));
    Ok(())
}
