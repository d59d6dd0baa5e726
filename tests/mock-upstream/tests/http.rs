//! The mock driven over HTTP, in-process and as the `mock-upstream` binary.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use brainstorm_mock_upstream::{FailSpec, MockConfig, MockUpstream, RecordedRequest};
use serde_json::{Value, json};

use support::{ANTHROPIC_VERSION, keyed_mock, open_mock, sse_data, sse_events, wait_for_record};

// Helpers live in a test module so the workspace's unwrap lints treat them as test code.
#[cfg(test)]
mod support {
    use std::time::{Duration, Instant};

    use brainstorm_mock_upstream::{MockConfig, MockUpstream, RecordedRequest};
    use serde_json::Value;

    pub const ANTHROPIC_VERSION: &str = "2023-06-01";

    pub async fn open_mock() -> MockUpstream {
        MockUpstream::start(MockConfig::default()).await.unwrap()
    }

    pub async fn keyed_mock() -> MockUpstream {
        MockUpstream::start(MockConfig { valid_keys: vec!["good-key".into(), "other-key".into()], ..MockConfig::default() }).await.unwrap()
    }

    /// The JSON payloads of an SSE body's `data:` lines, in order (`[DONE]` left out).
    pub fn sse_data(body: &str) -> Vec<Value> {
        body.lines()
            .filter_map(|line| line.strip_prefix("data: "))
            .filter(|data| *data != "[DONE]")
            .map(|data| serde_json::from_str(data).unwrap())
            .collect()
    }

    /// The `event:` names of an SSE body.
    pub fn sse_events(body: &str) -> Vec<String> {
        body.lines().filter_map(|line| line.strip_prefix("event: ")).map(str::to_string).collect()
    }

    /// Waits until a recorded request satisfies `condition`, and returns it.
    pub async fn wait_for_record(mock: &MockUpstream, condition: impl Fn(&RecordedRequest) -> bool) -> RecordedRequest {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(request) = mock.requests().into_iter().find(|request| condition(request)) {
                return request;
            }
            assert!(Instant::now() < deadline, "no matching record in {:#?}", mock.requests());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

#[tokio::test]
async fn openai_completion_is_answered_and_recorded() {
    let mock = open_mock().await;
    let client = reqwest::Client::new();
    let response = client
        .post(format!("{}/v1/chat/completions?trace=1", mock.base_url()))
        .bearer_auth("sk-anything")
        .header("X-Custom", "Yes")
        .json(&json!({"model": "gpt-4o-mini", "messages": [{"role": "system", "content": "short"}, {"role": "user", "content": "hello world"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(response.headers()["content-type"].to_str().unwrap().starts_with("application/json"));
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["model"], "gpt-4o-mini");
    assert_eq!(body["choices"][0]["message"]["content"], "mock openai reply to: hello world");
    assert_eq!(body["usage"], json!({"prompt_tokens": 3, "completion_tokens": 6, "total_tokens": 9}));

    let requests = mock.requests();
    assert_eq!(requests.len(), 1);
    let recorded = &requests[0];
    assert_eq!(
        (recorded.method.as_str(), recorded.path.as_str(), recorded.query.as_deref()),
        ("POST", "/v1/chat/completions", Some("trace=1"))
    );
    assert_eq!(recorded.headers["authorization"], "Bearer sk-anything");
    assert_eq!(recorded.headers["x-custom"], "Yes");
    assert_eq!(recorded.body["model"], "gpt-4o-mini");
    assert_eq!(recorded.body_text, None);
    assert_eq!((recorded.status, recorded.stream, recorded.completed, recorded.client_disconnected), (200, false, true, false));
    assert_eq!(body["id"], format!("chatcmpl-mock-{}", recorded.seq));

    mock.clear();
    assert!(mock.requests().is_empty());
}

#[tokio::test]
async fn openai_models_list() {
    let mock = open_mock().await;
    let body: Value = reqwest::get(format!("{}/v1/models", mock.base_url())).await.unwrap().json().await.unwrap();
    assert_eq!(body["object"], "list");
    assert!(
        body["data"]
            .as_array()
            .unwrap()
            .iter()
            .all(|model| model["object"] == "model" && model["owned_by"] == "openai" && model["id"].is_string())
    );
}

#[tokio::test]
async fn openai_stream_reassembles_to_the_completion() {
    let mock = MockUpstream::start(MockConfig { chunk_delay: Duration::from_millis(1), ..MockConfig::default() }).await.unwrap();
    let client = reqwest::Client::new();
    let request = json!({
        "model": "gpt-4o", "stream": true, "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": "tell me  a story"}],
    });
    let response = client.post(format!("{}/v1/chat/completions", mock.base_url())).json(&request).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert!(response.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
    let text = response.text().await.unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"));
    let chunks = sse_data(&text);
    let content: String = chunks.iter().filter_map(|chunk| chunk["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(content, "mock openai reply to: tell me  a story");
    assert_eq!(chunks.iter().filter(|chunk| chunk["choices"][0]["delta"]["content"].as_str().is_some_and(|c| !c.is_empty())).count(), 8);
    assert!(chunks.iter().all(|chunk| chunk["model"] == "gpt-4o"));
    let usage = chunks.last().unwrap();
    assert_eq!(usage["usage"], json!({"prompt_tokens": 4, "completion_tokens": 8, "total_tokens": 12}));

    let recorded = wait_for_record(&mock, |request| request.completed).await;
    assert!(recorded.stream);
    assert!(!recorded.client_disconnected);
}

#[tokio::test]
async fn openai_tool_call_stream() {
    let mock = open_mock().await;
    let request = json!({
        "model": "gpt-4o", "stream": true,
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}],
        "messages": [{"role": "user", "content": "use a tool to check Paris"}],
    });
    let text = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", mock.base_url()))
        .json(&request)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let chunks = sse_data(&text);
    let calls: Vec<&Value> = chunks.iter().filter_map(|chunk| chunk["choices"][0]["delta"].get("tool_calls")).collect();
    assert!(calls.len() >= 3, "a header and at least two argument fragments");
    assert_eq!(calls[0][0]["function"]["name"], "get_weather");
    assert!(calls[0][0]["id"].as_str().unwrap().starts_with("call_"));
    let arguments: String = calls.iter().map(|call| call[0]["function"]["arguments"].as_str().unwrap()).collect();
    assert_eq!(serde_json::from_str::<Value>(&arguments).unwrap(), json!({"query": "use a tool to check Paris"}));
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "tool_calls");
}

#[tokio::test]
async fn anthropic_message_and_stream() {
    let mock = open_mock().await;
    let client = reqwest::Client::new();
    let request = json!({"model": "claude-sonnet-4-20250514", "max_tokens": 64, "system": "terse", "messages": [{"role": "user", "content": "hi there"}]});
    let body: Value = client
        .post(format!("{}/v1/messages", mock.base_url()))
        .header("x-api-key", "sk-ant")
        .header("anthropic-version", ANTHROPIC_VERSION)
        .json(&request)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(body["type"], "message");
    assert_eq!(body["model"], "claude-sonnet-4-20250514");
    assert_eq!(body["content"][0], json!({"type": "text", "text": "mock anthropic reply to: hi there"}));
    assert_eq!(body["usage"], json!({"input_tokens": 3, "output_tokens": 6}));

    let mut streaming = request.clone();
    streaming["stream"] = json!(true);
    let text = client
        .post(format!("{}/v1/messages", mock.base_url()))
        .header("x-api-key", "sk-ant")
        .header("anthropic-version", ANTHROPIC_VERSION)
        .json(&streaming)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let events = sse_events(&text);
    assert_eq!(events.first().map(String::as_str), Some("message_start"));
    assert_eq!(events.last().map(String::as_str), Some("message_stop"));
    let data = sse_data(&text);
    let reassembled: String = data.iter().filter_map(|event| event["delta"]["text"].as_str()).collect();
    assert_eq!(reassembled, body["content"][0]["text"].as_str().unwrap());
    let models: Value = client
        .get(format!("{}/v1/models", mock.base_url()))
        .header("x-api-key", "sk-ant")
        .header("anthropic-version", ANTHROPIC_VERSION)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["has_more"], false);
    assert!(models["data"].as_array().unwrap().iter().all(|model| model["type"] == "model"));
}

#[tokio::test]
async fn anthropic_tool_use_stream() {
    let mock = open_mock().await;
    let request = json!({
        "model": "claude", "max_tokens": 64, "stream": true,
        "tools": [{"name": "lookup", "input_schema": {"type": "object"}}, {"name": "second"}],
        "messages": [{"role": "user", "content": "please use a tool"}],
    });
    let text = reqwest::Client::new()
        .post(format!("{}/v1/messages", mock.base_url()))
        .bearer_auth("sk-ant")
        .header("anthropic-version", ANTHROPIC_VERSION)
        .json(&request)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let data = sse_data(&text);
    let start = data.iter().find(|event| event["type"] == "content_block_start").unwrap();
    assert_eq!(start["content_block"]["type"], "tool_use");
    assert_eq!(start["content_block"]["name"], "lookup");
    let partials: Vec<&str> = data.iter().filter_map(|event| event["delta"]["partial_json"].as_str()).collect();
    assert!(partials.len() >= 2);
    assert_eq!(serde_json::from_str::<Value>(&partials.concat()).unwrap(), json!({"query": "please use a tool"}));
    let delta = data.iter().find(|event| event["type"] == "message_delta").unwrap();
    assert_eq!(delta["delta"]["stop_reason"], "tool_use");
    assert_eq!(delta["usage"]["output_tokens"], 5);
}

#[tokio::test]
async fn gemini_generate_and_stream() {
    let mock = open_mock().await;
    let client = reqwest::Client::new();
    let request = json!({
        "systemInstruction": {"parts": [{"text": "be nice"}]},
        "contents": [{"role": "user", "parts": [{"text": "what is up"}]}],
        "generationConfig": {"maxOutputTokens": 100, "temperature": 0.5},
    });
    let body: Value = client
        .post(format!("{}/v1beta/models/gemini-2.0-flash:generateContent", mock.base_url()))
        .header("x-goog-api-key", "g-key")
        .json(&request)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(body["candidates"][0]["content"]["parts"][0]["text"], "mock gemini reply to: what is up");
    assert_eq!(body["candidates"][0]["content"]["role"], "model");
    assert_eq!(body["usageMetadata"], json!({"promptTokenCount": 5, "candidatesTokenCount": 7, "totalTokenCount": 12}));
    assert_eq!(body["modelVersion"], "gemini-2.0-flash");

    let response = client
        .post(format!("{}/v1beta/models/gemini-2.0-flash:streamGenerateContent?alt=sse&key=g-key", mock.base_url()))
        .json(&request)
        .send()
        .await
        .unwrap();
    assert!(response.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
    let chunks = sse_data(&response.text().await.unwrap());
    let text: String = chunks.iter().filter_map(|chunk| chunk["candidates"][0]["content"]["parts"][0]["text"].as_str()).collect();
    assert_eq!(text, "mock gemini reply to: what is up");
    assert_eq!(chunks.last().unwrap()["candidates"][0]["finishReason"], "STOP");
    assert_eq!(chunks.last().unwrap()["usageMetadata"]["totalTokenCount"], 12);

    let array: Value = client
        .post(format!("{}/v1beta/models/gemini-2.0-flash:streamGenerateContent", mock.base_url()))
        .json(&request)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(array.as_array().unwrap().len(), chunks.len());

    let models: Value = client.get(format!("{}/v1beta/models?key=g-key", mock.base_url())).send().await.unwrap().json().await.unwrap();
    assert!(models["models"].as_array().unwrap().iter().all(|model| model["name"].as_str().unwrap().starts_with("models/")));
    let recorded = mock.requests();
    assert_eq!(recorded[1].query.as_deref(), Some("alt=sse&key=g-key"));
}

#[tokio::test]
async fn gemini_function_call() {
    let mock = open_mock().await;
    let request = json!({
        "tools": [{"functionDeclarations": [{"name": "search_docs", "parameters": {"type": "object"}}]}],
        "contents": [{"role": "user", "parts": [{"text": "Use a tool, please"}]}],
    });
    let body: Value = reqwest::Client::new()
        .post(format!("{}/v1beta/models/gemini-2.5-pro:generateContent", mock.base_url()))
        .json(&request)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        body["candidates"][0]["content"]["parts"][0]["functionCall"],
        json!({"name": "search_docs", "args": {"query": "Use a tool, please"}})
    );
    assert_eq!(body["candidates"][0]["finishReason"], "STOP");
}

#[tokio::test]
async fn unknown_or_missing_keys_are_refused_in_each_format() {
    let mock = keyed_mock().await;
    let client = reqwest::Client::new();
    let base = mock.base_url();
    let chat = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});

    let missing = client.post(format!("{base}/v1/chat/completions")).json(&chat).send().await.unwrap();
    assert_eq!(missing.status(), 401);
    let body: Value = missing.json().await.unwrap();
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert_eq!(body["error"]["code"], "invalid_api_key");
    assert!(body["error"]["message"].is_string());
    let wrong = client.get(format!("{base}/v1/models")).bearer_auth("bad").send().await.unwrap();
    assert_eq!(wrong.status(), 401);
    let good = client.post(format!("{base}/v1/chat/completions")).bearer_auth("other-key").json(&chat).send().await.unwrap();
    assert_eq!(good.status(), 200);

    let messages = json!({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "x"}]});
    let wrong = client
        .post(format!("{base}/v1/messages"))
        .header("x-api-key", "bad")
        .header("anthropic-version", ANTHROPIC_VERSION)
        .json(&messages)
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    let body: Value = wrong.json().await.unwrap();
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "authentication_error");
    let no_version = client.post(format!("{base}/v1/messages")).header("x-api-key", "good-key").json(&messages).send().await.unwrap();
    assert_eq!(no_version.status(), 400);
    let body: Value = no_version.json().await.unwrap();
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert!(body["error"]["message"].as_str().unwrap().contains("anthropic-version"));
    let anthropic_models = client
        .get(format!("{base}/v1/models"))
        .header("x-api-key", "bad")
        .header("anthropic-version", ANTHROPIC_VERSION)
        .send()
        .await
        .unwrap();
    assert_eq!(anthropic_models.status(), 401);
    assert_eq!(anthropic_models.json::<Value>().await.unwrap()["error"]["type"], "authentication_error");

    let wrong = client.get(format!("{base}/v1beta/models?key=bad")).send().await.unwrap();
    assert_eq!(wrong.status(), 401);
    assert_eq!(
        wrong.json::<Value>().await.unwrap()["error"],
        json!({"code": 401, "message": "API key not valid. Please pass a valid API key.", "status": "UNAUTHENTICATED"})
    );
    let good = client.get(format!("{base}/v1beta/models")).header("x-goog-api-key", "good-key").send().await.unwrap();
    assert_eq!(good.status(), 200);

    // Refused requests are recorded too.
    let statuses: Vec<u16> = mock.requests().iter().map(|request| request.status).collect();
    assert_eq!(statuses, [401, 401, 200, 401, 400, 401, 401, 200]);
}

#[tokio::test]
async fn fail_next_in_process() {
    let mock = open_mock().await;
    let client = reqwest::Client::new();
    let base = mock.base_url();
    let chat = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
    mock.fail_next(FailSpec { count: 2, status: 429, body: None, path_contains: Some("/chat/".into()) });

    // Another path is not affected.
    assert_eq!(client.get(format!("{base}/v1/models")).send().await.unwrap().status(), 200);
    for _ in 0..2 {
        let response = client.post(format!("{base}/v1/chat/completions")).json(&chat).send().await.unwrap();
        assert_eq!(response.status(), 429);
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], "rate_limit_exceeded");
    }
    assert_eq!(client.post(format!("{base}/v1/chat/completions")).json(&chat).send().await.unwrap().status(), 200);

    mock.fail_next(FailSpec { status: 503, body: Some(json!({"custom": true})), ..FailSpec::default() });
    let response = client
        .post(format!("{base}/v1/messages"))
        .header("anthropic-version", ANTHROPIC_VERSION)
        .json(&json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(response.json::<Value>().await.unwrap(), json!({"custom": true}));

    mock.fail_next(FailSpec { status: 500, ..FailSpec::default() });
    let response = client.post(format!("{base}/v1beta/models/g:generateContent")).json(&json!({"contents": []})).send().await.unwrap();
    assert_eq!(response.status(), 500);
    assert_eq!(response.json::<Value>().await.unwrap()["error"]["status"], "INTERNAL");

    mock.fail_next(FailSpec { status: 502, body: Some(json!("<html>bad gateway</html>")), ..FailSpec::default() });
    let response = client.get(format!("{base}/v1/models")).send().await.unwrap();
    assert_eq!(response.status(), 502);
    assert!(response.headers()["content-type"].to_str().unwrap().starts_with("text/plain"));
    assert_eq!(response.text().await.unwrap(), "<html>bad gateway</html>");

    mock.fail_next(FailSpec { count: 5, status: 500, ..FailSpec::default() });
    mock.clear_failures();
    assert_eq!(client.get(format!("{base}/v1/models")).send().await.unwrap().status(), 200);

    let statuses: Vec<u16> = mock.requests().iter().map(|request| request.status).collect();
    assert_eq!(statuses, [200, 429, 429, 200, 503, 500, 502, 200]);
}

#[tokio::test]
async fn control_endpoints_over_http() {
    let mock = open_mock().await;
    let client = reqwest::Client::new();
    let base = mock.base_url();

    let queued = client
        .post(format!("{base}/__mock/fail"))
        .json(&json!({"count": 1, "status": 418, "path_contains": "messages"}))
        .send()
        .await
        .unwrap();
    assert_eq!(queued.status(), 204);
    let refused = client.post(format!("{base}/__mock/fail")).json(&json!({"status": 42})).send().await.unwrap();
    assert_eq!(refused.status(), 400);
    let refused = client.post(format!("{base}/__mock/fail")).json(&json!({"statuss": 500})).send().await.unwrap();
    assert_eq!(refused.status(), 400);

    let response =
        client.post(format!("{base}/v1/messages")).header("anthropic-version", ANTHROPIC_VERSION).body("not json").send().await.unwrap();
    assert_eq!(response.status(), 418);
    assert_eq!(response.json::<Value>().await.unwrap()["type"], "error");

    let recorded: Vec<RecordedRequest> = client.get(format!("{base}/__mock/requests")).send().await.unwrap().json().await.unwrap();
    assert_eq!(recorded.len(), 1, "control calls are not recorded");
    assert_eq!(recorded[0].status, 418);
    assert_eq!(recorded[0].body, Value::Null);
    assert_eq!(recorded[0].body_text.as_deref(), Some("not json"));

    assert_eq!(client.delete(format!("{base}/__mock/requests")).send().await.unwrap().status(), 204);
    let recorded: Vec<Value> = client.get(format!("{base}/__mock/requests")).send().await.unwrap().json().await.unwrap();
    assert!(recorded.is_empty());

    client.post(format!("{base}/__mock/fail")).json(&json!({"count": 3})).send().await.unwrap();
    assert_eq!(client.delete(format!("{base}/__mock/fail")).send().await.unwrap().status(), 204);
    assert_eq!(client.get(format!("{base}/v1/models")).send().await.unwrap().status(), 200);
    assert_eq!(client.get(format!("{base}/__mock/nothing")).send().await.unwrap().status(), 404);
}

#[tokio::test]
async fn a_dropped_stream_is_recorded_as_disconnected() {
    let mock = MockUpstream::start(MockConfig { chunk_delay: Duration::from_millis(50), ..MockConfig::default() }).await.unwrap();
    let request = json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "one two three four five six seven eight nine ten"}]});
    let mut response = reqwest::Client::new().post(format!("{}/v1/chat/completions", mock.base_url())).json(&request).send().await.unwrap();
    let first = response.chunk().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: "));
    let started = Instant::now();
    drop(response);

    let recorded = wait_for_record(&mock, |request| request.client_disconnected).await;
    assert!(!recorded.completed);
    assert!(recorded.stream);
    // The chunks are produced lazily: the whole stream (17 chunks, 50 ms apart) was not waited for.
    assert!(started.elapsed() < Duration::from_millis(600), "{:?}", started.elapsed());
}

#[tokio::test]
async fn concurrent_requests_are_all_recorded() {
    let mock = open_mock().await;
    let client = reqwest::Client::new();
    let calls = (0..40).map(|index| {
        let client = client.clone();
        let url = format!("{}/v1/chat/completions", mock.base_url());
        async move {
            let body: Value = client
                .post(url)
                .json(&json!({"model": "m", "messages": [{"role": "user", "content": format!("request {index}")}]}))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            assert_eq!(body["choices"][0]["message"]["content"], format!("mock openai reply to: request {index}"));
        }
    });
    futures::future::join_all(calls).await;
    let seqs: Vec<u64> = mock.requests().iter().map(|request| request.seq).collect();
    assert_eq!(seqs, (0..40).collect::<Vec<u64>>());
}

#[tokio::test]
async fn dropping_the_mock_stops_it() {
    let mock = open_mock().await;
    let url = format!("{}/v1/models", mock.base_url());
    assert_eq!(reqwest::get(&url).await.unwrap().status(), 200);
    drop(mock);
    let deadline = Instant::now() + Duration::from_secs(5);
    // A fresh client: no pooled connection to the stopped server.
    while reqwest::Client::new().get(&url).send().await.is_ok() {
        assert!(Instant::now() < deadline, "the mock still answers");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[test]
fn the_binary_serves_and_logs_its_address() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_mock-upstream"))
        .args(["--listen", "127.0.0.1:0", "--valid-key", "k1", "--valid-key", "k2", "--chunk-delay-ms", "0"])
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    let address = loop {
        let line = lines.next().expect("the mock exited before logging its address").unwrap();
        if let Some(rest) = line.split("address=").nth(1) {
            break rest.split_whitespace().next().unwrap().to_string();
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let client = reqwest::Client::new();
        let refused = client.get(format!("http://{address}/v1/models")).bearer_auth("k3").send().await.unwrap();
        assert_eq!(refused.status(), 401);
        let accepted = client.get(format!("http://{address}/v1/models")).bearer_auth("k2").send().await.unwrap();
        assert_eq!(accepted.status(), 200);
        let recorded: Vec<RecordedRequest> =
            client.get(format!("http://{address}/__mock/requests")).send().await.unwrap().json().await.unwrap();
        assert_eq!(recorded.len(), 2);
    });
    child.kill().unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.stdout.is_empty(), "the binary prints nothing on stdout");
}
