//! The command line (R-OP4): config checking and the no-config start.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_sluice");

/// Runs sluice with `args`; asserts it succeeded; returns stdout.
fn run_ok(args: &[&std::ffi::OsStr]) -> String {
    let out = Command::new(BIN).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn temp(name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("sluice-cli-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("sluice.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn check_config_accepts_the_documented_example() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../sluice.example.toml");
    let out = run_ok(&["--check-config".as_ref(), example.as_ref()]);
    assert!(out.contains("ok"));
}

#[test]
fn check_config_names_the_bad_key() {
    let cases = [
        (
            "neg",
            "[providers.api]\nhosts = [\"api.test\"]\nceiling_rps = 0\n",
            "providers.api.ceiling_rps",
        ),
        (
            "typo",
            "[defaults]\nceilng_rps = 5.0\n",
            "defaults.ceilng_rps",
        ),
        ("open", "listen = \"0.0.0.0:3128\"\n", "auth.credentials"),
        ("syntax", "[defaults\nceiling_rps = 5.0\n", "config"),
    ];
    for (name, text, key) in cases {
        let out = Command::new(BIN)
            .arg("--check-config")
            .arg(temp(name, text))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{name}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(key), "{name}: {err}");
    }
}

#[test]
fn a_bad_config_refuses_to_start_with_the_key() {
    let out = Command::new(BIN)
        .arg("--config")
        .arg(temp("start", "[destinations]\nallow = [\"not-a-cidr\"]\n"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("destinations.allow"));
}

/// R-OP4: no config at all — loopback listeners on the documented ports,
/// then a clean exit on SIGTERM.
#[test]
fn starts_with_no_config_on_safe_defaults() {
    let dir = std::env::temp_dir().join(format!("sluice-cli-{}-noconf", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut child = Command::new(BIN)
        .current_dir(&dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let read = BufReader::new(child.stdout.take().unwrap()).read_line(&mut line);
    if read.unwrap_or(0) == 0 {
        let mut err = String::new();
        let _ = child.stderr.take().unwrap().read_to_string(&mut err);
        panic!("sluice did not start (are 3128/9901 free?): {err}");
    }
    assert_eq!(
        line.trim(),
        "sluice listening proxy=127.0.0.1:3128 admin=127.0.0.1:9901"
    );
    let health = Command::new("curl")
        .args(["-s", "--max-time", "5", "http://127.0.0.1:9901/healthz"])
        .env_remove("http_proxy")
        .env_remove("HTTP_PROXY")
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&health.stdout).trim(), "ok");
    Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    for _ in 0..200 {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "{status:?}");
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    panic!("no exit within 10 s of SIGTERM");
}

/// `sluice ca` creates the CA (key 0600) and prints the lines collectors
/// need.
#[test]
fn ca_prints_the_certificate_and_environment() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("sluice-cli-{}-ca", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let text = run_ok(&["--state-dir".as_ref(), dir.as_os_str(), "ca".as_ref()]);
    let cert = std::fs::canonicalize(dir.join("ca.crt")).unwrap();
    assert!(
        text.contains(&format!("export NODE_EXTRA_CA_CERTS={}", cert.display())),
        "{text}"
    );
    // The replacing variables get the system roots plus sluice's CA, where
    // the system has a bundle.
    let system = std::path::Path::new("/etc/ssl/certs/ca-certificates.crt");
    let replacing = if system.exists() {
        let bundle = dir.join("ca-bundle.pem");
        let text = std::fs::read_to_string(&bundle).unwrap();
        let own = std::fs::read_to_string(&cert).unwrap();
        assert!(text.contains(own.trim()), "the bundle holds sluice's CA");
        assert!(
            text.matches("BEGIN CERTIFICATE").count() > 10,
            "and the system roots"
        );
        bundle
    } else {
        cert.clone()
    };
    for var in ["SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"] {
        assert!(
            text.contains(&format!("export {var}={}", replacing.display())),
            "{var} missing:\n{text}"
        );
    }
    assert!(!text.contains("PRIVATE KEY"));
    let mode = std::fs::metadata(dir.join("ca.key"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
    // A second run keeps the same CA.
    let before = std::fs::read(dir.join("ca.crt")).unwrap();
    run_ok(&["--state-dir".as_ref(), dir.as_os_str(), "ca".as_ref()]);
    assert_eq!(std::fs::read(dir.join("ca.crt")).unwrap(), before);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 19: the global options are accepted after the subcommand, as
/// users type them (`sluice run --config F …`): the config is read (its
/// bad key is named) whichever side of `run` it stands.
#[test]
fn global_options_go_after_the_subcommand_too() {
    let bad = temp("global", "[destinations]\nallow = [\"not-a-cidr\"]\n");
    for args in [
        vec![
            "run".into(),
            "--config".into(),
            bad.clone().into_os_string(),
        ],
        vec![
            "--config".into(),
            bad.clone().into_os_string(),
            "run".into(),
        ],
    ] {
        let out = Command::new(BIN)
            .args(&args)
            .args([
                "--collector",
                "c",
                "--token-file",
                "/nonexistent",
                "--",
                "true",
            ])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("destinations.allow"), "{args:?}: {stderr}");
    }
    let out = Command::new(BIN)
        .args(["run", "--log-format", "json", "--admin", "127.0.0.1:1"])
        .args([
            "--collector",
            "c",
            "--token-file",
            "/nonexistent",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot read the token file (--token-file) /nonexistent"),
        "parsed, then the token file is missing: {stderr}"
    );
}
