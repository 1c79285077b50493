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
mod metrics;
mod observe;
mod providers;
mod server;
mod store;
mod tls;
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
        return print_ca(&config);
    }
    init_logging(cli.log_format);
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
    match runtime.block_on(server::run(config, cli.config.clone())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sluice: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The system trust bundles `sluice ca` looks for (Debian/Ubuntu/Alpine,
/// then Fedora/RHEL).
const SYSTEM_BUNDLES: [&str; 2] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
];

/// `sluice ca`: the CA path and the lines that make collectors trust it.
///
/// `SSL_CERT_FILE`, `REQUESTS_CA_BUNDLE` and `CURL_CA_BUNDLE` *replace* a
/// client's trust store, so they get a bundle — the system's roots plus
/// sluice's CA (`<dir of ca.crt>/ca-bundle.pem`) — and a collector keeps
/// trusting hosts it reaches without sluice, or through a tunnel sluice
/// does not intercept. Node's `NODE_EXTRA_CA_CERTS` adds to its roots, so
/// it gets the CA alone.
fn print_ca(config: &config::Config) -> ExitCode {
    let paths = server::ca_paths(config);
    let ca = match tls::CertAuthority::load_or_create(paths, 1) {
        Ok(ca) => ca,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let cert =
        std::fs::canonicalize(ca.cert_path()).unwrap_or_else(|_| ca.cert_path().to_path_buf());
    let bundle = SYSTEM_BUNDLES
        .iter()
        .find_map(|system| std::fs::read(system).ok())
        .and_then(|mut roots| {
            let own = std::fs::read(&cert).ok()?;
            roots.push(b'\n');
            roots.extend_from_slice(&own);
            let path = cert.with_file_name("ca-bundle.pem");
            std::fs::write(&path, roots).ok()?;
            Some(path)
        });
    println!("# sluice's interception CA certificate:");
    println!("# {}", cert.display());
    let replacing = match &bundle {
        Some(b) => {
            println!(
                "# For OpenSSL, Python requests and curl: the system's roots plus sluice's CA:"
            );
            b.clone()
        }
        None => {
            println!("# No system trust bundle found: these make clients trust sluice's CA only.");
            cert.clone()
        }
    };
    println!("export SSL_CERT_FILE={}", replacing.display());
    println!("export REQUESTS_CA_BUNDLE={}", replacing.display());
    println!("export CURL_CA_BUNDLE={}", replacing.display());
    println!("# Node adds this to its own roots:");
    println!("export NODE_EXTRA_CA_CERTS={}", cert.display());
    ExitCode::SUCCESS
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
