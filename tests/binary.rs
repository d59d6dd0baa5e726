//! The binary's own behaviour: configuration errors, graceful shutdown, durability across restarts.

use brainstorm_e2e::{Gateway, Shape, run_to_end, temp_dir};
use reqwest::Method;
use serde_json::json;

type TestResult = anyhow::Result<()>;

/// Arguments, environment, and what the error must mention.
type ConfigCase = (&'static [&'static str], &'static [(&'static str, &'static str)], &'static str);

#[test]
fn bad_configuration_stops_start_up_naming_the_setting() -> TestResult {
    let work_dir = temp_dir("config")?;
    let cases: [ConfigCase; 9] = [
        (&["up", "--listen", "not-an-address"], &[], "listen"),
        (&["up"], &[("BR_REQUIRE_AGENT_OWNER", "perhaps")], "BR_REQUIRE_AGENT_OWNER"),
        (&["up"], &[("BR_MASTER_KEY", "too-short")], "master_key"),
        (&["serve", "edge-router"], &[], "BR_IDENTITY_URL"),
        (&["serve", "identity"], &[], "BR_DATABASE_URL"),
        (&["serve", "teleporter"], &[], "unknown service"),
        (&["operator"], &[], "the operator needs identity: set BR_IDENTITY_URL"),
        (&["up"], &[("BR_CACHE_TTL_MS", "forever")], "cache_ttl_ms"),
        (&["up"], &[("BR_RESPONSE_CACHE_TTL_MS", "0")], "response_cache_ttl_ms"),
    ];
    for (arguments, env, expected) in cases {
        let (succeeded, output) = run_to_end(arguments, env, &work_dir)?;
        assert!(!succeeded, "{arguments:?} should fail");
        assert!(output.contains(expected), "{arguments:?}: expected `{expected}` in: {output}");
    }
    let config = work_dir.join("brainstorm.toml");
    std::fs::write(&config, "listen = \"127.0.0.1:1\"\nunknown_key = true\n")?;
    let config_text = config.display().to_string();
    let (succeeded, output) = run_to_end(&["up", "--config", &config_text], &[], &work_dir)?;
    assert!(!succeeded && output.contains("unknown_key"), "{output}");
    // A gRPC address for `up` that is taken stops start-up instead of running without it.
    let taken = std::net::TcpListener::bind("127.0.0.1:0")?;
    let taken_address = taken.local_addr()?.to_string();
    let listen = format!("127.0.0.1:{}", brainstorm_e2e::free_port()?);
    let (succeeded, output) = run_to_end(&["up", "--listen", &listen, "--grpc-listen", &taken_address], &[], &work_dir)?;
    assert!(!succeeded && output.contains("cannot listen for gRPC"), "{output}");
    Ok(())
}

#[test]
fn a_distributed_identity_refuses_an_unmigrated_database() -> TestResult {
    let runtime = tokio::runtime::Runtime::new()?;
    let database_url = runtime.block_on(brainstorm_e2e::fresh_postgres_database())?;
    let work_dir = temp_dir("unmigrated")?;
    let (succeeded, output) = run_to_end(
        &["serve", "identity", "--database-url", &database_url, "--grpc-listen", "127.0.0.1:0", "--listen", "127.0.0.1:0"],
        &[],
        &work_dir,
    )?;
    assert!(!succeeded && output.contains("brainstorm migrate"), "{output}");
    Ok(())
}

#[tokio::test]
async fn sigterm_stops_cleanly_and_data_survives_a_restart() -> TestResult {
    let mut gateway = Gateway::start(Shape::Embedded).await?;
    let (key, _) = gateway.register("Durable").await?;
    assert!(gateway.terminate()?, "the process must exit 0 on SIGTERM:\n{}", gateway.logs());
    assert!(gateway.log_of("up").contains("shutdown requested"));

    // Start again on the same data directory: the tenant and its key are still there.
    let data_dir = gateway.work_dir.join("data");
    let port = brainstorm_e2e::free_port()?;
    let listen = format!("127.0.0.1:{port}");
    let data_dir_text = data_dir.display().to_string();
    let mut restarted = std::process::Command::new(brainstorm_e2e::binary()?)
        .args(["up", "--listen", &listen, "--data-dir", &data_dir_text])
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let client = reqwest::Client::new();
    let mut status = 0;
    for _ in 0..200 {
        if let Ok(response) = client.request(Method::GET, format!("http://{listen}/v1/account")).bearer_auth(&key).send().await {
            status = response.status().as_u16();
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    restarted.kill()?;
    restarted.wait()?;
    assert_eq!(status, 200, "the key registered before the restart must still work");
    Ok(())
}

#[tokio::test]
async fn a_distributed_edge_relays_every_answered_request_before_exiting() -> TestResult {
    // Without Kafka the edge relays audit records to the chain writer over gRPC. The writer is away
    // while the requests are answered and when the edge is told to stop, so the records are still on
    // the edge's bus then: only relaying them before the exit puts them in the chain.
    let mut gateway = Gateway::start(Shape::Distributed).await?;
    let (key, _) = gateway.register("Relayed").await?;
    gateway.kill("audit")?;
    let mut commitments = Vec::new();
    for _ in 0..3 {
        let denied = gateway.call(Method::POST, "/v1/chat/completions", Some(&key), Some(json!({"model": "m", "messages": []}))).await?;
        assert_eq!(denied.status, 400);
        commitments.push(denied.header("x-br-audit-hash").unwrap_or_default().to_string());
    }
    gateway.signal_stop("edge-router")?;
    // The edge has stopped answering but waits for its relay; the chain writer comes back (an edge
    // that exited at the signal fails this restart, which finds it gone).
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    gateway.restart("audit").await?;
    let clean = gateway.wait_exit("edge-router", std::time::Duration::from_secs(30))?;
    assert!(clean, "the edge must exit 0 on SIGTERM:\n{}", gateway.logs());

    let database = sqlx::PgPool::connect(&gateway.database_url).await?;
    let chained: i64 =
        sqlx::query_scalar("SELECT count(*) FROM audit_chain WHERE commitment = ANY($1)").bind(&commitments).fetch_one(&database).await?;
    database.close().await;
    assert_eq!(chained, 3, "every answered request is chained before the edge exits:\n{}", gateway.log_of("edge-router"));
    Ok(())
}

#[tokio::test]
async fn sigterm_chains_every_answered_request_before_exiting() -> TestResult {
    // A linger far longer than the test takes: the records are still waiting to be written when the
    // signal comes, so only finishing the writes at the stop puts them in the chain.
    let mut gateway = Gateway::start_with(Shape::Embedded, &[("BR_WRITE_LINGER_MS", "10000")]).await?;
    let (key, _) = gateway.register("Evidence").await?;
    let mut commitments = Vec::new();
    for _ in 0..3 {
        let denied = gateway.call(Method::POST, "/v1/chat/completions", Some(&key), Some(json!({"model": "m", "messages": []}))).await?;
        assert_eq!(denied.status, 400);
        commitments.push(denied.header("x-br-audit-hash").unwrap_or_default().to_string());
    }
    assert!(gateway.terminate()?, "the process must exit 0 on SIGTERM:\n{}", gateway.logs());

    // The same process on the same data directory: what it finds was written before the exit.
    gateway.restart("up").await?;
    let report = gateway.call(Method::GET, "/v1/governance/audit/chain/verify", Some(&key), None).await?.body;
    assert_eq!(report["valid"], true, "{report}");
    assert_eq!(report["checked"], 3, "every answered request is chained before the process exits: {report}");
    assert!(commitments.iter().all(|commitment| commitment.len() == 64));
    Ok(())
}
