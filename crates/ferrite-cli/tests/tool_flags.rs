//! Flags every tool shares: `--flagfile` (upstream's semantics: one flag
//! per line, comments, read in place so later flags override), flags given
//! twice keeping the last value, the device listings, and task flags that
//! must parse.

#[path = "../../ferrite-vm/tests/common/mod.rs"]
mod common;

use ferrite_testkit::{run_program, Output};
use std::path::PathBuf;
use std::time::Duration;

fn ferrite(args: &[String]) -> Output {
    run_program(
        &PathBuf::from(env!("CARGO_BIN_EXE_ferrite")),
        args,
        Duration::from_secs(60),
    )
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ferrite-tool-flags-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn flagfile_is_read_in_place_and_later_flags_win() {
    let dir = temp_dir("flagfile");
    let module = common::fixture_path("arith_i32");
    let flags = dir.join("run.flags");
    std::fs::write(
        &flags,
        format!(
            "# the program\n--module={}\n\n// a comment\n  --function=sum_i32  \n--input=40\n",
            module.display()
        ),
    )
    .unwrap();
    let flagfile = format!("--flagfile={}", flags.display());
    let o = ferrite(&strings(&["run-module", &flagfile, "--input=2"]));
    assert_eq!(o.code, Some(0), "{}{}", o.stdout, o.stderr);
    assert_eq!(o.stdout, "EXEC @sum_i32\nresult[0]: i32=42\n");
    // A single-valued flag after the file overrides the file's value.
    let o = ferrite(&strings(&[
        "run-module",
        &flagfile,
        "--function=divmod_i32",
        "--input=5",
    ]));
    assert_eq!(o.code, Some(0), "{}{}", o.stdout, o.stderr);
    assert!(o.stdout.starts_with("EXEC @divmod_i32\n"), "{}", o.stdout);
    // Positional arguments in a flag file are errors naming file and line.
    std::fs::write(dir.join("bad.flags"), "--input=1\nmodule.vmfb\n").unwrap();
    let o = ferrite(&strings(&[
        "run-module",
        &format!("--flagfile={}", dir.join("bad.flags").display()),
    ]));
    assert_eq!(o.code, Some(1));
    assert!(
        o.stderr
            .contains("bad.flags:2: positional arguments not allowed in flag files"),
        "{}",
        o.stderr
    );
    let o = ferrite(&strings(&[
        "dump-module",
        "--flagfile=/nonexistent/f.flags",
    ]));
    assert_eq!(o.code, Some(1));
    assert!(o.stderr.contains("/nonexistent/f.flags"), "{}", o.stderr);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn lists_drivers_and_devices_as_upstream() {
    for tool in ["run-module", "benchmark-module", "check-module"] {
        let o = ferrite(&strings(&[tool, "--list_devices"]));
        assert_eq!(o.code, Some(0), "{tool}: {}", o.stderr);
        assert_eq!(o.stdout, "local-sync://\nlocal-task://\n", "{tool}");
    }
    let o = ferrite(&strings(&["run-module", "--list_drivers"]));
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    assert!(o.stdout.contains("# Available HAL drivers"), "{}", o.stdout);
    assert!(
        o.stdout.contains(
            "      local-task: Local execution using the IREE multithreading task system\n"
        ),
        "{}",
        o.stdout
    );
    let o = ferrite(&strings(&["run-module", "--list_devices=local-sync"]));
    assert_eq!(o.stdout, "local-sync://\n");
    let o = ferrite(&strings(&["run-module", "--dump_devices=local-task"]));
    assert!(
        o.stdout.contains("# --device=local-task://\n#   default\n"),
        "{}",
        o.stdout
    );
    let o = ferrite(&strings(&["run-module", "--list_devices=vulkan"]));
    assert_eq!(o.code, Some(1));
    assert!(
        o.stderr
            .contains("available devices: local-sync, local-task"),
        "{}",
        o.stderr
    );
}

#[test]
fn task_flags_are_checked_and_reach_the_device() {
    let module = format!("--module={}", common::fixture_path("arith_i32").display());
    let run = |extra: &[&str]| {
        let mut a = strings(&[
            "run-module",
            &module,
            "--function=sum_i32",
            "--input=1",
            "--input=2",
        ]);
        a.extend(strings(extra));
        ferrite(&a)
    };
    // VM-only programs create no device, but flags are still parsed.
    let o = run(&[
        "--task_topology_group_count=2",
        "--task_topology_cpu_ids=0,1",
    ]);
    assert_eq!(o.code, Some(0), "{}", o.stderr);
    // Even when the program needs no device, a bad value is an error.
    let o = run(&["--task_topology_group_count=lots"]);
    assert_eq!(o.code, Some(1));
    assert!(
        o.stderr.contains("--task_topology_group_count=lots"),
        "{}",
        o.stderr
    );
    let o = ferrite(&strings(&[
        "run-module",
        "--list_devices",
        "--task_topology_cpu_ids=0,x",
    ]));
    assert_eq!(o.code, Some(1));
    assert!(
        o.stderr.contains("--task_topology_cpu_ids=0,x"),
        "{}",
        o.stderr
    );
    let o = ferrite(&strings(&[
        "run-module",
        "--list_devices",
        "--task_topology_distribution=random",
    ]));
    assert_eq!(o.code, Some(1));
    assert!(o.stderr.contains("'scatter'"), "{}", o.stderr);
}
