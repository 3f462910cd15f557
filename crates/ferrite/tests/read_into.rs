//! `DeviceTensor::read_into`: a device tensor's elements copied into a
//! buffer the caller reuses, with its element type and count checked.

use ferrite::{Instance, Session, StatusCode, Tensor};

fn session() -> Session {
    Session::new(&Instance::new(), "local-sync").expect("local-sync session")
}

#[test]
fn reads_the_elements_into_a_reused_buffer() {
    let s = session();
    let mut buf = vec![0.0f32; 6];
    for k in 0..3 {
        let values: Vec<f32> = (0..6).map(|i| (i * 10 + k) as f32 - 2.5).collect();
        let t = s
            .upload(&Tensor::from_f32(&[2, 3], &values).unwrap())
            .unwrap();
        t.read_into(&mut buf).unwrap();
        assert_eq!(buf, values);
    }
    let ints = s
        .upload(&Tensor::from_i32(&[3], &[7, -8, 9]).unwrap())
        .unwrap();
    let mut out = [0i32; 3];
    ints.read_into(&mut out).unwrap();
    assert_eq!(out, [7, -8, 9]);
}

#[test]
fn refuses_a_wrong_count_or_element_type() {
    let s = session();
    let t = s
        .upload(&Tensor::from_f32(&[2, 3], &[1.0; 6]).unwrap())
        .unwrap();
    let e = t.read_into(&mut [0.0f32; 5]).unwrap_err();
    assert_eq!(e.code(), StatusCode::InvalidArgument, "{e}");
    assert!(e.to_string().contains("into 5 elements"), "{e}");
    let e = t.read_into(&mut [0.0f32; 7]).unwrap_err();
    assert_eq!(e.code(), StatusCode::InvalidArgument, "{e}");
    let e = t.read_into(&mut [0i32; 6]).unwrap_err();
    assert_eq!(e.code(), StatusCode::InvalidArgument, "{e}");
    assert!(e.to_string().contains("cannot be read as"), "{e}");
}
