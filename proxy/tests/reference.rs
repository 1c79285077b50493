//! The book's reference pages are what the code says (issue 36): the
//! committed `docs/src/reference/*.md` against what `sluice reference`
//! writes now. To bring them up to date: `cargo run -p sluice --
//! reference docs/src/reference`.

use std::path::Path;
use std::process::Command;

#[test]
fn the_committed_reference_pages_are_what_the_code_generates() {
    let out = std::env::temp_dir().join(format!("sluice-reference-{}", std::process::id()));
    std::fs::create_dir_all(&out).unwrap();
    let status = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("reference")
        .arg(&out)
        .output()
        .expect("sluice reference");
    assert!(status.status.success(), "{status:?}");
    let committed = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/src/reference");
    let mut stale = Vec::new();
    for page in ["config.md", "cli.md", "metrics.md", "admin-api.md"] {
        let now = std::fs::read_to_string(out.join(page)).unwrap();
        let was = std::fs::read_to_string(committed.join(page)).unwrap_or_default();
        if now != was {
            stale.push(page);
        }
    }
    let _ = std::fs::remove_dir_all(&out);
    assert!(
        stale.is_empty(),
        "docs/src/reference/{stale:?} differ from what the code generates: \
         run `cargo run -p sluice -- reference docs/src/reference` and commit"
    );
}
