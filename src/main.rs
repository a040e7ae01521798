//! The `ankusa` binary: parses the command line, loads the config, hands over.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "ankusa",
    version,
    about = "Webhook ingest gateway: verify, dedupe, commit durably, then deliver.",
    after_help = "Examples:
  ankusa check-config --config /etc/ankusa/ankusa.yaml
  ankusa serve --config /etc/ankusa/ankusa.yaml
  ankusa store verify --data-dir /var/lib/ankusa      # with the gateway stopped
  ankusa dlq list --tenant acme
  ankusa stats

Each verb's --help has examples of its own."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway. Without --config it runs the embedded quickstart config. SIGHUP
    /// re-reads the config file (as POST /v1/reload does); SIGTERM or SIGINT stops it.
    #[command(after_help = "Examples:
  ankusa serve --config /etc/ankusa/ankusa.yaml
  ankusa serve      # the quickstart config: ingest on 127.0.0.1:8080, admin on :9090, store in ./data")]
    Serve {
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Benchmark reference only: answer 202 after parsing and verification without
        /// storing anything. Never use it to receive real hooks.
        #[arg(long)]
        reference: bool,
    },
    /// Check a config file: print every problem with its YAML path and exit 1, or print a
    /// summary and exit 0.
    #[command(after_help = "Examples:
  ankusa check-config --config ankusa.yaml
  ankusa check-config --config /etc/ankusa/ankusa.yaml    # before a restart or a SIGHUP")]
    CheckConfig {
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
    },
    /// Offline store tools (the gateway must not be running on the directory).
    #[command(after_help = "Examples:
  ankusa store verify --data-dir ./data
  ankusa store fixture --out fixtures/store-v4.tar.gz")]
    Store {
        #[command(subcommand)]
        command: StoreCommand,
    },
    /// The dead-letter queue of a running gateway (through its admin API): list, revive,
    /// purge.
    #[command(after_help = "Examples:
  ankusa dlq list --tenant acme
  ankusa dlq revive --tenant acme --source stripe
  ankusa dlq purge --tenant acme --sink http")]
    Dlq {
        #[command(subcommand)]
        command: ankusa::cli::DlqCommand,
    },
    /// The archive of delivered hooks of a running gateway (through its admin API).
    #[command(after_help = "Examples:
  ankusa archive replay --tenant acme --source stripe --from 1718000000000 --to 1718003600000")]
    Archive {
        #[command(subcommand)]
        command: ankusa::cli::ArchiveCommand,
    },
    /// Quarantined hooks of a running gateway (through its admin API): list, show,
    /// release, delete.
    #[command(after_help = "Examples:
  ankusa quarantine list --tenant acme
  ankusa quarantine show --tenant acme --seq 1042
  ankusa quarantine release --tenant acme --seq 1042")]
    Quarantine {
        #[command(subcommand)]
        command: ankusa::cli::QuarantineCommand,
    },
    /// The tenants of a running gateway (through its admin API): list, stats, purge.
    #[command(after_help = "Examples:
  ankusa tenants list
  ankusa tenants stats acme")]
    Tenants {
        #[command(subcommand)]
        command: ankusa::cli::TenantsCommand,
    },
    /// Print a running gateway's counters, per tenant and for the node (from its admin API).
    #[command(after_help = "Examples:
  ankusa stats
  ankusa stats --admin http://10.0.0.5:9090     # the token from $ANKUSA_ADMIN_TOKEN")]
    Stats {
        #[command(flatten)]
        admin: ankusa::cli::AdminOptions,
    },
}

#[derive(Subcommand)]
enum StoreCommand {
    /// Check every invariant of a store; exit 0 only when all hold.
    #[command(after_help = "Examples:
  ankusa store verify --data-dir ./data
  ankusa store verify --data-dir /var/lib/ankusa      # with the gateway stopped")]
    Verify {
        #[arg(long, value_name = "DIR")]
        data_dir: PathBuf,
    },
    /// Migrate a store to this binary's format ahead of `serve` (which would do it at
    /// start), with a progress bar; the gateway must be stopped.
    #[command(after_help = "Examples:
  ankusa store migrate --data-dir /var/lib/ankusa      # with the gateway stopped")]
    Migrate {
        #[arg(long, value_name = "DIR")]
        data_dir: PathBuf,
    },
    /// Write a store image holding every state a store of this format can have, as a gzip
    /// tarball with its summary (the upgrade tests open every image in fixtures/).
    #[command(after_help = "Examples:
  ankusa store fixture --out fixtures/store-v4.tar.gz")]
    Fixture {
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
        /// The store format of the image; a binary builds only its own format (the default).
        #[arg(long, value_name = "N", default_value_t = ankusa::store::FORMAT)]
        format: u32,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing();
    match cli.command {
        Command::Serve { config, reference } => {
            let config_path = config.clone();
            let loaded = match &config {
                Some(path) => ankusa::config::load(path),
                None => ankusa::config::parse(ankusa::config::QUICKSTART_YAML),
            };
            let config = match loaded {
                Ok(config) => config,
                Err(error) => {
                    eprintln!("ankusa: invalid config:\n{error}");
                    return ExitCode::from(2);
                }
            };
            match ankusa::serve::run(config, config_path, reference) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    eprintln!("ankusa: {error:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Dlq { command } => ankusa::cli::dlq(command),
        Command::Archive { command } => ankusa::cli::archive(command),
        Command::Stats { admin } => ankusa::cli::stats(admin),
        Command::Quarantine { command } => ankusa::cli::quarantine(command),
        Command::Tenants { command } => ankusa::cli::tenants(command),
        Command::CheckConfig { config } => match ankusa::config::load(&config) {
            Ok(config) => {
                println!("{}", ankusa::config::summary(&config));
                ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!("{error}");
                ExitCode::FAILURE
            }
        },
        Command::Store {
            command: StoreCommand::Migrate { data_dir },
        } => ankusa::cli::store_migrate(&data_dir),
        Command::Store {
            command: StoreCommand::Fixture { out, format },
        } => match ankusa::store::fixture::generate(&out, format) {
            Ok(summary) => {
                println!("wrote {}: {summary}", out.display());
                ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!("ankusa: {error}");
                ExitCode::FAILURE
            }
        },
        Command::Store {
            command: StoreCommand::Verify { data_dir },
        } => {
            let store = match ankusa::store::Store::open_existing(&data_dir) {
                Ok(store) => store,
                Err(error) => {
                    eprintln!("ankusa: {error}");
                    return ExitCode::FAILURE;
                }
            };
            match ankusa::store::verify::verify(&store) {
                Ok(report) => {
                    for problem in &report.problems {
                        println!("FAIL {problem}");
                    }
                    for state in &report.repairable {
                        println!("NOTE {state}");
                    }
                    println!(
                        "{}: {} hooks, {} delivery rows, {} tenants, {} problems",
                        if report.ok() { "ok" } else { "FAILED" },
                        report.hooks,
                        report.deliveries,
                        report.tenants,
                        report.problems.len()
                    );
                    if report.ok() {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::FAILURE
                    }
                }
                Err(error) => {
                    eprintln!("ankusa: {error}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// Crates whose logs are off unless `ANKUSA_LOG` names them.
const QUIET_CLIENTS: &[&str] = &["lapin", "amq_protocol"];

fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let directives = std::env::var("ANKUSA_LOG").unwrap_or_else(|_| "info".to_owned());
    let mut filter = EnvFilter::try_new(&directives).unwrap_or_else(|_| EnvFilter::new("info"));
    // lapin logs every returned message whole (a webhook's body and headers) and every channel
    // the broker closes; the RabbitMQ sink reports those outcomes itself. Quiet unless
    // ANKUSA_LOG names it.
    for client in QUIET_CLIENTS {
        if !directives.contains(client) {
            if let Ok(directive) = format!("{client}=off").parse() {
                filter = filter.add_directive(directive);
            }
        }
    }
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}
