//! Walks the flag table (`ferrite_tooling::flag_table::FLAGS`, shown in
//! `docs/flags.md`) and checks that each row says what the tools do: an
//! implemented flag is accepted, an ignored one is accepted with a warning
//! naming it, a rejected one fails with the message naming it.
//!
//! run-module and benchmark-module get `--list_devices` too, so that they
//! parse every flag and then only list devices; dump-module dumps a fixture.

#[path = "../../ferrite-vm/tests/common/mod.rs"]
mod common;

use ferrite_testkit::{run_program, Output};
use ferrite_tooling::flag_table::{FlagStatus, FLAGS};
use std::path::PathBuf;
use std::time::Duration;

fn ferrite(args: &[String]) -> Output {
    run_program(
        &PathBuf::from(env!("CARGO_BIN_EXE_ferrite")),
        args,
        Duration::from_secs(60),
    )
}

#[test]
fn every_row_of_the_flag_table_holds() {
    let dir = std::env::temp_dir().join(format!("ferrite-flag-parity-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let flagfile = dir.join("empty.flags");
    std::fs::write(&flagfile, "# no flags\n").unwrap();
    let fixture = common::fixture_path("arith_i32").display().to_string();
    let mut failures = Vec::new();
    let mut checked = 0;
    for row in FLAGS {
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
                FlagStatus::Implemented => {
                    o.code == Some(0)
                        && !o.stderr.contains(&name)
                        && (tool == 'D' || row.name == "help" || o.stdout.contains("local-sync://"))
                }
                FlagStatus::Ignored => {
                    o.code == Some(0)
                        && o.stderr.contains(&format!(
                            "warning: {name} is ignored by ferrite: {}",
                            row.note
                        ))
                }
                FlagStatus::Rejected => {
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
