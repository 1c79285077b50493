//! The `sluice` binary: the command line only; everything else is the
//! `sluice` library.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use std::time::Duration;

use clap::Parser;
use sluice::cli::{process, run, status};
use sluice::config;
use sluice::runs::records::Mode;

/// jemalloc, not the system's: glibc's malloc keeps what a flood of
/// connections or tunnels used (240 MB after 5,000 intercepted tunnels
/// closed, against 11 MB before — `bench_flood`), where jemalloc gives it
/// back to the system; a sidecar's memory limit is sized for what it
/// holds at rest.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The help heading of the options only the proxy server uses.
const SERVER: &str = "Server options (not used by run or status)";

/// An HTTP forward proxy that keeps data collectors inside each provider's
/// budget.
#[derive(Debug, Parser)]
#[command(name = "sluice", version)]
struct Cli {
    /// The TOML config file (see sluice.example.toml). Without one, safe
    /// defaults.
    #[arg(long, value_name = "FILE", global = true)]
    config: Option<PathBuf>,
    /// Check a config file and exit: 0 if valid, 2 with the key if not.
    #[arg(long, value_name = "FILE", conflicts_with = "config")]
    check_config: Option<PathBuf>,
    // Global (accepted after a subcommand, as users type them), but the
    // server's: under their own heading in every subcommand's help, so
    // `run --help` does not read as if they changed a run.
    /// Proxy listen address (overrides `listen`).
    #[arg(long, value_name = "ADDR", global = true, value_parser = config::parse_listener,
          help_heading = SERVER)]
    listen: Option<SocketAddr>,
    /// Admin listen address (overrides `admin`); for `sluice status`, the
    /// admin API to read (`IP:PORT` or `http://IP:PORT`).
    #[arg(long, value_name = "ADDR", global = true, value_parser = address)]
    admin: Option<SocketAddr>,
    /// State directory (overrides `state_dir`).
    #[arg(long, value_name = "DIR", global = true, help_heading = SERVER)]
    state_dir: Option<PathBuf>,
    /// Log format.
    #[arg(long, value_enum, default_value = "text", global = true, help_heading = SERVER)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Print the interception CA's path and the environment lines a
    /// collector needs to trust it (creating the CA if it does not exist).
    Ca,
    /// Run a command as one run of a collector: open the run, start the
    /// command with the proxy (and CA) variables carrying the collector's
    /// credentials, keep the lease, forward SIGINT/SIGTERM, finish the run,
    /// print its summary and exit with the command's status — or 0 after a
    /// planned stop (the run's budget ran out: the schedule's success).
    Run(RunArgs),
    /// Show providers and collectors as a table, read from the admin API
    /// (the config's `admin`, or `--admin`): the admin page for terminals.
    Status {
        /// A collector's token, for the collectors' readout beyond loopback.
        #[arg(long, value_name = "FILE")]
        token_file: Option<PathBuf>,
        /// Redraw every two seconds until interrupted.
        #[arg(long)]
        watch: bool,
    },
    /// Copy this binary to DIR/sluice (a Kubernetes init container puts
    /// it on a volume the collector container shares, for `sluice run`).
    Install {
        /// Where to put it.
        dir: PathBuf,
    },
    /// Write the book's reference pages (configuration, command line,
    /// metrics, admin API) into DIR, made from this binary's code.
    #[command(hide = true)]
    Reference {
        /// Where to write them (`docs/src/reference`).
        dir: PathBuf,
    },
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// The collector (a `[collectors.NAME]` of the config).
    #[arg(long)]
    collector: String,
    /// The file holding the collector's token.
    #[arg(long, value_name = "FILE")]
    token_file: PathBuf,
    /// Attempts the run may make, retries included.
    #[arg(long, value_name = "N")]
    request_cap: Option<u64>,
    /// Wall-clock deadline: "15m", "90s", "1h".
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    deadline: Option<Duration>,
    /// Retries as a share of first attempts.
    #[arg(long, value_name = "RATIO")]
    retry_ratio: Option<f64>,
    /// Which cursor the run moves.
    #[arg(long, value_enum, default_value = "steady")]
    mode: RunMode,
    /// Wait this long for the collector's lease if another run holds it.
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    wait: Option<Duration>,
    /// The admin API (default: the config's `admin`).
    #[arg(long, value_name = "URL")]
    admin_url: Option<String>,
    /// The proxy as the command reaches it (default: the config's `listen`).
    #[arg(long, value_name = "URL")]
    proxy_url: Option<String>,
    /// How long the command has after SIGTERM when the run ends under it
    /// (a planned stop, a lost lease), before SIGKILL.
    #[arg(long, value_name = "DURATION", value_parser = duration, default_value = "10s")]
    grace: Duration,
    /// Exit with the command's status even after a planned stop (by
    /// default a planned stop is the schedule's success: exit 0).
    #[arg(long)]
    pass_status: bool,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<String>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum RunMode {
    Steady,
    Catchup,
}

fn duration(text: &str) -> Result<Duration, String> {
    config::parse_duration(text).map_err(|e| e.to_string())
}

/// `http://host:port` or `host:port` → the address.
fn address(text: &str) -> Result<SocketAddr, String> {
    let bare = text.trim_start_matches("http://").trim_end_matches('/');
    config::parse_listener(bare).map_err(|_| format!("{text:?} is not http://IP:PORT"))
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// `docs/src/reference/cli.md`: each command's help, as `--help` prints it.
fn cli_page() -> String {
    use clap::CommandFactory;
    let mut root = Cli::command().bin_name("sluice");
    root.build();
    let mut out = format!(
        "{}\n\n# Command line reference\n\n\
         `sluice` with no command runs the proxy. Every option may also be \
         given after a command.\n",
        sluice::reference::GENERATED
    );
    let mut help = |title: &str, cmd: &mut clap::Command| {
        let text = cmd.render_long_help().to_string();
        out.push_str(&format!(
            "\n## `{title}`\n\n```text\n{}\n```\n",
            text.trim_end()
        ));
    };
    help("sluice", &mut root.clone());
    for sub in root
        .get_subcommands_mut()
        .filter(|c| !c.is_hide_set() && c.get_name() != "help")
    {
        let title = format!("sluice {}", sub.get_name());
        help(&title, sub);
    }
    out
}

/// `sluice reference DIR`.
fn reference(dir: &std::path::Path) -> ExitCode {
    let pages = [
        ("config.md", sluice::reference::config_page()),
        ("cli.md", cli_page()),
        ("metrics.md", sluice::reference::metrics_page()),
        ("admin-api.md", sluice::reference::admin_page()),
    ];
    for (name, text) in pages {
        let path = dir.join(name);
        if let Err(e) = std::fs::write(&path, text) {
            eprintln!("cannot write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        println!("{}", path.display());
    }
    ExitCode::SUCCESS
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(path) = &cli.check_config {
        let checked = config::Config::load(path).and_then(|mut c| {
            overrides(&cli).apply(&mut c);
            c.check_state_dir()
        });
        return match checked {
            Ok(()) => {
                println!("{}: ok", path.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::from(2)
            }
        };
    }
    let config = match load_config(&cli) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let overrides = overrides(&cli);
    if cli.command.is_none() {
        if let Err(e) = config.check_state_dir() {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    }
    let (run_args, status_args) = match cli.command {
        Some(Command::Ca) => return process::print_ca(&config),
        Some(Command::Install { dir }) => return process::install(&dir),
        Some(Command::Reference { dir }) => return reference(&dir),
        Some(Command::Run(args)) => (Some(args), None),
        Some(Command::Status { token_file, watch }) => (None, Some((token_file, watch))),
        None => (None, None),
    };
    process::init_logging(matches!(cli.log_format, LogFormat::Json));
    // rustls: the ring provider, installed explicitly before any TLS use.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = match runtime(config.limits.workers) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some((token_file, watch)) = status_args {
        let token = match token_file.map(std::fs::read_to_string) {
            None => None,
            Some(Ok(t)) => Some(t.trim().to_string()),
            Some(Err(e)) => {
                eprintln!("sluice status: cannot read the token file: {e}");
                return ExitCode::from(2);
            }
        };
        return runtime.block_on(status::status(status::StatusCommand {
            admin: config.admin,
            token,
            watch,
        }));
    }
    if let Some(args) = run_args {
        return match run_command(args, &config) {
            Ok(cmd) => runtime.block_on(run::run(cmd, &config)),
            Err(e) => {
                eprintln!("sluice run: {e}");
                ExitCode::from(2)
            }
        };
    }
    match runtime.block_on(process::run(config, cli.config.clone(), overrides)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sluice: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The config file (or the defaults) with the command line's overrides,
/// checked.
fn load_config(cli: &Cli) -> Result<config::Config, config::ConfigError> {
    let mut config = match &cli.config {
        Some(path) => config::Config::load(path)?,
        None => config::Config::default(),
    };
    overrides(cli).apply(&mut config);
    config.check()?;
    Ok(config)
}

/// What the command line sets over the config file.
fn overrides(cli: &Cli) -> config::Overrides {
    config::Overrides {
        listen: cli.listen,
        admin: cli.admin,
        state_dir: cli.state_dir.clone(),
    }
}

/// One worker: tokio's current-thread scheduler (no work-stealing queues
/// or cross-thread wake-ups to pay for); more: its multi-thread one.
fn runtime(workers: usize) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = if workers == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(workers);
        b
    };
    builder.enable_all().build()
}

/// `sluice run`'s arguments as the command it runs: the admin API and the
/// proxy default to the config's.
fn run_command(args: RunArgs, config: &config::Config) -> Result<run::RunCommand, String> {
    let admin = args
        .admin_url
        .as_deref()
        .map_or(Ok(config.admin), address)?;
    let proxy = args
        .proxy_url
        .as_deref()
        .map_or(Ok(config.listen), address)?;
    Ok(run::RunCommand {
        collector: args.collector,
        token_file: args.token_file,
        request_cap: args.request_cap,
        deadline: args.deadline,
        retry_ratio: args.retry_ratio,
        mode: match args.mode {
            RunMode::Steady => Mode::Steady,
            RunMode::Catchup => Mode::Catchup,
        },
        wait: args.wait,
        admin,
        proxy,
        grace: args.grace,
        pass_status: args.pass_status,
        command: args.command,
    })
}
