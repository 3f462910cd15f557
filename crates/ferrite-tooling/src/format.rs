//! Printing values exactly as upstream's tools print them.

use ferrite_vm::Variant;

/// Formats like C's `printf("%g")` (6 significant digits), as upstream's
/// tools print scalar floats.
pub fn format_g(x: f64) -> String {
    ferrite_base::printf_float::format_g(x, 6)
}

/// Formats one function result as `i32=42`, `f32=2.5`, or for tensors
/// `hal.buffer_view` and the contents on the next line, as upstream prints.
pub fn format_result(v: &Variant, max_elements: usize) -> String {
    match v {
        Variant::Null => "(null)".to_string(),
        Variant::I32(x) => format!("i32={x}"),
        Variant::I64(x) => format!("i64={x}"),
        Variant::F32(x) => format!("f32={}", format_g(*x as f64)),
        Variant::F64(x) => format!("f64={}", format_g(*x)),
        Variant::Ref(r) => {
            if let Some(view) = r.downcast::<ferrite_hal::BufferView>() {
                match view.format(Some(max_elements)) {
                    Ok(text) => format!("hal.buffer_view\n{text}"),
                    Err(e) => format!("hal.buffer_view\n(unprintable: {e})"),
                }
            } else if let Some(b) = r.downcast::<ferrite_vm::buffer::VmBuffer>() {
                format!("!vm.buffer {} bytes", b.len())
            } else if let Some(l) = r.downcast::<ferrite_vm::list::VmList>() {
                format!("!vm.list<{}> size={}", l.element_type().name(), l.size())
            } else {
                format!("!{}", r.type_name())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::format_g;

    #[test]
    fn matches_printf_g() {
        assert_eq!(format_g(0.1), "0.1");
        assert_eq!(format_g(2.5), "2.5");
        assert_eq!(format_g(1.0 / 3.0), "0.333333");
        assert_eq!(format_g(1e300 / 3.0), "3.33333e+299");
        assert_eq!(format_g(123456789.0), "1.23457e+08");
        assert_eq!(format_g(1e-7), "1e-07");
        assert_eq!(format_g(3.33333e-8), "3.33333e-08");
        assert_eq!(format_g(41152263.0), "4.11523e+07");
        assert_eq!(format_g(100000.0), "100000");
        assert_eq!(format_g(999999.5), "1e+06");
        assert_eq!(format_g(0.0001), "0.0001");
        assert_eq!(format_g(f64::NEG_INFINITY), "-inf");
        assert_eq!(format_g(1.0), "1");
    }
}
