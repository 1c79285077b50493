//! R-PX5: HTTP/1.1 Upgrade (WebSocket) through sluice. A real client —
//! Python's `websockets`, configured only by the proxy variables — talks to
//! a real `websockets` echo server on loopback, over `ws://` (plain HTTP
//! inside a CONNECT tunnel) and `wss://` (TLS intercepted). Before: sluice
//! stripped `Upgrade` as hop-by-hop and the server answered 426.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use sluice_tests::clients::python_within;
use sluice_tests::harness::{Sluice, TempDir};
use sluice_tests::pki::TestCa;

const SERVER: &str = r#"
import asyncio, ssl, sys
from websockets.asyncio.server import serve
async def echo(ws):
    async for m in ws:
        await ws.send(m)
async def main():
    tls = None
    if len(sys.argv) > 2:
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(sys.argv[2], sys.argv[3])
    async with serve(echo, sys.argv[1], 0, ssl=tls) as server:
        print(server.sockets[0].getsockname()[1], flush=True)
        await asyncio.Future()
asyncio.run(main())
"#;

const CLIENT: &str = r#"
import ssl, sys
from websockets.sync.client import connect
uri = sys.argv[1]
kw = {}
if uri.startswith("wss:"):
    kw["ssl"] = ssl.create_default_context(cafile=sys.argv[2])
with connect(uri, open_timeout=20, close_timeout=5, **kw) as ws:
    got = []
    for m in ["one", "two", "three"]:
        ws.send(m)
        got.append(ws.recv(timeout=20))
    print(" ".join(got))
"#;

/// A `websockets` echo server; killed on drop.
struct EchoServer {
    child: Child,
    port: u16,
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl EchoServer {
    fn start(ip: &str, tls: Option<(&str, &str)>) -> EchoServer {
        let mut cmd = Command::new("python3");
        cmd.arg("-c").arg(SERVER).arg(ip);
        if let Some((cert, key)) = tls {
            cmd.arg(cert).arg(key);
        }
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3 with websockets (scripts/test installs it)");
        // Its first line, read aside so that a server that neither starts
        // nor exits fails the test within a bound instead of hanging it.
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx.recv_timeout(Duration::from_secs(30)).unwrap_or_default();
        let Ok(port) = line.trim().parse() else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the websockets server did not start within 30 s: {line:?}");
        };
        EchoServer { child, port }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websockets_through_plain_and_intercepted_tunnels() {
    let ca = TestCa::new("websocket CA");
    let dir = TempDir::new("websocket");
    let (cert, key) = ca.leaf_pem(&["127.0.0.48"]);
    let (cert_path, key_path) = (dir.join("leaf.pem"), dir.join("leaf.key"));
    std::fs::write(&cert_path, cert).unwrap();
    std::fs::write(&key_path, key).unwrap();
    std::fs::write(dir.join("ca.pem"), &ca.pem).unwrap();
    let plain = EchoServer::start("127.0.0.47", None);
    let secure = EchoServer::start(
        "127.0.0.48",
        Some((cert_path.to_str().unwrap(), key_path.to_str().unwrap())),
    );
    let sluice = Sluice::start(&format!(
        "[destinations]\nallow = [\"127.0.0.0/8\"]\nconnect_ports = [{}, {}]\n\
         [upstream]\nextra_ca = \"{}\"\n",
        plain.port,
        secure.port,
        dir.join("ca.pem").display()
    ));
    let sluice_ca = sluice.dir.join("state").join("ca.crt");
    let sluice_ca = sluice_ca.to_str().unwrap();
    for uri in [
        format!("ws://127.0.0.47:{}/echo", plain.port),
        format!("wss://127.0.0.48:{}/echo", secure.port),
    ] {
        // Every step of the client is bounded (open 20 s, each echo 20 s,
        // close 5 s); past 60 s it is hung, and fails with its stacks.
        let out = python_within(
            Duration::from_secs(60),
            &sluice.proxy_url(),
            CLIENT,
            &[&uri, sluice_ca],
            &[],
        )
        .await;
        assert_eq!(out.trim(), "one two three", "{uri}");
    }
    let (_, metrics) = sluice.admin_get("/metrics").await;
    for provider in ["127.0.0.47", "127.0.0.48"] {
        assert!(
            metrics.contains(&format!(
                "sluice_upgrades_total{{provider=\"{provider}\"}} 1"
            )),
            "{provider}: {metrics}"
        );
    }
}

/// R-PX5 in absolute form (`GET ws-server-url` to the proxy with
/// `Upgrade: websocket`), by hand: 101 back, then a masked text frame out
/// and the server's echo in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_upgrade_in_absolute_form() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = EchoServer::start("127.0.0.49", None);
    let sluice = Sluice::start("[destinations]\nallow = [\"127.0.0.0/8\"]\n");
    let mut s = tokio::net::TcpStream::connect(sluice.proxy).await.unwrap();
    let head = format!(
        "GET http://127.0.0.49:{}/echo HTTP/1.1\r\nHost: 127.0.0.49:{}\r\n\
         Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        server.port, server.port
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 1];
    // Bounded: the head is small, and a read times out.
    while !got.ends_with(b"\r\n\r\n") && got.len() < 4096 {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .expect("the answer's head within 10 s")
            .unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
        got.push(buf[0]);
    }
    let head = String::from_utf8_lossy(&got).to_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("upgrade: websocket"), "{head}");
    assert!(
        head.contains("sec-websocket-accept: s3pplmbitxaq9kygzzhzrbk+xoo="),
        "{head}"
    );
    let mask = [1u8, 2, 3, 4];
    let payload = b"hello";
    let mut frame = vec![0x81, 0x80 | payload.len() as u8];
    frame.extend_from_slice(&mask);
    frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    s.write_all(&frame).await.unwrap();
    let mut echo = [0u8; 7];
    tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut echo))
        .await
        .expect("the echo within 10 s")
        .unwrap();
    assert_eq!(&echo, b"\x81\x05hello");
}
