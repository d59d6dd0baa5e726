//! The relay in front of the mock upstream, driven over HTTP as the benchmark's load generator does.

use brainstorm_mock_upstream::{MockConfig, MockUpstream};
use brainstorm_stack_relay::Relay;
use serde_json::{Value, json};
use tokio::net::TcpListener;

type Failure = Box<dyn std::error::Error>;

/// A relay to `upstream` on a free port, through axum or hyper alone; its base URL.
async fn relay_to(upstream: &str, axum: bool) -> Result<String, Failure> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    if axum {
        tokio::spawn(Relay::new(upstream.parse()?)?.serve_axum(listener));
    } else {
        tokio::spawn(Relay::<hyper::body::Incoming>::new(upstream.parse()?)?.serve(listener));
    }
    Ok(format!("http://{address}"))
}

#[tokio::test]
async fn completions_and_streams_pass_through_hyper_with_the_upstream_host() {
    pass_through(false).await.unwrap();
}

#[tokio::test]
async fn completions_and_streams_pass_through_axum_with_the_upstream_host() {
    pass_through(true).await.unwrap();
}

async fn pass_through(axum: bool) -> Result<(), Failure> {
    let mock = MockUpstream::start(MockConfig::default()).await?;
    let upstream = mock.address().to_string();
    let relay = relay_to(&upstream, axum).await?;
    let client = reqwest::Client::new();
    let body = json!({"model": "gpt-4o-mini", "max_tokens": 16, "messages": [{"role": "user", "content": "hello"}]});

    let answer = client
        .post(format!("{relay}/v1/chat/completions?trace=1"))
        .bearer_auth("sk-test")
        .header("connection", "keep-alive")
        .json(&body)
        .send()
        .await?;
    assert_eq!(answer.status(), 200);
    let reply: Value = answer.json().await?;
    assert_eq!(reply["object"], "chat.completion");
    assert!(reply["choices"][0]["message"]["content"].as_str().is_some_and(|text| !text.is_empty()));

    let mut stream_body = body.clone();
    stream_body["stream"] = json!(true);
    let streamed = client.post(format!("{relay}/v1/chat/completions")).bearer_auth("sk-test").json(&stream_body).send().await?;
    assert_eq!(streamed.status(), 200);
    let text = streamed.text().await?;
    assert!(text.contains("data: [DONE]"), "{text}");

    let seen = mock.requests();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].path, "/v1/chat/completions");
    assert_eq!(seen[0].query.as_deref(), Some("trace=1"));
    assert_eq!(seen[0].headers.get("authorization").map(String::as_str), Some("Bearer sk-test"));
    assert_eq!(seen[0].headers.get("host"), Some(&upstream));
    assert_eq!(seen[0].body, body);
    assert!(seen[1].stream);
    Ok(())
}

#[tokio::test]
async fn an_unreachable_upstream_is_a_bad_gateway() {
    // A port that was free a moment ago: nothing listens there.
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
    let relay = relay_to(&closed.to_string(), false).await.unwrap();
    let answer = reqwest::Client::new().post(format!("{relay}/v1/chat/completions")).body("{}").send().await.unwrap();
    assert_eq!(answer.status(), 502);
    assert!(answer.text().await.unwrap().starts_with("upstream unreachable"));
}
