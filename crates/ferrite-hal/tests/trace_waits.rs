//! Semaphore and fence waits in the execution trace (`ferrite_base::trace`):
//! a wait that blocked is a span on the waiting thread naming the thread
//! and queue operation that woke it, or the failure it ended with. One test
//! per binary: the recording is process-wide.

use ferrite_base::trace::{self, Arg};
use ferrite_base::{Status, StatusCode, Timeout};
use ferrite_hal::{Fence, Semaphore};
use std::time::Duration;

fn arg<'a>(e: &'a trace::Event, key: &str) -> Option<&'a Arg> {
    e.args.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
}

#[test]
fn waits_name_what_woke_them() {
    trace::start().unwrap();
    // A single-semaphore wait woken by a named thread doing a named thing.
    let s = Semaphore::new(0);
    let s2 = s.clone();
    let signaller = std::thread::Builder::new()
        .name("test-signaller".into())
        .spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            let _doing = trace::set_doing("test queue op".into());
            s2.signal(1).unwrap();
        })
        .unwrap();
    s.wait(1, Timeout::INFINITE).unwrap();
    signaller.join().unwrap();

    // A two-semaphore fence wait ended by a failure.
    let a = Semaphore::new(0);
    let b = Semaphore::new(0);
    let fence = Fence::create_at(a.clone(), 1);
    fence.insert(b.clone(), 1);
    let failer = std::thread::Builder::new()
        .name("test-failer".into())
        .spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            a.signal(1).unwrap();
            b.fail(Status::new(StatusCode::DataLoss, "the original failure"));
        })
        .unwrap();
    let err = fence.wait(Timeout::INFINITE).unwrap_err();
    failer.join().unwrap();
    assert_eq!(err.code(), StatusCode::DataLoss);

    let t = trace::stop().unwrap();
    let waits: Vec<&trace::Event> = t.events.iter().filter(|e| e.cat == "wait").collect();
    let sem = waits
        .iter()
        .find(|e| e.name == "semaphore wait")
        .expect("the semaphore wait blocked for 30 ms");
    assert_eq!(arg(sem, "value"), Some(&Arg::U64(1)));
    assert_eq!(
        arg(sem, "woken_by"),
        Some(&Arg::Str("test-signaller: test queue op".into()))
    );
    assert!(sem.dur_ns >= 10_000_000, "it waited: {} ns", sem.dur_ns);
    let fence_wait = waits
        .iter()
        .find(|e| e.name == "fence wait")
        .expect("the fence wait");
    let Some(Arg::Str(failed)) = arg(fence_wait, "failed") else {
        panic!("the failure is noted: {fence_wait:?}");
    };
    assert!(failed.contains("the original failure"), "{failed}");
    let Some(Arg::Str(woken)) = arg(fence_wait, "woken_by") else {
        panic!("who ended it is noted: {fence_wait:?}");
    };
    assert!(woken.contains("test-failer"), "{woken}");
    let json = t.to_chrome_json();
    assert!(json.contains("\"woken_by\":\"test-signaller: test queue op\""));
}
