//! Command-line interface: commands, and the flags that form the top configuration layer.

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::Context;
use brainstorm_common::config::{ConfigLayer, Secret, Settings};
use clap::{Args, Parser, Subcommand};

/// Brainstorm: an AI API gateway with budgets, guardrails, kill switches and tamper-evident audit.
#[derive(Debug, Parser)]
#[command(name = "brainstorm", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run every service in this process (SQLite in --data-dir, in-process bus and counters).
    Up(Flags),
    /// Run the named services (e.g. `identity`, `edge-router`) with their gRPC servers.
    Serve(ServeArgs),
    /// Apply the database migrations to the configured database and exit.
    Migrate(Flags),
    /// Run the Kubernetes operator: Tenant and KillSwitch resources reconciled against identity and
    /// policy-firewall (BR_IDENTITY_URL, BR_POLICY_FIREWALL_URL); the cluster from KUBECONFIG or
    /// the pod's service account.
    Operator(OperatorArgs),
    /// Print the CustomResourceDefinitions (Tenant, KillSwitch) as YAML.
    Crd,
    /// Audit chain tools.
    #[command(subcommand)]
    Audit(AuditCommand),
}

#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Verify an exported audit chain (JSON lines from the export) offline; exit 1 unless it is intact.
    Verify {
        /// The exported chain.
        file: PathBuf,
    },
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Services to run in this process.
    #[arg(required = true, value_name = "SERVICE")]
    pub services: Vec<String>,
    #[command(flatten)]
    pub flags: Flags,
}

#[derive(Debug, Args)]
pub struct OperatorArgs {
    /// Watch only this namespace (default: every namespace).
    #[arg(long, env = "BR_OPERATOR_NAMESPACE", value_name = "NAMESPACE")]
    pub namespace: Option<String>,
    /// Reconcile every resource again this often, undoing changes made around it (seconds).
    #[arg(long, env = "BR_OPERATOR_RESYNC_SECONDS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub resync_seconds: u64,
    #[command(flatten)]
    pub flags: Flags,
}

/// Flags shared by every command; each overrides the environment and the config file.
#[derive(Debug, Args, Default)]
pub struct Flags {
    /// TOML configuration file (also `BR_CONFIG`).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// REST edge address (default 127.0.0.1:8080).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// gRPC address of the services this process hosts (default 127.0.0.1:50051).
    #[arg(long, value_name = "ADDR")]
    pub grpc_listen: Option<String>,
    /// Directory of the embedded database and files (default ./brainstorm-data).
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Database URL (sqlite:// or postgres://); overrides BR_DATABASE_URL.
    #[arg(long, value_name = "URL")]
    pub database_url: Option<String>,
}

static NO_FLAGS: Flags = Flags { config: None, listen: None, grpc_listen: None, data_dir: None, database_url: None };

impl Cli {
    fn flags(&self) -> &Flags {
        match &self.command {
            Command::Up(flags) | Command::Migrate(flags) => flags,
            Command::Serve(serve) => &serve.flags,
            Command::Operator(operator) => &operator.flags,
            Command::Audit(_) | Command::Crd => &NO_FLAGS,
        }
    }

    /// Merges defaults < file < environment < flags and validates the result.
    pub fn settings(&self, environment: &HashMap<String, String>) -> anyhow::Result<Settings> {
        let flags = self.flags();
        let config_path = flags.config.clone().or_else(|| environment.get("BR_CONFIG").filter(|path| !path.is_empty()).map(PathBuf::from));
        let file_layer = match &config_path {
            Some(path) => {
                let text = std::fs::read_to_string(path).with_context(|| format!("cannot read config file {}", path.display()))?;
                ConfigLayer::from_toml(&text, path)?
            }
            None => ConfigLayer::default(),
        };
        let flag_layer = ConfigLayer {
            listen: flags.listen.clone(),
            grpc_listen: flags.grpc_listen.clone(),
            data_dir: flags.data_dir.clone(),
            database_url: flags.database_url.clone().map(Secret::new),
            ..ConfigLayer::default()
        };
        let environment_layer = ConfigLayer::from_env(environment)?;
        Ok(Settings::resolve(flag_layer.over(environment_layer.over(file_layer)))?)
    }
}
