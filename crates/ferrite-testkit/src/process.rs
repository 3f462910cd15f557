//! Running a tool (ours or upstream's) with a time limit.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What a finished program left: exit code (`None` when killed by a
/// signal) and its output as text.
#[derive(Debug, Clone)]
pub struct Output {
    /// The exit code, `None` when a signal ended the program.
    pub code: Option<i32>,
    /// Everything written to stdout (lossily decoded).
    pub stdout: String,
    /// Everything written to stderr (lossily decoded).
    pub stderr: String,
}

impl Output {
    /// Whether the program exited with code 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

fn drain(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut v = Vec::new();
        // A read error leaves what was read so far: the exit code still
        // tells whether the program worked.
        let _ = pipe.read_to_end(&mut v);
        v
    })
}

/// Runs `cmd` (stdin closed) and waits at most `timeout`; a program still
/// running then is killed and the test fails naming it. The output pipes are
/// drained on threads so a program writing a lot never blocks on them.
pub fn run_command(cmd: &mut Command, timeout: Duration) -> Output {
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    let out = drain(child.stdout.take().expect("stdout is piped"));
    let err = drain(child.stderr.take().expect("stderr is piped"));
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if start.elapsed() > timeout => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{what} did not finish within {timeout:?}");
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => panic!("waiting for {what}: {e}"),
        }
    };
    let text = |h: std::thread::JoinHandle<Vec<u8>>| {
        String::from_utf8_lossy(&h.join().expect("pipe reader thread")).into_owned()
    };
    Output {
        code: status.code(),
        stdout: text(out),
        stderr: text(err),
    }
}

/// Runs `program` with `args` through [`run_command`].
pub fn run_program<S: AsRef<std::ffi::OsStr>>(
    program: &std::path::Path,
    args: &[S],
    timeout: Duration,
) -> Output {
    run_command(Command::new(program).args(args), timeout)
}
