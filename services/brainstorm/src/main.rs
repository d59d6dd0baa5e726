//! `brainstorm`: the gateway binary. `up` runs every service in one process; `serve <service>...` runs
//! the named services with their gRPC servers; `migrate` applies the database migrations.

mod cli;
mod shape;
mod shutdown;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => return fatal(&format!("cannot start the async runtime: {error}")),
    };
    let environment = std::env::vars().collect();
    let result = runtime.block_on(async move {
        let settings = cli.settings(&environment)?;
        brainstorm_common::telemetry::init_logging(settings.log_format, "info,sqlx=warn,h2=warn,tower=warn");
        match cli.command {
            Command::Up(_) => shape::up(settings).await,
            Command::Serve(serve) => shape::serve(settings, &serve.services).await,
            Command::Migrate(_) => shape::migrate(settings).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => fatal(&format!("{error:#}")),
    }
}

/// Reports a fatal error on stderr (logging may not be set up yet) and picks the exit code.
#[allow(clippy::print_stderr)]
fn fatal(message: &str) -> ExitCode {
    eprintln!("brainstorm: error: {message}");
    ExitCode::FAILURE
}
