//! The README's five minutes, followed literally (issue 36): its shell
//! blocks run as written, in order, in a fresh directory — the origin and
//! sluice in the background, as the README's "own terminal" — with the
//! config block written to `sluice.toml`. One step is stood in for: the
//! build (`cargo build --release …`), whose binary is the one under test
//! (`target/debug/sluice`, or `SLUICE_BIN`), put on the `PATH` as the
//! README's `export PATH=…` does. The answers are checked against the
//! output the README shows. The origin and sluice use the README's fixed
//! ports (8000, 3128, 9901): the nextest group `default-ports` keeps this
//! test apart from the others that use them.

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

use sluice_tests::harness::{binary, TempDir};

/// A fenced block of the README: its language and text.
#[derive(Debug)]
struct Block {
    lang: String,
    text: String,
}

/// The fenced blocks of the README's section titled `title`.
fn section_blocks(readme: &str, title: &str) -> (String, Vec<Block>) {
    let start = readme
        .find(&format!("\n## {title}\n"))
        .unwrap_or_else(|| panic!("README.md has no section {title:?}"));
    let rest = &readme[start + 1..];
    let end = rest[3..].find("\n## ").map_or(rest.len(), |e| e + 3);
    let section = rest[..end].to_string();
    let mut blocks = Vec::new();
    let mut lines = section.lines();
    while let Some(line) = lines.next() {
        if let Some(lang) = line.strip_prefix("```") {
            let mut text = String::new();
            for l in lines.by_ref() {
                if l.starts_with("```") {
                    break;
                }
                text.push_str(l);
                text.push('\n');
            }
            blocks.push(Block {
                lang: lang.trim().to_string(),
                text,
            });
        }
    }
    (section, blocks)
}

/// A background step's process group, killed when dropped.
struct Background(Child);

impl Drop for Background {
    fn drop(&mut self) {
        // `--`: a negative pid (the process group) is not an option.
        let _ = Command::new("kill")
            .args(["-s", "KILL", "--", &format!("-{}", self.0.id())])
            .status();
        let _ = self.0.wait();
    }
}

/// `bash -c text` in `dir`, with the proxy variables of this process
/// cleared (a newcomer's shell has none) and `path` as its PATH.
fn shell(dir: &Path, path: &str, text: &str) -> Command {
    let mut cmd = Command::new("bash");
    cmd.arg("-c").arg(text).current_dir(dir).env("PATH", path);
    for var in [
        "http_proxy",
        "HTTP_PROXY",
        "https_proxy",
        "HTTPS_PROXY",
        "all_proxy",
        "ALL_PROXY",
        "no_proxy",
        "NO_PROXY",
    ] {
        cmd.env_remove(var);
    }
    cmd
}

fn wait_for_port(addr: &str, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "{what} never listened on {addr}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn the_readme_five_minutes_give_a_paced_200_as_written() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let (section, blocks) = section_blocks(&readme, "Five minutes to a paced request");
    let langs: Vec<&str> = blocks.iter().map(|b| b.lang.as_str()).collect();
    assert_eq!(
        langs,
        ["sh", "sh", "toml", "sh", "sh", "text", "sh", "text"],
        "the steps this test follows"
    );
    let [build, origin, config, run, requests, shown, status, status_shown] = &blocks[..] else {
        unreachable!()
    };

    let dir = TempDir::new("readme");
    // Step 1 builds and puts `target/release` on the PATH; here the binary
    // under test's directory stands for it.
    assert!(
        build.text.starts_with("cargo build --release -p sluice")
            && build.text.contains("export PATH="),
        "{}",
        build.text
    );
    let bin_dir = binary().parent().unwrap().to_path_buf();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );

    // Step 2: the origin, in its own terminal.
    let _origin = Background(
        shell(&dir.0, &path, &origin.text)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap(),
    );
    wait_for_port("127.0.0.1:8000", "the origin of step 2");

    // Step 3: the config, written where the README says.
    assert!(section.contains("Write this to `sluice.toml`"));
    std::fs::write(dir.join("sluice.toml"), &config.text).unwrap();

    // Step 4: sluice, in its own terminal; it prints the line the README
    // promises.
    let mut sluice = Background(
        shell(&dir.0, &path, &run.text)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap(),
    );
    let promised = "sluice listening proxy=127.0.0.1:3128 admin=127.0.0.1:9901";
    assert!(section.contains(promised));
    let mut line = String::new();
    BufReader::new(sluice.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), promised, "sluice's first line");

    // Step 5: the collector's requests, and what the README shows of them.
    let out = shell(&dir.0, &path, &requests.text).output().unwrap();
    let got = String::from_utf8_lossy(&out.stdout);
    let codes = |text: &str| -> Vec<String> {
        text.lines()
            .map(|l| l.split_whitespace().next().unwrap_or("").to_string())
            .collect()
    };
    assert_eq!(
        codes(&got),
        codes(&shown.text),
        "step 5 printed:\n{got}\nthe README shows:\n{}",
        shown.text
    );
    assert!(codes(&got).iter().all(|c| c == "200"), "{got}");

    // Step 6: sluice status shows the provider, under the README's header.
    let out = shell(&dir.0, &path, &status.text).output().unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    let header = status_shown.text.lines().next().unwrap();
    assert!(
        table
            .lines()
            .any(|l| l.split_whitespace().eq(header.split_whitespace())),
        "no header {header:?} in:\n{table}"
    );
    let row = table
        .lines()
        .find(|l| l.starts_with("local "))
        .unwrap_or_else(|| panic!("no provider `local` in:\n{table}"));
    assert!(row.contains("20 req/s"), "its ceiling: {row}");

    // Paced: every request went through the provider's stack — counted
    // as its successes — and its rate is its own, under the ceiling.
    let metrics = Command::new("curl")
        .args(["-s", "--noproxy", "*", "http://127.0.0.1:9901/metrics"])
        .output()
        .unwrap();
    let metrics = String::from_utf8_lossy(&metrics.stdout);
    let successes: f64 = metrics
        .lines()
        .filter(|l| {
            l.starts_with("sluice_requests_total{")
                && l.contains("provider=\"local\"")
                && l.contains("outcome=\"success\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(successes, 6.0, "{metrics}");
    let rate: f64 = metrics
        .lines()
        .find(|l| l.starts_with("sluice_provider_rate_rps{provider=\"local\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no rate for `local`:\n{metrics}"));
    assert!(rate > 0.0 && rate <= 20.0, "rate {rate}");
}
