//! The facade end to end: a tiny program compiled at test time with the
//! pinned compiler, called through `Session`/`Function` on each device.

mod common;

use std::path::PathBuf;
use std::sync::OnceLock;

use ferrite::{Instance, Session, StatusCode, Tensor, Value};

const PROGRAM: &str = r#"
func.func @add(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %c = arith.addf %a, %b : tensor<4xf32>
  return %c : tensor<4xf32>
}

func.func @scale(%a: tensor<?xf32>, %s: f32) -> (tensor<?xf32>, i32) {
  %c0 = arith.constant 0 : index
  %n = tensor.dim %a, %c0 : tensor<?xf32>
  %e = tensor.empty(%n) : tensor<?xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>],
                       iterator_types = ["parallel"]}
      ins(%a : tensor<?xf32>) outs(%e : tensor<?xf32>) {
  ^bb0(%x: f32, %o: f32):
    %y = arith.mulf %x, %s : f32
    linalg.yield %y : f32
  } -> tensor<?xf32>
  %ni = arith.index_cast %n : index to i32
  return %r, %ni : tensor<?xf32>, i32
}

func.func @sum_i32(%a: tensor<2x3xi32>) -> tensor<3xi32> {
  %z = arith.constant 0 : i32
  %e = tensor.empty() : tensor<3xi32>
  %f = linalg.fill ins(%z : i32) outs(%e : tensor<3xi32>) -> tensor<3xi32>
  %r = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d1)>],
                       iterator_types = ["reduction", "parallel"]}
      ins(%a : tensor<2x3xi32>) outs(%f : tensor<3xi32>) {
  ^bb0(%x: i32, %acc: i32):
    %y = arith.addi %x, %acc : i32
    linalg.yield %y : i32
  } -> tensor<3xi32>
  return %r : tensor<3xi32>
}

func.func @mul(%a: i32, %b: i64) -> i64 {
  %a64 = arith.extsi %a : i32 to i64
  %c = arith.muli %a64, %b : i64
  return %c : i64
}
"#;

fn program() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| common::compile("facade_add", PROGRAM))
}

fn session(device: &str) -> Session {
    let mut s = Session::new(&Instance::new(), device).unwrap();
    assert_eq!(s.load_file(program()).unwrap(), "module");
    s
}

#[test]
fn add_on_every_device() {
    for device in ["local-sync", "local-task", "local-task://?workers=2"] {
        let s = session(device);
        let add = s.function("add").unwrap();
        assert_eq!((add.arg_count(), add.result_count()), (2, 1));
        assert_eq!(add.name(), "module.add");
        let a = Tensor::from_f32(&[4], &[1.0, 2.0, 3.0, 4.0]).unwrap();
        let b = Tensor::from_f32(&[4], &[10.0, 20.0, 30.0, 0.5]).unwrap();
        let r = add.call(&[a.into(), b.into()]).unwrap();
        assert_eq!(r.len(), 1);
        let t = r[0].as_tensor().unwrap();
        assert_eq!(t.shape(), &[4]);
        assert_eq!(
            t.to_f32_vec().unwrap(),
            vec![11.0, 22.0, 33.0, 4.5],
            "{device}"
        );
        // Calling again reuses the function.
        let r = add
            .call(&[
                Tensor::from_f32(&[4], &[0.0; 4]).unwrap().into(),
                Tensor::from_f32(&[4], &[-1.0; 4]).unwrap().into(),
            ])
            .unwrap();
        assert_eq!(
            r[0].as_tensor().unwrap().to_f32_vec().unwrap(),
            vec![-1.0; 4]
        );
    }
}

#[test]
fn dynamic_shapes_scalars_and_several_results() {
    let s = session("local-task");
    let r = s
        .call(
            "module.scale",
            &[
                Tensor::from_f32(&[5], &[1.0, 2.0, 3.0, 4.0, 5.0])
                    .unwrap()
                    .into(),
                Value::F32(2.0),
            ],
        )
        .unwrap();
    assert_eq!(r.len(), 2);
    assert_eq!(
        r[0].as_tensor().unwrap().to_f32_vec().unwrap(),
        vec![2.0, 4.0, 6.0, 8.0, 10.0]
    );
    assert_eq!(r[1].as_i32(), Some(5));

    let r = s
        .call(
            "sum_i32",
            &[Tensor::from_i32(&[2, 3], &[1, 2, 3, 10, 20, 30])
                .unwrap()
                .into()],
        )
        .unwrap();
    assert_eq!(
        r[0].as_tensor().unwrap().to_i32_vec().unwrap(),
        vec![11, 22, 33]
    );

    let r = s
        .call("mul", &[Value::I32(-3), Value::I64(1 << 40)])
        .unwrap();
    assert_eq!(r[0].as_i64(), Some(-3 << 40));
}

#[test]
fn loads_from_bytes_and_static() {
    let bytes = std::fs::read(program()).unwrap();
    let mut s = Session::new(&Instance::new(), "local-sync").unwrap();
    s.load_bytes(bytes.clone()).unwrap();
    let r = s.call("mul", &[Value::I32(6), Value::I64(7)]).unwrap();
    assert_eq!(r[0].as_i64(), Some(42));
    let leaked: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    let mut s = Session::with_devices(&Instance::new(), &["local-sync", "local-task"]).unwrap();
    assert_eq!(s.devices().len(), 2);
    s.load_static(leaked).unwrap();
    let r = s.call("mul", &[Value::I32(2), Value::I64(21)]).unwrap();
    assert_eq!(r[0].as_i64(), Some(42));
}

#[test]
fn clear_errors() {
    let s = session("local-sync");
    let e = s.function("nope").unwrap_err();
    assert_eq!(e.code(), StatusCode::NotFound);
    assert!(e.to_string().contains("nope"), "{e}");

    let add = s.function("add").unwrap();
    let e = add.call(&[Value::F32(1.0)]).unwrap_err();
    assert_eq!(e.code(), StatusCode::InvalidArgument);
    assert!(
        e.to_string()
            .contains("takes 2 argument(s) (ref, ref) but 1 were passed"),
        "{e}"
    );

    let e = add.call(&[Value::F32(1.0), Value::F32(2.0)]).unwrap_err();
    assert!(
        e.to_string()
            .contains("argument 0 of 'module.add' must be a tensor or ref but a f32 was passed"),
        "{e}"
    );

    // The program itself checks shapes (hal.buffer_view.assert).
    let small = Tensor::from_f32(&[3], &[1.0; 3]).unwrap();
    let e = add.call(&[small.clone().into(), small.into()]).unwrap_err();
    assert!(e.to_string().contains("shape"), "{e}");

    let e = s
        .call("mul", &[Value::F32(1.0), Value::I64(1)])
        .unwrap_err();
    assert!(e.to_string().contains("must be an i32"), "{e}");

    let e = Session::new(&Instance::new(), "vulkan").unwrap_err();
    assert_eq!(e.code(), StatusCode::NotFound);

    let mut vm_only = Session::without_devices(&Instance::new());
    let e = vm_only.load_file(program()).unwrap_err();
    assert_eq!(e.code(), StatusCode::FailedPrecondition);
    assert!(e.to_string().contains("no device"), "{e}");

    let mut s = Session::new(&Instance::new(), "local-sync").unwrap();
    let e = s.load_bytes(b"not a module".to_vec()).unwrap_err();
    assert!(!e.to_string().is_empty());
    let e = s.load_file("/nonexistent/x.vmfb").unwrap_err();
    assert!(e.to_string().contains("/nonexistent/x.vmfb"), "{e}");
}
