//! `GET /v1/usage/requests` and `GET /v1/usage/export`: the tenant's settled requests one by one
//! (metadata only: who, which model, tokens, cost, outcome, latency; never text), paged newest
//! first, and the same rows as a CSV or JSON-lines download for chargeback.

use std::fmt::Write as _;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use brainstorm_common::ApiError;
use brainstorm_common::money::Usd;
use brainstorm_proto::budget::{SettledRequest, SettledRequestPage, SettledRequestsQuery};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::EdgeState;
use crate::auth::Caller;
use crate::extract::Query;
use crate::routes::budget::{Answer, usd};
use crate::routes::prompts::{csv_field, csv_response};

/// Rows one export carries at most; past it the download says where to go on.
const MAX_EXPORT_ROWS: usize = 50_000;
/// Rows asked of the ledger per page while exporting.
const EXPORT_PAGE: u32 = 1_000;
/// The export's CSV columns, in order.
const CSV_COLUMNS: &str =
    "occurred_at,request_id,key_id,agent_id,conversation_id,model,provider,outcome,input_tokens,output_tokens,cost_usd,latency_ms";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UsageRequestsQuery {
    since: Option<String>,
    until: Option<String>,
    model: Option<String>,
    key_id: Option<String>,
    agent_id: Option<String>,
    outcome: Option<String>,
    limit: Option<u32>,
    cursor: Option<String>,
    /// Export only: `csv` (the default) or `jsonl`.
    format: Option<String>,
}

impl UsageRequestsQuery {
    fn ledger_query(&self, tenant_id: &str, limit: u32, cursor: Option<String>) -> SettledRequestsQuery {
        SettledRequestsQuery {
            tenant_id: tenant_id.to_string(),
            since: self.since.clone(),
            until: self.until.clone(),
            model: self.model.clone(),
            key_id: self.key_id.clone(),
            agent_id: self.agent_id.clone(),
            outcome: self.outcome.clone(),
            limit,
            cursor,
        }
    }
}

fn view(request: &SettledRequest) -> Value {
    json!({
        "request_id": request.request_id,
        "occurred_at": request.occurred_at,
        "key_id": request.key_id,
        "agent_id": request.agent_id,
        "conversation_id": request.conversation_id,
        "model": request.model,
        "provider": request.provider,
        "outcome": request.outcome,
        "input_tokens": request.input_tokens,
        "output_tokens": request.output_tokens,
        "cost_usd": usd(request.cost_nanos),
        "latency_ms": request.latency_ms,
    })
}

/// `GET /v1/usage/requests` (config.read): `since`, `until` (the last 30 days by default), exact
/// filters `model`, `key_id`, `agent_id`, `outcome`, `limit` (100, at most 1,000) and `cursor` (the
/// previous page's `next_cursor`).
pub async fn requests(State(state): State<EdgeState>, caller: Caller, Query(query): Query<UsageRequestsQuery>) -> Answer {
    caller.require("config.read")?;
    if query.format.is_some() {
        return Err(ApiError::invalid_request("invalid_query_parameter", "format belongs to /v1/usage/export"));
    }
    let request = query.ledger_query(caller.tenant_id()?, query.limit.unwrap_or(0), query.cursor.clone());
    let page = state.budget.list_settled_requests(request).await?;
    let requests: Vec<Value> = page.requests.iter().map(view).collect();
    Ok(Json(json!({
        "since": page.since,
        "until": page.until,
        "count": requests.len(),
        "requests": requests,
        "next_cursor": page.next_cursor,
    })))
}

/// One settled request as a CSV line (with its line break).
fn csv_line(request: &SettledRequest, out: &mut String) {
    let optional = |value: &Option<String>| value.as_deref().map(csv_field).unwrap_or_default();
    let _ = writeln!(
        out,
        "{},{},{},{},{},{},{},{},{},{},{},{}",
        csv_field(&request.occurred_at),
        csv_field(&request.request_id),
        optional(&request.key_id),
        optional(&request.agent_id),
        optional(&request.conversation_id),
        csv_field(&request.model),
        csv_field(&request.provider),
        csv_field(&request.outcome),
        request.input_tokens,
        request.output_tokens,
        Usd::from_nanos(request.cost_nanos).fixed(9),
        request.latency_ms,
    );
}

/// Fetches pages from `cursor` on, handing each row to `row`, until the pages end (then the cursor
/// is None) or at least `cap` rows are out (then it is where the next walk starts): the rows handed
/// out and that cursor.
async fn walk_pages<F, P, E>(
    mut cursor: Option<String>,
    cap: usize,
    mut fetch: F,
    mut row: impl FnMut(&SettledRequest),
) -> Result<(usize, Option<String>), E>
where
    F: FnMut(Option<String>) -> P,
    P: std::future::Future<Output = Result<SettledRequestPage, E>>,
{
    let mut rows = 0;
    loop {
        let page = fetch(cursor.take()).await?;
        page.requests.iter().for_each(&mut row);
        rows += page.requests.len();
        match page.next_cursor {
            Some(next) if rows >= cap => return Ok((rows, Some(next))),
            Some(next) => cursor = Some(next),
            None => return Ok((rows, None)),
        }
    }
}

/// `GET /v1/usage/export` (config.read): every settled request the filters of `/v1/usage/requests`
/// select, newest first, as `format=csv` (the default; RFC 4180, formula-like text defused) or
/// `jsonl` (one object per line, as `/v1/usage/requests` shows it). At most 50,000 rows: past
/// them `X-BR-Export-Truncated: true` and `X-BR-Next-Cursor` say where the next export starts.
pub async fn export(State(state): State<EdgeState>, caller: Caller, Query(query): Query<UsageRequestsQuery>) -> Result<Response, ApiError> {
    caller.require("config.read")?;
    let csv = match query.format.as_deref() {
        None | Some("csv") => true,
        Some("jsonl") => false,
        Some(_) => return Err(ApiError::invalid_request("invalid_format", "format is csv or jsonl")),
    };
    if query.limit.is_some() {
        return Err(ApiError::invalid_request(
            "invalid_query_parameter",
            "an export carries every row: page with /v1/usage/requests instead",
        ));
    }
    let tenant_id = caller.tenant_id()?.to_string();
    let mut out = String::new();
    if csv {
        out.push_str(CSV_COLUMNS);
        out.push('\n');
    }
    let fetch = |cursor: Option<String>| state.budget.list_settled_requests(query.ledger_query(&tenant_id, EXPORT_PAGE, cursor));
    let (rows, next_cursor) = walk_pages(query.cursor.clone(), MAX_EXPORT_ROWS, fetch, |request| {
        if csv {
            csv_line(request, &mut out);
        } else {
            out.push_str(&view(request).to_string());
            out.push('\n');
        }
    })
    .await?;
    let mut response = if csv {
        csv_response(out, "usage.csv")
    } else {
        let mut response = out.into_response();
        response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/x-ndjson"));
        response
    };
    response.headers_mut().insert("x-br-export-rows", HeaderValue::from(rows));
    if let Some(next) = next_cursor {
        response.headers_mut().insert("x-br-export-truncated", HeaderValue::from_static("true"));
        // A cursor is an instant and a request id, both header-safe text; should one not be, the
        // truncation is still said and `/v1/usage/requests` pages on from the last row.
        if let Ok(next) = HeaderValue::from_str(&next) {
            response.headers_mut().insert("x-br-next-cursor", next);
        }
    }
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settled(conversation_id: Option<&str>) -> SettledRequest {
        SettledRequest {
            request_id: "req_1".into(),
            occurred_at: "2026-11-30T08:00:00.000Z".into(),
            key_id: Some("key_1".into()),
            agent_id: None,
            conversation_id: conversation_id.map(str::to_string),
            model: "openai/gpt-4o".into(),
            provider: "openai".into(),
            outcome: "succeeded".into(),
            input_tokens: 12,
            output_tokens: 3,
            cost_nanos: 60_000,
            latency_ms: 41,
        }
    }

    /// Pages of `size` rows out of `total`, the cursor the index of the next row.
    fn pages(total: usize, size: usize) -> impl FnMut(Option<String>) -> std::future::Ready<Result<SettledRequestPage, ()>> {
        move |cursor| {
            let start: usize = cursor.map_or(0, |cursor| cursor.parse().unwrap_or(total));
            let end = (start + size).min(total);
            let requests = (start..end).map(|_| settled(None)).collect();
            std::future::ready(Ok(SettledRequestPage {
                requests,
                next_cursor: (end < total).then(|| end.to_string()),
                ..SettledRequestPage::default()
            }))
        }
    }

    #[tokio::test]
    async fn an_export_walks_every_page_and_stops_at_its_cap_with_the_next_cursor() {
        let mut seen = 0;
        let all = walk_pages(None, 50, pages(23, 5), |_| seen += 1).await;
        assert_eq!((all, seen), (Ok((23, None)), 23));
        // Capped at 10: two pages out, the third's start named.
        assert_eq!(walk_pages(None, 10, pages(23, 5), |_| ()).await, Ok((10, Some("10".to_string()))));
        // Going on from that cursor gives the rest.
        assert_eq!(walk_pages(Some("10".to_string()), 50, pages(23, 5), |_| ()).await, Ok((13, None)));
        // A cap reached exactly on the last page: nothing follows, so no cursor.
        assert_eq!(walk_pages(None, 23, pages(23, 23), |_| ()).await, Ok((23, None)));
    }

    #[test]
    fn a_csv_line_has_every_column_exact_cost_and_defused_text() {
        let mut out = String::new();
        csv_line(&settled(Some("=HYPERLINK(\"x\"),y")), &mut out);
        assert_eq!(
            out,
            "2026-11-30T08:00:00.000Z,req_1,key_1,,\"'=HYPERLINK(\"\"x\"\"),y\",openai/gpt-4o,openai,succeeded,12,3,0.000060000,41\n"
        );
        assert_eq!(out.matches(',').count() - 1, CSV_COLUMNS.matches(',').count(), "one comma is inside the quoted field");
    }
}
