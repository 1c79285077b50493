//! R-PX3, R-PX5 against a real server: Debian's nginx as an HTTPS upstream
//! speaking HTTP/2 (ALPN), reached through sluice's TLS interception by
//! real clients. nginx refuses a request that carries both `:authority`
//! and a `Host` header ("client sent duplicate host header", 400), so over
//! h2 sluice must carry the authority in `:authority` only, without the
//! default port (RFC 9113 §8.3.1) — and keep `Host` for HTTP/1.1.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use sluice_tests::clients::{curl, python_env};
use sluice_tests::harness::{Sluice, TempDir};
use sluice_tests::pki::TestCa;

const T: Duration = Duration::from_secs(20);

/// nginx on `ip:port` with TLS (h2 and http/1.1), answering `ok` with the
/// protocol it spoke; stopped on drop.
struct Nginx {
    child: Child,
    port: u16,
    _dir: TempDir,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Nginx {
    fn start(ip: &str, ca: &TestCa) -> Nginx {
        let dir = TempDir::new("nginx");
        let (cert, key) = ca.leaf_pem(&[ip]);
        std::fs::write(dir.join("leaf.pem"), cert).unwrap();
        std::fs::write(dir.join("leaf.key"), key).unwrap();
        // A free port on this address (nginx binds it right after).
        let port = TcpListener::bind((ip, 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let d = dir.join("").display().to_string();
        let conf = format!(
            "daemon off;\nuser root;\nworker_processes 1;\npid {d}nginx.pid;\n\
             error_log {d}error.log;\nevents {{ worker_connections 64; }}\n\
             http {{\n  access_log {d}access.log;\n  client_body_temp_path {d}body;\n\
               proxy_temp_path {d}proxy;\n  fastcgi_temp_path {d}fastcgi;\n\
               uwsgi_temp_path {d}uwsgi;\n  scgi_temp_path {d}scgi;\n\
               server {{\n    listen {ip}:{port} ssl http2;\n\
                 ssl_certificate {d}leaf.pem;\n    ssl_certificate_key {d}leaf.key;\n\
                 location / {{ return 200 \"ok $server_protocol\\n\"; }}\n  }}\n}}\n"
        );
        std::fs::write(dir.join("nginx.conf"), conf).unwrap();
        // Debian puts it in /usr/sbin, which not every PATH has.
        let bin = ["/usr/sbin/nginx", "/usr/bin/nginx"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .unwrap_or("nginx");
        let mut child = Command::new(bin)
            .arg("-p")
            .arg(dir.join(""))
            .arg("-c")
            .arg(dir.join("nginx.conf"))
            .arg("-e")
            .arg(dir.join("error.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run nginx (scripts/test installs Debian's nginx)");
        // Bounded wait until it listens.
        for _ in 0..100 {
            if std::net::TcpStream::connect((ip, port)).is_ok() {
                return Nginx {
                    child,
                    port,
                    _dir: dir,
                };
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "nginx did not listen: {}",
            std::fs::read_to_string(dir.join("error.log")).unwrap_or_default()
        );
    }
}

/// curl over HTTP/2 and over HTTP/1.1, and Python requests, all through
/// sluice's interception to nginx speaking h2 upstream: every request gets
/// nginx's 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_to_an_h2_upstream_behind_nginx() {
    const IP: &str = "127.0.0.41";
    let ca = TestCa::new("nginx CA");
    let nginx = Nginx::start(IP, &ca);
    let dir = TempDir::new("nginx-ca");
    std::fs::write(dir.join("provider-ca.pem"), &ca.pem).unwrap();
    let sluice = Sluice::start(&format!(
        "[destinations]\nallow = [\"127.0.0.0/8\"]\nconnect_ports = [{}]\n\
         [upstream]\nextra_ca = \"{}\"\n",
        nginx.port,
        dir.join("provider-ca.pem").display()
    ));
    let sluice_ca = sluice.dir.join("state").join("ca.crt");
    let cacert = sluice_ca.display().to_string();
    let url = format!("https://{IP}:{}/items", nginx.port);
    for (args, client_version) in [
        (vec!["--http2", "--cacert", &cacert], "2"),
        (vec!["--http1.1", "--cacert", &cacert], "1.1"),
    ] {
        let r = curl(&sluice.proxy_url(), &args, &url, T).await;
        assert_eq!(r.status, 200, "curl {client_version}: {r:?}");
        assert_eq!(r.version, client_version);
        assert_eq!(
            r.body.trim(),
            "ok HTTP/2.0",
            "sluice spoke h2 to nginx (curl {client_version})"
        );
    }
    let script = r#"
import sys, requests
r = requests.get(sys.argv[1], timeout=20)
print(r.status_code, r.text.strip())
"#;
    let out = python_env(
        &sluice.proxy_url(),
        script,
        &[&url],
        &[("REQUESTS_CA_BUNDLE", &cacert)],
    )
    .await;
    assert_eq!(out.trim(), "200 ok HTTP/2.0", "Python requests");
}
