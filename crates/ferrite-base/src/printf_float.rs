//! printf-compatible float formatting: upstream's tools print floats with
//! `printf("%g")`-style formats, so Ferrite's output matches theirs byte for
//! byte only if it formats the same way.

/// Formats like C's `printf("%.{precision}g")`: `precision` significant
/// digits, trailing zeros trimmed, scientific notation when the exponent is
/// below -4 or at least `precision`; `nan`/`-nan`, `inf`/`-inf`, `-0`.
pub fn format_g(v: f64, precision: usize) -> String {
    if v.is_nan() {
        return if v.is_sign_negative() { "-nan" } else { "nan" }.into();
    }
    if v.is_infinite() {
        return if v < 0.0 { "-inf" } else { "inf" }.into();
    }
    if v == 0.0 {
        return if v.is_sign_negative() { "-0" } else { "0" }.into();
    }
    let precision = precision.max(1);
    // Rounding to `precision` digits first decides the exponent (999999.5
    // becomes 1e+06 at precision 6).
    let sci = format!("{:.*e}", precision - 1, v);
    let (mant, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if exp < -4 || exp >= precision as i32 {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{}e{sign}{:02}", trim_zeros(mant), exp.abs())
    } else {
        let decimals = (precision as i32 - 1 - exp).max(0) as usize;
        trim_zeros(&format!("{v:.decimals$}")).to_string()
    }
}

fn trim_zeros(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::format_g;

    #[test]
    fn matches_printf() {
        assert_eq!(format_g(0.1, 6), "0.1");
        assert_eq!(format_g(1.0 / 3.0, 6), "0.333333");
        assert_eq!(format_g(1e300 / 3.0, 6), "3.33333e+299");
        assert_eq!(format_g(123456789.0, 6), "1.23457e+08");
        assert_eq!(format_g(1e-7, 6), "1e-07");
        assert_eq!(format_g(100000.0, 6), "100000");
        assert_eq!(format_g(999999.5, 6), "1e+06");
        assert_eq!(format_g(0.0001, 6), "0.0001");
        assert_eq!(format_g(f64::NEG_INFINITY, 6), "-inf");
        assert_eq!(format_g(-0.0, 9), "-0");
        assert_eq!(format_g(107.5, 9), "107.5");
        assert_eq!(format_g(0.000999500277, 9), "0.000999500277");
    }
}
