//! `brainstorm`: the gateway binary. `up` runs every service in one process; `serve <service>...` runs
//! the named services with their gRPC servers; `migrate` applies the database migrations; `operator`
//! runs the Kubernetes operator and `crd` prints its resource definitions.

mod cli;
mod shape;
mod shutdown;
mod tls;
mod writer_thread;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{AuditCommand, Cli, Command};

/// jemalloc: a few hundred short-lived blocks per request, and jemalloc hands back the block freed
/// last (still in cache); against mimalloc, the same CPU per request within the noise, half the
/// last-level cache misses and about 40% less peak memory (docs/architecture.md, thirteenth pass).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Audit(AuditCommand::Verify { file }) = &cli.command {
        return verify_audit_export(file);
    }
    if let Command::Crd = &cli.command {
        return print_crds();
    }
    // One CPU (a container limited to one, or a process pinned to one): the single-threaded
    // scheduler, which parks and wakes without the work-stealing machinery a lone worker never uses.
    let one_cpu = std::thread::available_parallelism().is_ok_and(|cpus| cpus.get() == 1);
    let mut builder = if one_cpu { tokio::runtime::Builder::new_current_thread() } else { tokio::runtime::Builder::new_multi_thread() };
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => return fatal(&format!("cannot start the async runtime: {error}")),
    };
    let environment = std::env::vars().collect();
    let result = runtime.block_on(async move {
        let settings = cli.settings(&environment)?;
        let export = brainstorm_common::telemetry::init(
            settings.log_format,
            "info,sqlx=warn,h2=warn,tower=warn",
            settings.otel_exporter_otlp_endpoint.as_deref(),
            &service_name(&cli.command),
        )?;
        tracing::info!(scheduler = if one_cpu { "single-threaded" } else { "multi-threaded" }, "async runtime started");
        let result = match cli.command {
            Command::Up(_) => shape::up(settings).await,
            Command::Serve(serve) => shape::serve(settings, &serve.services).await,
            Command::Migrate(_) => shape::migrate(settings).await,
            Command::Operator(operator) => shape::operator(settings, &operator).await,
            Command::Audit(_) | Command::Crd => Ok(()),
        };
        // The exporter sends its last batch through the runtime, so it flushes on the blocking pool.
        if let Some(export) = export {
            let _flushed = tokio::task::spawn_blocking(move || export.shutdown()).await;
        }
        result
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => fatal(&format!("{error:#}")),
    }
}

/// The `service.name` of the process's exported traces: `brainstorm` for `up`, otherwise
/// `brainstorm-` and the role (`brainstorm-edge-router`, `brainstorm-operator`, ...).
fn service_name(command: &Command) -> String {
    match command {
        Command::Up(_) => "brainstorm".to_string(),
        Command::Serve(serve) => format!("brainstorm-{}", serve.services.join("+")),
        Command::Migrate(_) => "brainstorm-migrate".to_string(),
        Command::Operator(_) => "brainstorm-operator".to_string(),
        Command::Audit(_) | Command::Crd => "brainstorm-tool".to_string(),
    }
}

/// Reports a fatal error on stderr (logging may not be set up yet) and picks the exit code.
#[allow(clippy::print_stderr)]
fn fatal(message: &str) -> ExitCode {
    eprintln!("brainstorm: error: {message}");
    ExitCode::FAILURE
}

/// `brainstorm crd`: the CustomResourceDefinitions as YAML on stdout.
#[allow(clippy::print_stdout)]
fn print_crds() -> ExitCode {
    match brainstorm_operator::crds_yaml() {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(error) => fatal(&format!("cannot write the CustomResourceDefinitions: {error}")),
    }
}

/// `brainstorm audit verify FILE`: prints the verification report as JSON; exit 0 only when intact.
#[allow(clippy::print_stdout)]
fn verify_audit_export(path: &std::path::Path) -> ExitCode {
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(error) => return fatal(&format!("cannot open {}: {error}", path.display())),
    };
    let report = match brainstorm_audit_lineage::verify_export(std::io::BufReader::new(file)) {
        Ok(report) => report,
        Err(error) => return fatal(&format!("{} is not an audit chain export: {error}", path.display())),
    };
    match serde_json::to_string_pretty(&report) {
        Ok(text) => println!("{text}"),
        Err(error) => return fatal(&format!("cannot print the report: {error}")),
    }
    if report.valid { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}
