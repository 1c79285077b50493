//! The process: wiring at start, the accept loops, signals (SIGTERM and
//! SIGINT drain, SIGHUP reloads), the periodic save of learned state and
//! the sweep of idle providers — and the commands besides serving
//! (`sluice ca`, logging set-up) that the binary calls.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::signal::unix::{signal, SignalKind};

use crate::app::{App, Shutdown};
use crate::config::redact_url;
use crate::config::{Config, ConfigError};
use crate::observe::metrics::Metrics;
use crate::observe::Observe;
use crate::providers::Providers;
use crate::runs::Runs;
use crate::serve::accept::AcceptBackoff;
use crate::serve::admin;
use crate::shared::SharedStore;
use crate::store::{LearnedRecord, Store, StoreWriter};
use crate::tunnel::tls::ca::{CaError, CaPaths, CertAuthority};
use crate::upstream::guard::Guard;
use crate::upstream::{self, Upstream};

/// Why sluice could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A setting that only fails when used (the upstream CA file).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A listener could not be bound.
    #[error("{what} {addr}: {source}")]
    Listen {
        /// `listen` or `admin`.
        what: &'static str,
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The signal handlers could not be installed.
    #[error("signals: {0}")]
    Signals(std::io::Error),
    /// `tls.trust_dir` is set but there is no CA to put in it.
    #[error("tls.trust_dir: there is no interception CA to write (see the error above)")]
    NoCa,
    /// The trust files could not be written.
    #[error(transparent)]
    Trust(#[from] CaError),
}

/// `sluice install DIR`: copies this binary to `DIR/sluice` — how a pod's
/// collector container gets `sluice run` from the sidecar's image (an
/// init container runs this into a shared volume).
pub fn install(dir: &Path) -> ExitCode {
    let copied = std::env::current_exe().and_then(|exe| {
        std::fs::create_dir_all(dir)?;
        let target = dir.join("sluice");
        std::fs::copy(&exe, &target)?;
        std::fs::set_permissions(&target, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
        Ok(target)
    });
    match copied {
        Ok(target) => {
            println!("{}", target.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sluice install: {}: {e}", dir.display());
            ExitCode::FAILURE
        }
    }
}

/// Raises the soft limit on open files to the hard one, as Go's runtime
/// and nginx's `worker_rlimit_nofile` do: every client connection and
/// every tunnel's upstream side holds a descriptor, and the soft default
/// (often 1,024) is far below what one sidecar may be asked to hold. The
/// hard limit stays the operator's; past it, accept errors are counted and
/// backed off (`serve::accept`).
fn raise_file_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => tracing::debug!(from = soft, to = hard, "open-file limit raised"),
            Err(e) => tracing::warn!(error = %e, soft, hard, "could not raise the open-file limit"),
        },
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "could not read the open-file limit"),
    }
}

/// Runs sluice until SIGTERM or SIGINT, then drains within the grace
/// period and saves what it learned. SIGHUP reloads the config file.
pub async fn run(
    config: Config,
    config_path: Option<PathBuf>,
    overrides: crate::config::Overrides,
) -> Result<(), StartError> {
    raise_file_limit();
    if !crate::observe::allocator::give_back_sooner() {
        tracing::info!(
            "the allocator's decay could not be set: freed pages go back on its own time"
        );
    }
    let tls = upstream::tls_config(config.extra_ca.as_deref())?;
    let guard = Guard::new(config.destinations.allow.clone());
    let upstream = Upstream::new(
        guard.clone(),
        tls,
        config.connect_timeout,
        config.max_idle_connections,
    );
    let bind = |addr| async move {
        let listener = TcpListener::bind(addr).await?;
        let bound = listener.local_addr()?;
        Ok((listener, bound))
    };
    let listen_error = |what, addr| move |source| StartError::Listen { what, addr, source };
    let (proxy, proxy_addr) = bind(config.listen)
        .await
        .map_err(listen_error("listen", config.listen))?;
    let (admin_listener, admin_addr) = bind(config.admin)
        .await
        .map_err(listen_error("admin", config.admin))?;
    // The running config says where it listens (a port 0 is the system's
    // choice): a reload compares the file with that.
    let mut config = config;
    (config.listen, config.admin) = (proxy_addr, admin_addr);
    let metrics = Arc::new(Metrics::new(config.limits.max_metric_providers));
    let store = Store::open(
        &config.state_dir,
        &metrics.store_cold_starts,
        &metrics.store_errors,
    )
    .map(Arc::new);
    let writer = store
        .clone()
        .map(|s| StoreWriter::spawn(s, metrics.store_errors.clone()));
    let ca = interception_ca(&config)?;
    let observer = Arc::new(Observe::new(metrics.clone(), writer.clone()));
    let shared = shared_store(&config)?;
    let providers = Providers::new(&config, upstream, Some(observer))
        .with_shared(shared)
        .with_recall(store.clone().map(crate::providers::recall));
    if let Some(store) = &store {
        restore(store, &metrics, config.limits.state_max_age);
    }
    let runs = Runs::new(
        &config,
        store.clone(),
        writer.clone(),
        Some(metrics.clone()),
    );
    let app = Arc::new(App {
        ca,
        providers,
        runs,
        guard,
        metrics,
        store,
        writer,
        config: RwLock::new(Arc::new(config)),
        config_path,
        overrides,
        shutdown: Shutdown::new(),
        ready: AtomicBool::new(false),
        history: Default::default(),
        intercept_tls: std::sync::OnceLock::new(),
        admin: admin_addr,
    });
    tokio::spawn(admin::serve(app.clone(), admin_listener));
    tokio::spawn(sample_history(app.clone()));
    tokio::spawn(sweep(app.clone()));
    tokio::spawn(sweep_runs(app.clone()));
    tokio::spawn(save_periodically(app.clone()));
    // Signals are ours before anyone is told sluice listens: a SIGHUP
    // sent at once must reload, not end the process (its default action).
    let term = signal(SignalKind::terminate()).map_err(StartError::Signals)?;
    let hup = signal(SignalKind::hangup()).map_err(StartError::Signals)?;
    app.ready.store(true, Ordering::SeqCst);
    tracing::info!(proxy = %proxy_addr, admin = %admin_addr, "sluice listening");
    // A machine-readable line for supervisors and tests that bind port 0.
    println!("sluice listening proxy={proxy_addr} admin={admin_addr}");

    accept_until_stopped(&app, proxy, term, hup).await;
    drain(&app).await;
    tracing::info!("stopped");
    Ok(())
}

/// The interception CA, loaded or made; none (with an error logged) if
/// it cannot be — unless collectors are waiting for it in `trust_dir`.
fn interception_ca(config: &Config) -> Result<Option<Arc<CertAuthority>>, StartError> {
    let ca = match CertAuthority::load_or_create(ca_paths(config), config.tls.leaf_cache) {
        Ok(ca) => Some(Arc::new(ca)),
        Err(e) => {
            tracing::error!(
                error = %e,
                "no interception CA: HTTPS providers are tunnelled without per-request visibility"
            );
            None
        }
    };
    if let Some(dir) = &config.tls.trust_dir {
        // Collectors in the pod read these before they start: no CA, no
        // start (the startup probe keeps them waiting, loudly).
        let ca = ca.as_ref().ok_or(StartError::NoCa)?;
        CaEnv::write_to(ca, dir)?;
        tracing::info!(dir = %dir.display(), "wrote ca.crt and ca-bundle.pem for collectors");
    }
    Ok(ca)
}

/// The Redis store for shared budgets, if the config names one.
fn shared_store(config: &Config) -> Result<Option<Arc<SharedStore>>, StartError> {
    Ok(match &config.shared {
        Some(shared) => {
            let store = SharedStore::new(shared, config.extra_ca.as_deref())?;
            tracing::info!(
                redis = %redact_url(&shared.redis),
                replicas = shared.replicas,
                "shared budgets through Redis"
            );
            Some(store)
        }
        None => None,
    })
}

/// Accepts connections until SIGTERM or SIGINT; SIGHUP reloads. The
/// listener closes when this returns: no new connections while draining.
async fn accept_until_stopped(
    app: &Arc<App>,
    proxy: TcpListener,
    mut term: tokio::signal::unix::Signal,
    mut hup: tokio::signal::unix::Signal,
) {
    let mut backoff = AcceptBackoff::new("proxy");
    loop {
        tokio::select! {
            accepted = proxy.accept() => match accepted {
                Ok((stream, peer)) => {
                    backoff.accepted();
                    tokio::spawn(crate::serve::serve_connection(app.clone(), stream, peer));
                }
                // Out of file descriptors and the like: count, back off,
                // report now and then.
                Err(e) => backoff.back_off(&e, &app.metrics).await,
            },
            _ = hup.recv() => reload(app),
            _ = term.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
        }
    }
}

/// Stops answering readiness, drains within the grace period, suspends
/// the runs and saves what was learned.
async fn drain(app: &Arc<App>) {
    app.ready.store(false, Ordering::SeqCst);
    let grace = app.config().limits.shutdown_grace;
    tracing::info!(
        grace_ms = grace.as_millis() as u64,
        "shutting down: no new connections, draining"
    );
    app.shutdown.begin();
    if tokio::time::timeout(grace, app.shutdown.drained())
        .await
        .is_err()
    {
        tracing::warn!("grace period over; closing what is left");
    }
    app.runs.suspend_all();
    save(app).await;
}

/// Counts the learned states in the store (R-PS1): those younger than
/// `max_age` are restored when their provider is first used, read from
/// the store then ([`crate::providers::recall`]) — not held in memory meanwhile: a crawl's
/// store may hold a million hosts (issue 38). Older ones are discarded:
/// that provider starts cold.
fn restore(store: &Store, metrics: &Metrics, max_age: Duration) {
    let (mut fresh, mut stale) = (0u64, 0u64);
    store.each_learned(|name, record| {
        let age = record.age();
        if age < max_age {
            fresh += 1;
            tracing::debug!(provider = %name, age_ms = age.as_millis() as u64, rate_rps = record.rate_rps, "learned state in the store");
        } else {
            stale += 1;
            tracing::debug!(provider = %name, age_ms = age.as_millis() as u64, "learned state older than state_max_age: discarded");
        }
    });
    metrics.state_restored.inc_by(fresh);
    if fresh + stale > 0 {
        tracing::info!(
            restored = fresh,
            discarded = stale,
            "learned state in the store: restored when each provider is first used; \
             what is older than state_max_age is discarded (a cold start)"
        );
    }
}

/// Saves every provider's learned state and waits until it is on disk —
/// through the store's writer thread, never on a runtime worker.
async fn save(app: &App) {
    save_learned(app, app.providers.learned()).await;
}

/// What changed since the last save: the periodic save (every provider is
/// saved at shutdown).
async fn save_changed(app: &App) {
    save_learned(app, app.providers.learned_changed()).await;
}

async fn save_learned(app: &App, learned: Vec<crate::providers::Learned>) {
    let Some(writer) = &app.writer else { return };
    writer.save_learned(
        learned
            .into_iter()
            .map(|l| (l.name, LearnedRecord::of(&l.state, l.age, l.config)))
            .collect(),
    );
    if let Err(e) = writer.flush().await {
        app.metrics.store_errors.inc();
        tracing::error!(error = %e, "store flush failed");
    }
}

async fn save_periodically(app: Arc<App>) {
    loop {
        tokio::time::sleep(app.config().limits.save_interval).await;
        save_changed(&app).await;
    }
}

/// SIGHUP: re-reads the config file. A bad file is rejected, naming the
/// key, and the running config stays (R-OP5). Learned state is kept.
fn reload(app: &App) {
    let Some(path) = &app.config_path else {
        tracing::warn!("SIGHUP: sluice was started without --config; nothing to reload");
        return;
    };
    let current = app.config();
    let loaded = Config::load(path).and_then(|mut c| {
        app.overrides.apply(&mut c);
        // What only a restart applies stays as it runs, named (issue 36).
        let pending = current.keep_restart_only(&mut c);
        c.check()?;
        Ok((c, pending))
    });
    match loaded {
        Ok((new, pending)) => {
            app.guard.set_allow(new.destinations.allow.clone());
            app.providers.reload(&new);
            app.runs.reload(&new);
            *app.config.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(new);
            app.metrics.reloads.with_label_values(&["ok"]).inc();
            for key in &pending {
                tracing::warn!(
                    key,
                    "changed in the config file but NOT APPLIED: only a restart applies it"
                );
            }
            if pending.is_empty() {
                tracing::info!("config reloaded; learned state kept");
            } else {
                tracing::warn!(
                    not_applied = %pending.join(", "),
                    "config reloaded, except keys only a restart applies; learned state kept"
                );
            }
        }
        Err(e) => {
            app.metrics.reloads.with_label_values(&["rejected"]).inc();
            tracing::warn!(error = %e, "config reload rejected; the running config stays");
        }
    }
}

/// The CA files: configured, or in the state directory.
pub fn ca_paths(config: &Config) -> CaPaths {
    match (&config.tls.ca_cert, &config.tls.ca_key) {
        (Some(cert), Some(key)) => CaPaths {
            cert: cert.clone(),
            key: key.clone(),
        },
        _ => CaPaths::in_state_dir(&config.state_dir),
    }
}

/// Every 2 s: evicts idle providers and lets go those that learned
/// nothing (a pass over the table, under its lock: about a millisecond at
/// 100,000 providers); every 30 s, prunes stale learned state from the
/// store — so neither grows with every host ever seen.
async fn sweep(app: Arc<App>) {
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    for n in 0u64.. {
        tick.tick().await;
        app.providers.sweep();
        if n % 15 == 0 {
            if let Some(writer) = &app.writer {
                writer.prune_learned(app.config().limits.state_max_age);
            }
        }
    }
}

/// Every few seconds, a sample of the pace of each live provider — of the
/// `MAX_PROVIDERS` used last, in a bigger table — for the admin page's
/// charts (R-OP7); providers no longer among them are forgotten. (A
/// crawl's 100,000 providers were each sampled, and each sample past the
/// 64th pushed another provider's history out: a pass of snapshots and
/// 1.5 KB histories made and dropped by the hundred thousand every 5 s,
/// for charts of whichever 64 hosts came last by name: R-PF1.)
async fn sample_history(app: Arc<App>) {
    let mut tick = tokio::time::interval(crate::observe::history::EVERY);
    loop {
        tick.tick().await;
        let now = tokio::time::Instant::now();
        let counts = app.metrics.attempt_counts();
        let (providers, _) = app.providers.recent(crate::observe::history::MAX_PROVIDERS);
        for p in &providers {
            let s = p.policy.snapshot(now);
            let c = counts.get(p.label()).copied().unwrap_or_default();
            app.history.record(
                p.name(),
                crate::store::unix_ms_now(),
                s.pacer.rate_rps,
                s.pacer.limit_rps,
                c,
            );
        }
        app.history
            .retain(|name| providers.iter().any(|p| &**p.name() == name));
    }
}

/// Every second: runs whose lease lapsed end (`expired`), and runs whose
/// deadline passed with no request to see it stop and defer the rest.
async fn sweep_runs(app: Arc<App>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        app.runs.sweep(tokio::time::Instant::now());
    }
}

/// The system trust bundles `sluice ca` looks for (Debian/Ubuntu/Alpine,
/// then Fedora/RHEL).
const SYSTEM_BUNDLES: [&str; 2] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
];

/// What makes a collector trust sluice's CA.
#[derive(Debug, Clone)]
pub struct CaEnv {
    /// The CA certificate.
    pub cert: PathBuf,
    /// The system's roots plus sluice's CA, if a system bundle was found.
    pub bundle: Option<PathBuf>,
}

impl CaEnv {
    /// The CA of `ca`, and a bundle of the system's roots plus it
    /// (`<dir of ca.crt>/ca-bundle.pem`), written now.
    ///
    /// `SSL_CERT_FILE`, `REQUESTS_CA_BUNDLE` and `CURL_CA_BUNDLE` *replace*
    /// a client's trust store, so they get the bundle, and a collector keeps
    /// trusting hosts it reaches without sluice, or through a tunnel sluice
    /// does not intercept. Node's `NODE_EXTRA_CA_CERTS` adds to its roots,
    /// so it gets the CA alone.
    pub fn of(ca: &CertAuthority) -> CaEnv {
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
        CaEnv { cert, bundle }
    }

    /// Writes `ca.crt` and `ca-bundle.pem` (the system's roots plus the
    /// CA, or the CA alone when the system has none) into `dir`, each
    /// replaced whole (written aside, then renamed): a collector reading
    /// them never sees half a file.
    pub fn write_to(ca: &CertAuthority, dir: &Path) -> Result<CaEnv, CaError> {
        let failed = |source| CaError::Write {
            path: dir.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(failed)?;
        let own = std::fs::read(ca.cert_path()).map_err(|source| CaError::Read {
            path: ca.cert_path().to_path_buf(),
            source,
        })?;
        let mut bundle = SYSTEM_BUNDLES
            .iter()
            .find_map(|system| std::fs::read(system).ok())
            .map(|mut roots| {
                roots.push(b'\n');
                roots
            })
            .unwrap_or_default();
        bundle.extend_from_slice(&own);
        let put = |name: &str, bytes: &[u8]| -> Result<PathBuf, CaError> {
            let path = dir.join(name);
            let aside = dir.join(format!(".{name}.new"));
            std::fs::write(&aside, bytes)
                .and_then(|()| std::fs::rename(&aside, &path))
                .map_err(|source| CaError::Write {
                    path: path.clone(),
                    source,
                })?;
            Ok(path)
        };
        Ok(CaEnv {
            cert: put("ca.crt", &own)?,
            bundle: Some(put("ca-bundle.pem", &bundle)?),
        })
    }

    /// The variables and their values.
    pub fn vars(&self) -> Vec<(&'static str, PathBuf)> {
        let replacing = self.bundle.clone().unwrap_or_else(|| self.cert.clone());
        vec![
            ("SSL_CERT_FILE", replacing.clone()),
            ("REQUESTS_CA_BUNDLE", replacing.clone()),
            ("CURL_CA_BUNDLE", replacing),
            ("NODE_EXTRA_CA_CERTS", self.cert.clone()),
        ]
    }
}

/// `sluice ca`: the CA path and the lines that make collectors trust it
/// (see [`CaEnv`]).
pub fn print_ca(config: &Config) -> ExitCode {
    let paths = ca_paths(config);
    let existed = paths.cert.exists();
    let ca = match CertAuthority::load_or_create(paths, 1) {
        Ok(ca) => ca,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let env = CaEnv::of(&ca);
    let cert = &env.cert;
    if existed {
        println!("# sluice's interception CA certificate:");
    } else {
        // Said on stderr too: a second CA made by running this in another
        // directory is trusted by nobody (issue 36).
        eprintln!(
            "sluice ca: no CA was in {}; created a new one there",
            cert.parent().unwrap_or(cert).display()
        );
        println!("# sluice's interception CA certificate (created now):");
    }
    println!("# {}", cert.display());
    match &env.bundle {
        Some(_) => println!(
            "# For OpenSSL, Python requests and curl: the system's roots plus sluice's CA:"
        ),
        None => {
            println!("# No system trust bundle found: these make clients trust sluice's CA only.")
        }
    }
    for (name, value) in env.vars() {
        if name == "NODE_EXTRA_CA_CERTS" {
            println!("# Node adds this to its own roots:");
        }
        println!("export {name}={}", value.display());
    }
    ExitCode::SUCCESS
}

/// Logs to stderr, as text or JSON lines, at the level `SLUICE_LOG` names
/// (default `info`).
pub fn init_logging(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SLUICE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}
