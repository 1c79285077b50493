//! R-PX3, R-PX5 against a real server: Debian's nginx as an HTTPS upstream
//! speaking HTTP/2 (ALPN), reached through sluice's TLS interception by
//! real clients. nginx refuses a request that carries both `:authority`
//! and a `Host` header ("client sent duplicate host header", 400), so over
//! h2 sluice must carry the authority in `:authority` only, without the
//! default port (RFC 9113 §8.3.1) — and keep `Host` for HTTP/1.1.

use std::time::Duration;

use sluice_tests::clients::{curl, python_env};
use sluice_tests::harness::{Sluice, TempDir};
use sluice_tests::nginx::Nginx;
use sluice_tests::pki::TestCa;

const T: Duration = Duration::from_secs(20);

/// curl over HTTP/2 and over HTTP/1.1, and Python requests, all through
/// sluice's interception to nginx speaking h2 upstream: every request gets
/// nginx's 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_to_an_h2_upstream_behind_nginx() {
    const IP: &str = "127.0.0.41";
    let ca = TestCa::new("nginx CA");
    let nginx = Nginx::tls(IP, &ca);
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
