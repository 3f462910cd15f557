//! `ferrite dump-module` against the VM fixtures, and against upstream's
//! `iree-dump-module` where the pinned tools are installed.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ferrite_testkit::fixtures::{fixture_path, fixtures};
use ferrite_testkit::venv_tool_path;

fn all_fixtures() -> Vec<PathBuf> {
    fixtures().into_iter().map(|(_, path)| path).collect()
}

fn run(bin: &Path, args: &[&str], file: &Path) -> Output {
    Command::new(bin)
        .args(args)
        .arg(file)
        .output()
        .expect("running dump-module")
}

fn ferrite(args: &[&str], file: &Path) -> Output {
    let mut a = vec!["dump-module"];
    a.extend_from_slice(args);
    run(Path::new(env!("CARGO_BIN_EXE_ferrite")), &a, file)
}

fn stdout_ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "dump-module failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).expect("utf-8 output")
}

fn assert_lines(text: &str, lines: &[&str]) {
    for l in lines {
        assert!(
            text.lines().any(|x| x == *l),
            "missing line {l:?} in:\n{text}"
        );
    }
}

#[test]
fn metadata_of_calls() {
    let out = stdout_ok(&ferrite(&["--output=metadata"], &fixture_path("calls")));
    assert_lines(
        &out,
        &[
            "// @calls : version 0",
            "Requirements: EXT_F32 | EXT_F64",
            "Required Types:",
            "  [  0] i32",
            "  [  1] !vm.buffer",
            "Imported Functions:",
            "  [  0] ?ferrite_absent.optional_fn(i32) -> (i32)",
            "Exported Functions:",
            "  [  1] fact_i64(i64) -> (i64)",
            "  [  9] mix(i64, f64, f32) -> (f64, i64)",
            "// Sections",
            "  .rodata[  0] embedded        8 bytes",
            "// Bytecode : version 0",
            "  # | Offset   |   Length | Blocks | i32 # | ref # | Requirements | Aliases",
        ],
    );
    assert!(out
        .lines()
        .any(|l| l.starts_with("FlatBuffer: ") && l.ends_with(" bytes")));
    assert!(out.lines().any(|l| l.starts_with("  Bytecode: ")));
    assert!(
        out.lines()
            .any(|l| l.starts_with("  1 | ")
                && l.ends_with("| EXT_F32 | EXT_F64 | test_call_all_types")),
        "{out}"
    );
    assert!(!out.contains("vm.func"), "metadata only");
}

#[test]
fn disassembly_of_calls() {
    let out = stdout_ok(&ferrite(&["--output=disassembly"], &fixture_path("calls")));
    assert_lines(
        &out,
        &[
            "vm.module @calls version 0",
            "vm.type !vm.buffer",
            "vm.import optional @ferrite_absent.optional_fn cconv \"0i_i\"",
            "vm.export @fib_i32",
            "vm.func @fib_i32(%i0: i32) -> (i32) {",
            "^bb0:",
            "  %i1 = vm.const.i32 2  // 0x00000002",
            "  %i2 = vm.cmp.lt.i32.s %i0, %i1",
            "  vm.cond_br %i2, ^bb1(), ^bb2()",
            "  %i6 = vm.call @calls:3(%i4)",
            "  %i0:1 = vm.const.i64 -6000000000  // 0xFFFFFFFE9A5F4400",
            "  %i2:3 = vm.const.f64 2.5",
            "  %r0 = vm.const.ref.rodata 0  // 8b",
            "vm.func @fn5() -> () {",
            "  vm.call.yieldable @calls:6(%i0) -> ^bb1(%i2)",
            "  %i1 = vm.call @ferrite_absent.optional_fn(%i0)",
            "  vm.fail %i200, \"i32 result\"",
        ],
    );
    let with_offsets = stdout_ok(&ferrite(
        &[
            "--output=disassembly",
            "--bytecode_offsets",
            "--function=fn5",
        ],
        &fixture_path("calls"),
    ));
    assert_lines(
        &with_offsets,
        &[
            "vm.func @fn5() -> () {",
            "[00000000]^bb0:",
            "[00000001]  vm.return",
        ],
    );
    assert!(!with_offsets.contains("@fib_i32("));
}

#[test]
fn default_output_is_all() {
    let out = stdout_ok(&ferrite(&[], &fixture_path("calls")));
    assert!(out.contains("// @calls : version 0"));
    assert!(out.contains("vm.func @mix(%i0:1: i64, %i2:3: f64, %i4: f32) -> (f64, i64) {"));
}

#[test]
fn errors_exit_non_zero() {
    let missing = ferrite(&[], Path::new("/nonexistent/x.vmfb"));
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/x.vmfb"));

    let junk = std::env::temp_dir().join(format!("ferrite-dump-junk-{}.vmfb", std::process::id()));
    std::fs::write(&junk, b"this is not a vmfb at all, just some bytes").unwrap();
    let bad = ferrite(&[], &junk);
    std::fs::remove_file(&junk).ok();
    assert!(!bad.status.success());
    assert!(!bad.stderr.is_empty());
    assert!(bad.stdout.is_empty());

    let flag = ferrite(&["--output=bogus"], &fixture_path("calls"));
    assert!(!flag.status.success());
    assert!(String::from_utf8_lossy(&flag.stderr).contains("bogus"));
}

/// Sections of metadata output between headers, by title.
fn section<'a>(text: &'a str, title: &str) -> &'a str {
    let start = text.find(title).unwrap_or(text.len());
    let rest = &text[start..];
    let end = rest[title.len()..]
        .find("\n\n")
        .map_or(rest.len(), |e| e + title.len());
    &rest[..end]
}

#[test]
fn matches_upstream() {
    let upstream = venv_tool_path("iree-dump-module");
    if !upstream.exists() {
        ferrite_testkit::skip_or_fail(
            "matches_upstream",
            &format!("{} not installed", upstream.display()),
        );
        return;
    }
    for f in all_fixtures() {
        let name = f.display();
        // Metadata: identical, and in particular the exports and the table.
        let ours = stdout_ok(&ferrite(&["--output=metadata"], &f));
        let up = run(&upstream, &["--output=metadata"], &f);
        assert!(up.status.success(), "upstream failed on {name}");
        let up = String::from_utf8_lossy(&up.stdout).into_owned();
        for title in ["Exported Functions:", "Bytecode : version"] {
            assert_eq!(
                section(&ours, title),
                section(&up, title),
                "{title} of {name}"
            );
        }
        assert_eq!(ours, up, "metadata of {name}");

        // Disassembly: identical where upstream succeeds; where upstream's
        // disassembler gives up (ops it lacks) or crashes, what it printed
        // must be a prefix of ours.
        let ours = stdout_ok(&ferrite(
            &["--output=disassembly", "--bytecode_offsets"],
            &f,
        ));
        let up = run(
            &upstream,
            &["--output=disassembly", "--bytecode_offsets"],
            &f,
        );
        let up_text = String::from_utf8_lossy(&up.stdout).into_owned();
        if up.status.success() {
            assert_eq!(ours, up_text, "disassembly of {name}");
        } else {
            let lines: Vec<&str> = up_text.lines().collect();
            let ours_lines: Vec<&str> = ours.lines().collect();
            assert!(
                ours_lines.starts_with(&lines),
                "upstream's partial disassembly of {name} is not a prefix of ours"
            );
        }
    }
}
