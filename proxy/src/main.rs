//! The `sluice` binary: the command line only; everything else is the
//! `sluice` library.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use sluice::{config, process};

/// An HTTP forward proxy that keeps data collectors inside each provider's
/// budget.
#[derive(Debug, Parser)]
#[command(name = "sluice", version)]
struct Cli {
    /// The TOML config file (see sluice.example.toml). Without one, safe
    /// defaults.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Check a config file and exit: 0 if valid, 2 with the key if not.
    #[arg(long, value_name = "FILE", conflicts_with = "config")]
    check_config: Option<PathBuf>,
    /// Proxy listen address (overrides `listen`).
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// Admin listen address (overrides `admin`).
    #[arg(long, value_name = "ADDR")]
    admin: Option<SocketAddr>,
    /// State directory (overrides `state_dir`).
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Log format.
    #[arg(long, value_enum, default_value = "text")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Print the interception CA's path and the environment lines a
    /// collector needs to trust it (creating the CA if it does not exist).
    Ca,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(path) = &cli.check_config {
        return match config::Config::load(path) {
            Ok(_) => {
                println!("{}: ok", path.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::from(2)
            }
        };
    }
    let mut config = match &cli.config {
        Some(path) => match config::Config::load(path) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::from(2);
            }
        },
        None => config::Config::default(),
    };
    if let Some(l) = cli.listen {
        config.listen = l;
    }
    if let Some(a) = cli.admin {
        config.admin = a;
    }
    if let Some(d) = cli.state_dir {
        config.state_dir = d;
    }
    if let Err(e) = config.check() {
        eprintln!("{e}");
        return ExitCode::from(2);
    }
    if let Some(Command::Ca) = cli.command {
        return process::print_ca(&config);
    }
    process::init_logging(matches!(cli.log_format, LogFormat::Json));
    // rustls: the ring provider, installed explicitly before any TLS use.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(process::run(config, cli.config.clone())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sluice: {e}");
            ExitCode::FAILURE
        }
    }
}
