//! Every fixture program under `tests/vm`: each exported `test_*` / `check_*`
//! function (no arguments) must succeed and each `fail_*` must fail with a
//! non-OK status, with the code and message its source documents where it
//! documents one. Each function runs in a fresh context.

mod common;

use ferrite_base::StatusCode;
use ferrite_vm::Module;

/// (module, function) -> (expected code, substring of the message) for the
/// failures whose source names what they fail with.
fn expected_failure(module: &str, function: &str) -> Option<(StatusCode, &'static str)> {
    Some(match (module, function) {
        ("traps", "fail_explicit_status") => (
            StatusCode::PermissionDenied,
            "explicit failure with PERMISSION_DENIED",
        ),
        ("traps", "fail_after_work") => (
            StatusCode::InvalidArgument,
            "3+4 is 7, so this INVALID_ARGUMENT failure is reached",
        ),
        ("traps", "fail_deep_recursion") => (StatusCode::ResourceExhausted, "stack"),
        ("calls", "fail_in_callee") => (StatusCode::OutOfRange, "callee failed with OUT_OF_RANGE"),
        ("calls", "fail_call_unresolved_import") => {
            (StatusCode::NotFound, "ferrite_absent.optional_fn")
        }
        ("refs", "fail_select_ref_wrong_type") => {
            (StatusCode::InvalidArgument, "ref type mismatch")
        }
        _ => return None,
    })
}

#[test]
fn every_fixture_function_behaves() {
    let mut passed = 0usize;
    let mut failed_as_expected = 0usize;
    let mut skipped = 0usize;
    let mut problems = Vec::new();
    let fixtures = common::fixtures();
    for (name, _) in &fixtures {
        let instance = common::fixture_instance();
        let module = common::load_fixture(&instance, name);
        for fname in common::export_names(&*module) {
            let want_ok = fname.starts_with("test_") || fname.starts_with("check_");
            let want_fail = fname.starts_with("fail_");
            if !want_ok && !want_fail {
                skipped += 1;
                continue;
            }
            let ctx = match common::context_for(&instance, module.clone()) {
                Ok(c) => c,
                Err(e) => {
                    problems.push(format!("{name}: cannot create context: {e}"));
                    break;
                }
            };
            let f = match ctx.lookup_function(&fname) {
                Ok(f) => f,
                Err(e) => {
                    problems.push(format!("{name}.{fname}: lookup failed: {e}"));
                    continue;
                }
            };
            let r = ctx.invoke(&f, Vec::new());
            match (want_ok, r) {
                (true, Ok(_)) => passed += 1,
                (true, Err(e)) => problems.push(format!("{name}.{fname} must succeed: {e}")),
                (false, Ok(v)) => {
                    problems.push(format!("{name}.{fname} must fail, returned {v:?}"))
                }
                (false, Err(e)) => {
                    if e.code() == StatusCode::Ok {
                        problems.push(format!("{name}.{fname} failed with an OK status: {e}"));
                        continue;
                    }
                    if let Some((code, msg)) = expected_failure(name, &fname) {
                        let text = e.to_string();
                        if e.code() != code || !text.contains(msg) {
                            problems.push(format!(
                                "{name}.{fname}: expected {code} containing {msg:?}, got: {e}"
                            ));
                            continue;
                        }
                    }
                    if e.message().is_empty() {
                        problems.push(format!("{name}.{fname}: failure without a message: {e}"));
                        continue;
                    }
                    failed_as_expected += 1;
                }
            }
        }
    }
    println!(
        "vm_programs: {} fixtures, {passed} test_/check_ functions passed, \
         {failed_as_expected} fail_ functions failed as expected, {skipped} other exports skipped",
        fixtures.len()
    );
    assert!(passed > 0, "no test_ functions ran");
    assert!(
        problems.is_empty(),
        "{} problem(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// Every `fail_*` with a documented expectation exists, so the table above
/// cannot silently go stale.
#[test]
fn documented_failures_exist() {
    let instance = common::fixture_instance();
    for (m, f) in [
        ("traps", "fail_explicit_status"),
        ("traps", "fail_after_work"),
        ("traps", "fail_deep_recursion"),
        ("calls", "fail_in_callee"),
        ("calls", "fail_call_unresolved_import"),
        ("refs", "fail_select_ref_wrong_type"),
    ] {
        let module = common::load_fixture(&instance, m);
        assert!(
            module.lookup_export(f).is_some(),
            "{m}.{f} is no longer exported"
        );
        assert!(expected_failure(m, f).is_some());
    }
}
