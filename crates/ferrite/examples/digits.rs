//! Classifies scikit-learn's 8x8 handwritten digits with a small MLP compiled
//! by the pinned IREE compiler (`examples/digits/digits.vmfb`), using only
//! the `ferrite` facade.
//!
//! ```text
//! cargo run --release -p ferrite --example digits [-- --device local-sync] [--dir examples/digits]
//! ```
//!
//! Reads the held-out test set (`test_images.npy`, `test_labels.npy`) and the
//! accuracy the training script measured (`metrics.txt`), predicts every
//! image in one call of `@predict`, prints a few predictions and the
//! accuracy, and exits non-zero when the accuracy differs from the training
//! script's.

use std::path::PathBuf;
use std::process::ExitCode;

use ferrite::{Instance, Session, Tensor, Value};

struct Args {
    device: String,
    dir: PathBuf,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        device: "local-task".into(),
        dir: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/digits"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let (key, inline) = match a.split_once('=') {
            Some((k, v)) => (k.to_string(), Some(v.to_string())),
            None => (a.clone(), None),
        };
        let mut value = |name: &str| {
            inline
                .clone()
                .or_else(|| it.next())
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match key.as_str() {
            "--device" => args.device = value("--device")?,
            "--dir" => args.dir = PathBuf::from(value("--dir")?),
            "--sync" => args.device = "local-sync".into(),
            "-h" | "--help" => {
                println!("usage: digits [--device local-task|local-sync|local-task://?workers=N] [--sync] [--dir DIR]");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument '{other}' (try --help)")),
        }
    }
    Ok(args)
}

/// `key=value` lines of `metrics.txt`.
fn metric(text: &str, key: &str) -> Option<String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .find(|(k, _)| k.trim() == key)
        .map(|(_, v)| v.trim().to_string())
}

/// An 8x8 image (values 0..1) as text, two characters per pixel.
fn render(pixels: &[f32]) -> String {
    const RAMP: &[u8] = b" .:-=+*#%@";
    let mut out = String::new();
    for row in pixels.chunks(8) {
        out.push_str("    |");
        for &p in row {
            let i = ((p.clamp(0.0, 1.0) * (RAMP.len() - 1) as f32).round()) as usize;
            let c = RAMP[i] as char;
            out.push(c);
            out.push(c);
        }
        out.push_str("|\n");
    }
    out
}

fn run(args: &Args) -> ferrite::Result<bool> {
    let images = ferrite_tooling::npy::read_tensor(args.dir.join("test_images.npy"))?;
    let labels =
        ferrite_tooling::npy::read_tensor(args.dir.join("test_labels.npy"))?.to_i32_vec()?;
    let metrics = std::fs::read_to_string(args.dir.join("metrics.txt"))?;
    let n = images.shape()[0] as usize;
    let pixels = images.to_f32_vec()?;

    let instance = Instance::new();
    let mut session = Session::new(&instance, &args.device)?;
    session.load_file(args.dir.join("digits.vmfb"))?;
    println!(
        "digits: {} on {}: {n} test images of 8x8 pixels",
        metric(&metrics, "model").unwrap_or_else(|| "model".into()),
        args.device
    );

    // All images in one call.
    let predict = session.function("predict")?;
    let results = predict.call(&[Value::from(images.clone())])?;
    let predictions = results[0]
        .as_tensor()
        .expect("predict returns a tensor")
        .to_i32_vec()?;
    assert_eq!(predictions.len(), n);

    // One image at a time, through the scalar-returning entry point.
    let predict_one = session.function("predict_one")?;
    println!("first 10 test images (predict_one, one call each):");
    println!("    index  true  predicted");
    for i in 0..10.min(n) {
        let img = Tensor::from_f32(&[64], &pixels[i * 64..(i + 1) * 64])?;
        let p = predict_one.call(&[img.into()])?[0]
            .as_i32()
            .expect("predict_one returns an i32");
        assert_eq!(
            p, predictions[i],
            "predict_one and predict disagree on image {i}"
        );
        let mark = if p == labels[i] { "" } else { "  <- wrong" };
        println!("    {i:>5}  {:>4}  {p:>9}{mark}", labels[i]);
    }

    println!(
        "image 0 (true {}, predicted {}):",
        labels[0], predictions[0]
    );
    print!("{}", render(&pixels[..64]));
    let wrong: Vec<usize> = (0..n).filter(|&i| predictions[i] != labels[i]).collect();
    if let Some(&i) = wrong.first() {
        println!(
            "first misclassified: image {i} (true {}, predicted {}):",
            labels[i], predictions[i]
        );
        print!("{}", render(&pixels[i * 64..(i + 1) * 64]));
    }

    let correct = n - wrong.len();
    let accuracy = correct as f64 / n as f64;
    println!("ferrite accuracy: {correct}/{n} = {accuracy:.4}");
    let reference = metric(&metrics, "numpy_f32_test_accuracy").and_then(|v| v.parse::<f64>().ok());
    let sklearn = metric(&metrics, "sklearn_test_accuracy").and_then(|v| v.parse::<f64>().ok());
    if let Some(s) = sklearn {
        println!("scikit-learn accuracy (train.py, f64): {s:.4}");
    }
    match reference {
        Some(r) => {
            println!("numpy f32 accuracy (train.py): {r:.4}");
            let same = (r - accuracy).abs() < 5e-7;
            println!("{}", if same { "match: yes" } else { "match: NO" });
            Ok(same)
        }
        None => {
            eprintln!("digits: metrics.txt has no numpy_f32_test_accuracy");
            Ok(false)
        }
    }
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("digits: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("digits: {e}");
            ExitCode::FAILURE
        }
    }
}
