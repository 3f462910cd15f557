//! The committed digits example (`examples/digits`): Ferrite's predictions
//! match the training script's float32 reference and, bit for bit, upstream
//! `iree-run-module` on the same `.vmfb` and inputs.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use ferrite::{Instance, Session, Tensor, Value};

fn dir() -> PathBuf {
    common::root().join("examples/digits")
}

fn images() -> Tensor {
    ferrite_tooling::npy::read_tensor(dir().join("test_images.npy")).unwrap()
}

fn session(device: &str) -> Session {
    let mut s = Session::new(&Instance::new(), device).unwrap();
    s.load_file(dir().join("digits.vmfb")).unwrap();
    s
}

fn call1(s: &Session, f: &str, x: &Tensor) -> Tensor {
    s.call(f, &[Value::from(x.clone())]).unwrap()[0]
        .as_tensor()
        .unwrap()
        .clone()
}

fn metric(key: &str) -> String {
    let text = std::fs::read_to_string(dir().join("metrics.txt")).unwrap();
    text.lines()
        .filter_map(|l| l.split_once('='))
        .find(|(k, _)| *k == key)
        .unwrap_or_else(|| panic!("metrics.txt has no {key}"))
        .1
        .to_string()
}

#[test]
fn predictions_match_the_training_reference() {
    let x = images();
    let labels = ferrite_tooling::npy::read_tensor(dir().join("test_labels.npy"))
        .unwrap()
        .to_i32_vec()
        .unwrap();
    let reference = ferrite_tooling::npy::read_tensor(dir().join("test_predictions.npy"))
        .unwrap()
        .to_i32_vec()
        .unwrap();
    let want_correct: usize = metric("numpy_f32_test_correct").parse().unwrap();
    for device in ["local-sync", "local-task"] {
        let s = session(device);
        let p = call1(&s, "predict", &x).to_i32_vec().unwrap();
        assert_eq!(p, reference, "{device}");
        let correct = p.iter().zip(&labels).filter(|(a, b)| a == b).count();
        assert_eq!(correct, want_correct, "{device}");
        // Batches of other sizes (dynamic batch dimension) and single images.
        let pixels = x.to_f32_vec().unwrap();
        for n in [1usize, 5, 17] {
            let b = Tensor::from_f32(&[n as u64, 64], &pixels[..n * 64]).unwrap();
            assert_eq!(
                call1(&s, "predict", &b).to_i32_vec().unwrap(),
                &reference[..n],
                "{device} n={n}"
            );
        }
        for i in 0..8 {
            let img = Tensor::from_f32(&[64], &pixels[i * 64..(i + 1) * 64]).unwrap();
            let r = s.call("predict_one", &[img.into()]).unwrap();
            assert_eq!(r[0].as_i32(), Some(reference[i]), "{device} image {i}");
        }
    }
}

/// Runs upstream's `iree-run-module` on `function` with the test images and
/// returns its one result, written with `--output=@file.npy`.
fn upstream(function: &str, out: &Path) -> Tensor {
    let tool = common::tool("iree-run-module");
    let output = Command::new(&tool)
        .arg(format!("--module={}", dir().join("digits.vmfb").display()))
        .arg(format!("--function={function}"))
        .arg(format!(
            "--input=@{}",
            dir().join("test_images.npy").display()
        ))
        .arg(format!("--output=@{}", out.display()))
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", tool.display()));
    assert!(
        output.status.success(),
        "iree-run-module failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    ferrite_tooling::npy::read_tensor(out).unwrap()
}

#[test]
fn same_results_as_upstream_iree_run_module() {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ferrite-digits");
    std::fs::create_dir_all(&tmp).unwrap();
    let x = images();
    let want_pred = upstream("predict", &tmp.join("predict.npy"));
    let want_logits = upstream("logits", &tmp.join("logits.npy"));
    assert_eq!(want_pred.shape(), &[360]);
    assert_eq!(want_logits.shape(), &[360, 10]);
    for device in ["local-sync", "local-task"] {
        let s = session(device);
        let pred = call1(&s, "predict", &x);
        assert_eq!(
            pred.to_i32_vec().unwrap(),
            want_pred.to_i32_vec().unwrap(),
            "{device}"
        );
        let logits = call1(&s, "logits", &x);
        assert_eq!(logits.shape(), want_logits.shape());
        // Same kernels on the same CPU: bit-for-bit equal.
        assert_eq!(
            logits.data(),
            want_logits.data(),
            "{device}: logits differ from upstream"
        );
    }
}

/// The program's constants (41.6 KB of weights, 64-byte aligned in the
/// `.vmfb`) are used in place from the mapped file: the device allocator
/// never allocates room for a copy of them.
#[test]
fn constants_are_used_in_place_from_the_mapped_file() {
    // Loading runs the module initializer, which imports the constants.
    let s = session("local-sync");
    let stats = s.devices()[0].hal().0.allocator().statistics();
    let allocated = stats.host_bytes_allocated + stats.device_bytes_allocated;
    eprintln!("device allocator: {allocated} bytes allocated ({stats:?})");
    assert!(
        allocated < 9472,
        "{allocated} bytes allocated: the constants (9472 + 32144 bytes) were copied"
    );
}
