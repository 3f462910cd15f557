//! The README's Rust snippets are those of `docs/rust-api.md`, which the
//! crate compiles and runs as doc tests (`ferrite::guide`): a snippet edited
//! in the README alone, or one added there without a doc test, fails here.

use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The fenced blocks whose info string starts with `rust`, as their
/// visible lines (rustdoc's hidden `# ` lines left out).
fn rust_blocks(markdown: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<Vec<&str>> = None;
    for line in markdown.lines() {
        let trimmed = line.trim_start();
        match &mut current {
            None => {
                if let Some(info) = trimmed.strip_prefix("```") {
                    if info.trim() == "rust" || info.trim().starts_with("rust,") {
                        current = Some(Vec::new());
                    }
                }
            }
            Some(lines) => {
                if trimmed.starts_with("```") {
                    blocks.push(lines.join("\n"));
                    current = None;
                } else if !(trimmed == "#" || trimmed.starts_with("# ")) {
                    lines.push(line);
                }
            }
        }
    }
    blocks
}

#[test]
fn readme_rust_snippets_are_doc_tested() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let guide = std::fs::read_to_string(root().join("docs/rust-api.md")).unwrap();
    let tested = rust_blocks(&guide);
    assert!(tested.len() >= 4, "docs/rust-api.md lost its snippets");
    let shown = rust_blocks(&readme);
    assert!(!shown.is_empty(), "the README shows no Rust snippet");
    for block in &shown {
        assert!(
            tested.contains(block),
            "a Rust snippet of README.md is not in docs/rust-api.md (doc-tested); copy it there or make them equal:\n{block}"
        );
    }
}

#[test]
fn hidden_lines_and_other_languages_are_left_out() {
    let md = "text\n```rust,no_run\nlet a = 1;\n# let hidden = 2;\n#\nlet b = a;\n```\n```python\nx = 1\n```\n```rust\nfoo();\n```\n";
    assert_eq!(rust_blocks(md), vec!["let a = 1;\nlet b = a;", "foo();"]);
}
