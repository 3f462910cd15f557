//! Sessions serve parameters to programs: a file added under a scope, or a
//! provider over host memory, feeds `tests/parameters/affine.mlir`
//! (y = x * w + b with `w`, `b` in scope "model").

mod common;

use std::sync::Arc;

use ferrite::parameters::formats::irpa;
use ferrite::parameters::{FileHandle, ParameterIndex, ParameterProvider};
use ferrite::{Instance, Session, StatusCode, Tensor, Value};
use ferrite_testkit::f32_bytes;

fn index() -> ParameterIndex {
    let mut index = ParameterIndex::new();
    let h = FileHandle::from_shared(Arc::new(f32_bytes(&[2.0, 3.0, 4.0, 5.0])), "w");
    index.add_file("w", &h, 0, 16, Vec::new()).unwrap();
    index
        .add_splat("b", &1.0f32.to_le_bytes(), 16, Vec::new())
        .unwrap();
    index
}

fn run(session: &Session) -> Vec<f32> {
    let x = Tensor::from_f32(&[4], &[1.0, 2.0, 3.0, 4.0]).unwrap();
    let out = session.call("main", &[Value::Tensor(x)]).unwrap();
    out[0].as_tensor().unwrap().to_f32_vec().unwrap()
}

#[test]
fn files_and_providers_serve_parameters() {
    let src = std::fs::read_to_string(common::root().join("tests/parameters/affine.mlir")).unwrap();
    let program = common::compile("parameters_affine", &src);

    let path = std::env::temp_dir().join(format!("ferrite-facade-{}.irpa", std::process::id()));
    irpa::save_archive_file(&index(), &path).unwrap();
    let mut s = Session::new(&Instance::new(), "local-sync").unwrap();
    s.add_parameter_file("model", &path).unwrap();
    s.load_file(&program).unwrap();
    assert_eq!(run(&s), [3.0, 7.0, 13.0, 21.0]);
    let e = s.add_parameter_file("model", &path).unwrap_err();
    assert_eq!(e.code(), StatusCode::FailedPrecondition);
    std::fs::remove_file(&path).ok();

    let mut s = Session::new(&Instance::new(), "local-task").unwrap();
    s.add_parameter_provider(ParameterProvider::new("model", index()))
        .unwrap();
    s.load_file(&program).unwrap();
    assert_eq!(run(&s), [3.0, 7.0, 13.0, 21.0]);

    // Without parameters the program's initializer fails naming the scope.
    let mut s = Session::new(&Instance::new(), "local-sync").unwrap();
    let e = s.load_file(&program).unwrap_err();
    assert_eq!(e.code(), StatusCode::NotFound);
    assert!(e.to_string().contains("scopes like 'model'"), "{e}");
}
