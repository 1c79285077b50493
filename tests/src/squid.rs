//! Debian's squid, the proxy sluice is measured beside (issue 24): a plain
//! forward proxy, or `ssl-bump` intercepting HTTPS with its own CA
//! (Debian's `squid-openssl`). One process (`workers 1`, `-N`), no cache,
//! no access log. Stopped on drop.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::harness::TempDir;

/// A running squid.
pub struct Squid {
    child: Child,
    /// The port it listens on, on 127.0.0.1.
    pub port: u16,
    dir: TempDir,
}

impl Drop for Squid {
    fn drop(&mut self) {
        crate::harness::stop(&mut self.child);
    }
}

const HELPER: &str = "/usr/lib/squid/security_file_certgen";

impl Squid {
    /// A plain forward proxy: `http://` in absolute form, `CONNECT`
    /// tunnelled as bytes.
    pub fn plain() -> Squid {
        Squid::run(TempDir::new("squid"), "")
    }

    /// `ssl-bump`: every `CONNECT` intercepted with leaves signed by the
    /// CA in `ca_cert`/`ca_key` (PEM), the provider verified against
    /// `provider_ca` (PEM).
    pub fn bump(ca_cert: &str, ca_key: &str, provider_ca: &str) -> Squid {
        let dir = TempDir::new("squid-bump");
        std::fs::write(dir.join("ca.pem"), ca_cert).unwrap();
        std::fs::write(dir.join("ca.key"), ca_key).unwrap();
        std::fs::write(dir.join("provider-ca.pem"), provider_ca).unwrap();
        let db = dir.join("ssl_db");
        let made = Command::new(HELPER)
            .args(["-c", "-s"])
            .arg(&db)
            .args(["-M", "16MB"])
            .stdout(Stdio::null())
            .status()
            .expect("security_file_certgen (Debian's squid-openssl)");
        assert!(made.success(), "could not create squid's certificate db");
        let d = dir.join("").display().to_string();
        let bump = format!(
            "ssl-bump tls-cert={d}ca.pem tls-key={d}ca.key generate-host-certificates=on \
             dynamic_cert_mem_cache_size=16MB\n\
             sslcrtd_program {HELPER} -s {d}ssl_db -M 16MB\n\
             sslcrtd_children 4 startup=1 idle=1\n\
             ssl_bump bump all\n\
             tls_outgoing_options cafile={d}provider-ca.pem\n"
        );
        Squid::run(dir, &bump)
    }

    /// Its process id (the one process that serves).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn run(dir: TempDir, port_options: &str) -> Squid {
        let port = crate::harness::free_port("127.0.0.1");
        let d = dir.join("").display().to_string();
        // `port_options` begins on the http_port line (its first line).
        let conf = format!(
            "http_port 127.0.0.1:{port} {port_options}\n\
             http_access allow all\ncache deny all\naccess_log none\n\
             cache_log {d}cache.log\npid_filename {d}squid.pid\ncoredump_dir {d}\n\
             workers 1\npinger_enable off\nshutdown_lifetime 1 seconds\n"
        );
        std::fs::write(dir.join("squid.conf"), conf).unwrap();
        // Started as root, squid serves as Debian's `proxy` user: it must
        // write its log and certificate db here.
        if is_root() {
            let _ = Command::new("chown")
                .args(["-R", "proxy:proxy"])
                .arg(dir.join(""))
                .status();
        }
        let mut child = Command::new(crate::harness::debian_bin("squid"))
            .arg("-N")
            .arg("-f")
            .arg(dir.join("squid.conf"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run squid (Debian's squid-openssl)");
        // Bounded wait until it listens.
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Squid { child, port, dir };
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "squid did not listen: {}",
            std::fs::read_to_string(dir.join("cache.log")).unwrap_or_default()
        );
    }

    /// Its log (startup and errors).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("cache.log")).unwrap_or_default()
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}
