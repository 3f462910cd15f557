//! `--flagfile=PATH`: flags read from a file, as upstream's tools do.
//!
//! Upstream's semantics (`iree/base/tooling/flags.c`): a flag file holds
//! one `--name=value` (or `--name`) per line; surrounding whitespace is
//! ignored, as are empty lines and lines starting with `#` or `//`; a line
//! without `--` (a positional argument) is an error naming the file and
//! line. The file's flags take effect where `--flagfile` stands on the
//! command line, so flags after it override single-valued flags it sets,
//! and list flags (`--input`, `--module`, `--parameters`) accumulate in
//! order. A flag file may name another flag file. String values wrapped in
//! double quotes lose them (`--function="main"`), so upstream's `--help`
//! output, which is itself a flag file, can be read back.

use ferrite_base::{bail, status, Result};
use std::ffi::OsString;

/// How deeply flag files may name flag files (a cycle ends here).
const MAX_DEPTH: usize = 16;

/// Replaces every `--flagfile=PATH` in `args` (program name first) with the
/// flags the file holds, in place.
pub fn expand_flagfiles(args: Vec<OsString>) -> Result<Vec<OsString>> {
    let mut out = Vec::with_capacity(args.len());
    for arg in args {
        match arg.to_str().and_then(flagfile_value) {
            Some(path) => expand_file(path, &mut out, 0)?,
            None => out.push(arg),
        }
    }
    Ok(out)
}

/// The path of a `--flagfile=PATH` argument (`Some("")` for a bare
/// `--flagfile`, which is an error), else `None`.
fn flagfile_value(arg: &str) -> Option<&str> {
    let rest = arg.trim().strip_prefix("--")?;
    let (name, value) = rest.split_once('=').unwrap_or((rest, ""));
    (name.trim() == "flagfile").then(|| value.trim())
}

fn expand_file(path: &str, out: &mut Vec<OsString>, depth: usize) -> Result<()> {
    if path.is_empty() {
        bail!(InvalidArgument, "--flagfile= requires a file path");
    }
    if depth >= MAX_DEPTH {
        bail!(
            InvalidArgument,
            "--flagfile={path}: flag files nested more than {MAX_DEPTH} deep (a flag file names itself?)"
        );
    }
    let text = std::fs::read_to_string(path).map_err(|e| {
        status!(
            NotFound,
            "while trying to parse flagfile: unable to read '{path}': {e}"
        )
    })?;
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with("//") {
            continue;
        }
        let Some(flag) = line.strip_prefix("--") else {
            bail!(
                InvalidArgument,
                "{path}:{}: positional arguments not allowed in flag files (got `{line}`)",
                index + 1
            );
        };
        let (name, value) = match flag.split_once('=') {
            Some((n, v)) => (n.trim(), Some(unquote(v.trim()))),
            None => (flag.trim(), None),
        };
        if name.is_empty() {
            bail!(
                InvalidArgument,
                "{path}:{}: a flag needs a name (got `{line}`)",
                index + 1
            );
        }
        if name == "flagfile" {
            expand_file(value.unwrap_or(""), out, depth + 1)
                .map_err(|e| e.annotate(format!("{path}:{}", index + 1)))?;
            continue;
        }
        out.push(match value {
            Some(v) => format!("--{name}={v}").into(),
            None => format!("--{name}").into(),
        });
    }
    Ok(())
}

/// `"text"` → `text` (only when quoted on both sides, as upstream).
fn unquote(v: &str) -> &str {
    if v.len() > 2 && v.starts_with('"') && v.ends_with('"') {
        &v[1..v.len() - 1]
    } else {
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: Vec<OsString>) -> Vec<String> {
        v.into_iter().map(|s| s.into_string().unwrap()).collect()
    }

    fn expand(args: &[&str]) -> Result<Vec<String>> {
        expand_flagfiles(args.iter().map(OsString::from).collect()).map(strings)
    }

    #[test]
    fn expands_in_place_with_comments_quotes_and_nesting() {
        let dir = std::env::temp_dir().join(format!("ferrite-flagfile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let inner = dir.join("inner.flags");
        std::fs::write(&inner, "--input=2\n").unwrap();
        let outer = dir.join("outer.flags");
        std::fs::write(
            &outer,
            format!(
                "# weights\n\n  --function = \"main\"  \n// more\n--input=1\n--flagfile={}\n--list_drivers\n",
                inner.display()
            ),
        )
        .unwrap();
        let got = expand(&[
            "ferrite",
            "run-module",
            &format!("--flagfile={}", outer.display()),
            "--input=3",
        ])
        .unwrap();
        assert_eq!(
            got,
            [
                "ferrite",
                "run-module",
                "--function=main",
                "--input=1",
                "--input=2",
                "--list_drivers",
                "--input=3"
            ]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn errors_name_the_file_and_line() {
        let dir = std::env::temp_dir().join(format!("ferrite-flagfile-e-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bad = dir.join("bad.flags");
        std::fs::write(&bad, "--a=1\nmodule.vmfb\n").unwrap();
        let e = expand(&["t", &format!("--flagfile={}", bad.display())]).unwrap_err();
        assert!(
            e.to_string().contains("bad.flags:2: positional arguments"),
            "{e}"
        );
        let cycle = dir.join("cycle.flags");
        std::fs::write(&cycle, format!("--flagfile={}\n", cycle.display())).unwrap();
        let e = expand(&["t", &format!("--flagfile={}", cycle.display())]).unwrap_err();
        assert!(e.to_string().contains("nested more than"), "{e}");
        let e = expand(&["t", "--flagfile"]).unwrap_err();
        assert!(e.to_string().contains("requires a file path"), "{e}");
        let e = expand(&["t", "--flagfile=/nonexistent/x.flags"]).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/x.flags"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
