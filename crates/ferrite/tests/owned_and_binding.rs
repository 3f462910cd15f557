//! Owned function handles, device tensors and `IoBinding` (issue 30): a
//! struct can hold a function without the session, and repeated calls can
//! keep their inputs and outputs on the device.

mod common;

use std::path::PathBuf;
use std::sync::OnceLock;

use ferrite::{Instance, OwnedFunction, Session, StatusCode, Tensor, Value};

const PROGRAM: &str = r#"
func.func @add(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %c = arith.addf %a, %b : tensor<4xf32>
  return %c : tensor<4xf32>
}

func.func @mul(%a: i32, %b: i64) -> i64 {
  %a64 = arith.extsi %a : i32 to i64
  %c = arith.muli %a64, %b : i64
  return %c : i64
}
"#;

fn program() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| common::compile("owned_binding", PROGRAM))
}

fn session(device: &str) -> Session {
    let mut s = Session::new(&Instance::new(), device).unwrap();
    s.load_file(program()).unwrap();
    s
}

fn f32s(v: &Value) -> Vec<f32> {
    v.as_tensor().unwrap().to_f32_vec().unwrap()
}

/// What a user's struct looks like: only the handle, no session, no
/// lifetime.
struct Adder {
    add: OwnedFunction,
}

impl Adder {
    fn new(device: &str) -> Adder {
        // The session is dropped at the end of this function.
        Adder {
            add: session(device).function_owned("add").unwrap(),
        }
    }

    fn add(&self, a: [f32; 4], b: [f32; 4]) -> Vec<f32> {
        let a = Tensor::from_f32(&[4], &a).unwrap();
        let b = Tensor::from_f32(&[4], &b).unwrap();
        f32s(&self.add.call(&[a.into(), b.into()]).unwrap()[0])
    }
}

#[test]
fn owned_handles_outlive_the_session_and_cross_threads() {
    fn send_sync<T: Send + Sync + Clone + 'static>() {}
    send_sync::<OwnedFunction>();
    for device in ["local-sync", "local-task"] {
        let adder = Adder::new(device);
        assert_eq!(
            adder.add([1.0, 2.0, 3.0, 4.0], [10.0; 4]),
            [11.0, 12.0, 13.0, 14.0]
        );
        assert_eq!(adder.add.name(), "module.add");
        assert_eq!((adder.add.arg_count(), adder.add.result_count()), (2, 1));
        let threads: Vec<_> = (0..4)
            .map(|i| {
                let f = adder.add.clone();
                std::thread::spawn(move || {
                    let a = Tensor::from_f32(&[4], &[i as f32; 4]).unwrap();
                    f32s(&f.call(&[a.clone().into(), a.into()]).unwrap()[0])
                })
            })
            .collect();
        for (i, t) in threads.into_iter().enumerate() {
            assert_eq!(t.join().unwrap(), vec![2.0 * i as f32; 4]);
        }
    }
}

#[test]
fn owned_handles_check_arguments_as_borrowed_ones() {
    let s = session("local-sync");
    let mul = s.function("mul").unwrap().to_owned();
    assert_eq!(
        mul.call(&[Value::I32(6), Value::I64(7)]).unwrap()[0].as_i64(),
        Some(42)
    );
    let e = mul.call(&[Value::I32(6)]).unwrap_err();
    assert_eq!(e.code(), StatusCode::InvalidArgument);
    assert!(
        e.to_string().contains("takes 2 argument(s) (i32, i64)"),
        "{e}"
    );
}

#[test]
fn loading_waits_until_owned_handles_are_gone() {
    let mut s = session("local-sync");
    let add = s.function_owned("add").unwrap();
    let e = s.load_file(program()).unwrap_err();
    assert_eq!(e.code(), StatusCode::FailedPrecondition);
    assert!(e.to_string().contains("owned function handles"), "{e}");
    drop(add);
    // Nothing half-registered: the session loads once the handle is gone,
    // and borrowed handles never block it.
    s.load_file(program()).unwrap();
    assert!(s.function("add").is_ok());
}

#[test]
fn io_binding_keeps_inputs_and_outputs_on_the_device() {
    for device in ["local-sync", "local-task"] {
        let s = session(device);
        let state = s
            .upload(&Tensor::from_f32(&[4], &[1.0, 2.0, 3.0, 4.0]).unwrap())
            .unwrap();
        assert_eq!(state.shape(), &[4]);
        let mut b = s.io_binding("add").unwrap();
        let e = b.run().unwrap_err();
        assert_eq!(e.code(), StatusCode::FailedPrecondition);
        assert!(e.to_string().contains("argument 0"), "{e}");
        b.bind_input(0, &state).unwrap();
        // A host tensor is copied once, at binding.
        b.bind_input(1, Tensor::from_f32(&[4], &[0.5; 4]).unwrap())
            .unwrap();
        b.run().unwrap();
        assert_eq!(f32s(&b.output(0).unwrap()), [1.5, 2.5, 3.5, 4.5]);

        // The bound device tensor is the buffer itself: writing it in place
        // changes what the next run reads, without binding again.
        state
            .write(&Tensor::from_f32(&[4], &[10.0, 20.0, 30.0, 40.0]).unwrap())
            .unwrap();
        b.run().unwrap();
        assert_eq!(f32s(&b.output(0).unwrap()), [10.5, 20.5, 30.5, 40.5]);

        // An output fed back as the next input never leaves the device.
        for _ in 0..3 {
            b.bind_output_to_input(0, 0).unwrap();
            b.run().unwrap();
        }
        assert_eq!(f32s(&b.output(0).unwrap()), [12.0, 22.0, 32.0, 42.0]);
        let out = b.output_tensor(0).unwrap();
        assert_eq!(
            out.to_host().unwrap().to_f32_vec().unwrap(),
            [12.0, 22.0, 32.0, 42.0]
        );
        // A device output passed to an ordinary call goes as it is.
        let again = s
            .function("add")
            .unwrap()
            .call(&[out.clone().into(), (&out).into()]);
        assert_eq!(f32s(&again.unwrap()[0]), [24.0, 44.0, 64.0, 84.0]);
        assert_eq!(b.outputs().unwrap().len(), 1);
    }
}

#[test]
fn io_binding_errors_name_what_is_wrong() {
    let s = session("local-sync");
    let mut b = s.io_binding("mul").unwrap();
    let e = b.output(0).unwrap_err();
    assert_eq!(e.code(), StatusCode::OutOfRange);
    assert!(e.to_string().contains("nothing has run yet"), "{e}");
    let e = b.bind_input(2, 1i64).unwrap_err();
    assert_eq!(e.code(), StatusCode::OutOfRange);
    let e = b.bind_input(0, 1.5f32).unwrap_err();
    assert_eq!(e.code(), StatusCode::InvalidArgument);
    assert!(
        e.to_string()
            .contains("argument 0 of 'module.mul' must be an i32"),
        "{e}"
    );
    b.bind_input(0, 6).unwrap();
    b.bind_input(1, 7i64).unwrap();
    b.run().unwrap();
    assert_eq!(b.output(0).unwrap().as_i64(), Some(42));
    // The i64 output can feed the i64 argument, not the i32 one.
    b.bind_output_to_input(0, 1).unwrap();
    b.run().unwrap();
    assert_eq!(b.output(0).unwrap().as_i64(), Some(252));
    let e = b.bind_output_to_input(0, 0).unwrap_err();
    assert_eq!(e.code(), StatusCode::InvalidArgument);
    let e = b.output_tensor(0).unwrap_err();
    assert_eq!(e.code(), StatusCode::InvalidArgument);
    // Writing a tensor of another shape into a device tensor is refused.
    let t = s
        .upload(&Tensor::from_f32(&[4], &[0.0; 4]).unwrap())
        .unwrap();
    let e = t
        .write(&Tensor::from_f32(&[2], &[0.0; 2]).unwrap())
        .unwrap_err();
    assert_eq!(e.code(), StatusCode::InvalidArgument);
}
