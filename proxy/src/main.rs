//! The `sluice` binary: command line only; everything else is in the
//! library modules.
#![forbid(unsafe_code)]

mod admin;
mod auth;
mod body;
mod config;
mod connect;
mod edge;
mod forward;
mod guard;
mod providers;
mod server;
mod upstream;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

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
    init_logging(cli.log_format);
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
    match runtime.block_on(server::run(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sluice: {e}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SLUICE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
