//! Flags every tool shares: `--flagfile` (upstream's semantics: one flag
//! per line, comments, read in place so later flags override), flags given
//! twice keeping the last value, the device listings, task flags that must
//! parse, and every row of the flag table (`docs/flags.md`) against the
//! tools.

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
            .contains("Available drivers: cuda, local-sync, local-task"),
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

#[test]
fn module_mode_and_benchmark_reporting_flags() {
    let module = format!("--module={}", common::fixture_path("arith_i32").display());
    for mode in ["preload", "mmap"] {
        let o = ferrite(&strings(&[
            "run-module",
            &module,
            &format!("--module_mode={mode}"),
            "--function=sum_i32",
            "--input=40",
            "--input=2",
        ]));
        assert_eq!(
            o.stdout, "EXEC @sum_i32\nresult[0]: i32=42\n",
            "{mode}: {}",
            o.stderr
        );
    }
    let o = ferrite(&strings(&[
        "run-module",
        &module,
        "--module_mode=copy",
        "--function=sum_i32",
    ]));
    assert_eq!(o.code, Some(2), "{}", o.stderr);
    let bench = |extra: &[&str]| {
        let mut a = strings(&[
            "benchmark-module",
            &module,
            "--function=sum_i32",
            "--input=40",
            "--input=2",
            "--benchmark_min_time=3x",
        ]);
        a.extend(strings(extra));
        let o = ferrite(&a);
        assert_eq!(o.code, Some(0), "{extra:?}: {}", o.stderr);
        o.stdout
    };
    assert_eq!(
        bench(&["--benchmark_list_tests"]),
        "BM_sum_i32/process_time/real_time\n"
    );
    let all = bench(&["--benchmark_repetitions=2", "--benchmark_format=json"]);
    assert_eq!(
        all.matches("\"run_type\": \"iteration\"").count(),
        2,
        "{all}"
    );
    assert_eq!(
        all.matches("\"run_type\": \"aggregate\"").count(),
        4,
        "{all}"
    );
    for only in [
        "--benchmark_report_aggregates_only",
        "--benchmark_display_aggregates_only=true",
    ] {
        let agg = bench(&["--benchmark_repetitions=2", "--benchmark_format=json", only]);
        assert_eq!(
            agg.matches("\"run_type\": \"iteration\"").count(),
            0,
            "{only}: {agg}"
        );
        assert_eq!(
            agg.matches("\"run_type\": \"aggregate\"").count(),
            4,
            "{only}: {agg}"
        );
    }
}

/// Walks the flag table (`ferrite_tooling::flag_table::FLAGS`, shown in
/// `docs/flags.md`) and checks that each row says what the tools do: an
/// implemented flag is accepted, an ignored one is accepted with a warning
/// naming it, a rejected one fails with the message naming it. run-module
/// and benchmark-module get `--list_devices` too, so that they parse every
/// flag and then only list devices; dump-module dumps a fixture.
#[test]
fn every_row_of_the_flag_table_holds() {
    let dir = std::env::temp_dir().join(format!("ferrite-flag-parity-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let flagfile = dir.join("empty.flags");
    std::fs::write(&flagfile, "# no flags\n").unwrap();
    let fixture = common::fixture_path("arith_i32").display().to_string();
    let mut failures = Vec::new();
    let mut checked = 0;
    for row in ferrite_tooling::flag_table::FLAGS {
        for tool in row.tools.chars() {
            let example = row
                .example
                .replace(
                    "--flagfile=FILE",
                    &format!("--flagfile={}", flagfile.display()),
                )
                .replace("=FILE", &format!("={}", dir.join("out.txt").display()));
            let mut args: Vec<String> = match tool {
                'R' => vec!["run-module".into()],
                'B' => vec!["benchmark-module".into()],
                _ => vec!["dump-module".into(), fixture.clone()],
            };
            args.push(example.clone());
            if tool != 'D' && row.name != "help" {
                args.push("--list_devices".into());
            }
            let o = ferrite(&args);
            let name = format!("--{}", row.name);
            let ok = match row.status {
                ferrite_tooling::flag_table::FlagStatus::Implemented => {
                    o.code == Some(0)
                        && !o.stderr.contains(&name)
                        && (tool == 'D' || row.name == "help" || o.stdout.contains("local-sync://"))
                }
                ferrite_tooling::flag_table::FlagStatus::Ignored => {
                    o.code == Some(0)
                        && o.stderr.contains(&format!(
                            "warning: {name} is ignored by ferrite: {}",
                            row.note
                        ))
                }
                ferrite_tooling::flag_table::FlagStatus::Rejected => {
                    o.code == Some(1)
                        && o.stderr
                            .contains(&format!("{name} is not supported by ferrite: {}", row.note))
                }
            };
            checked += 1;
            if !ok {
                failures.push(format!(
                    "{tool} {example}: table says {}, got exit {:?}\nstdout: {}\nstderr: {}",
                    row.status.as_str(),
                    o.code,
                    o.stdout.lines().next().unwrap_or(""),
                    o.stderr.trim()
                ));
            }
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(checked > 150, "only {checked} flag uses checked");
    assert!(
        failures.is_empty(),
        "{} of {checked} rows do not hold:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
