//! Numeric helpers shared by buffer-view printing and parsing: conversions
//! between `f32` and the narrow float formats (f16, bf16, the f8 family),
//! C `printf("%g")`-style formatting, and number parsing with the leniency
//! of C's `strtol`/`strtoul`/`strtof` (what upstream's tools accept).

/// A narrow binary floating-point format described by its bit layout.
#[derive(Clone, Copy, Debug)]
struct SmallFloat {
    exp_bits: u32,
    mantissa_bits: u32,
    has_inf: bool,
    has_nan: bool,
    /// Added to the IEEE-style bias (the FNUZ formats use 1).
    bias_tweak: i32,
    /// NaN is encoded as the negative-zero bit pattern (FNUZ formats).
    nan_is_neg_zero: bool,
}

const F16: SmallFloat = SmallFloat {
    exp_bits: 5,
    mantissa_bits: 10,
    has_inf: true,
    has_nan: true,
    bias_tweak: 0,
    nan_is_neg_zero: false,
};
const BF16: SmallFloat = SmallFloat {
    exp_bits: 8,
    mantissa_bits: 7,
    has_inf: true,
    has_nan: true,
    bias_tweak: 0,
    nan_is_neg_zero: false,
};
const F8E5M2: SmallFloat = SmallFloat {
    exp_bits: 5,
    mantissa_bits: 2,
    has_inf: true,
    has_nan: true,
    bias_tweak: 0,
    nan_is_neg_zero: false,
};
const F8E4M3FN: SmallFloat = SmallFloat {
    exp_bits: 4,
    mantissa_bits: 3,
    has_inf: false,
    has_nan: true,
    bias_tweak: 0,
    nan_is_neg_zero: false,
};
const F8E5M2FNUZ: SmallFloat = SmallFloat {
    exp_bits: 5,
    mantissa_bits: 2,
    has_inf: false,
    has_nan: true,
    bias_tweak: 1,
    nan_is_neg_zero: true,
};
const F8E4M3FNUZ: SmallFloat = SmallFloat {
    exp_bits: 4,
    mantissa_bits: 3,
    has_inf: false,
    has_nan: true,
    bias_tweak: 1,
    nan_is_neg_zero: true,
};

impl SmallFloat {
    fn bias(self) -> i32 {
        (1 << (self.exp_bits - 1)) - 1 + self.bias_tweak
    }
    fn sign_bit(self) -> u32 {
        1 << (self.exp_bits + self.mantissa_bits)
    }
    fn exp_field_max(self) -> u32 {
        (1 << self.exp_bits) - 1
    }
    fn mantissa_mask(self) -> u32 {
        (1 << self.mantissa_bits) - 1
    }

    fn decode(self, bits: u32) -> f32 {
        let sign = if bits & self.sign_bit() != 0 {
            -1.0f32
        } else {
            1.0
        };
        let exp = (bits >> self.mantissa_bits) & self.exp_field_max();
        let mant = bits & self.mantissa_mask();
        if exp == self.exp_field_max() {
            if self.has_inf {
                return if self.has_nan && mant != 0 {
                    f32::NAN
                } else {
                    sign * f32::INFINITY
                };
            }
            if self.has_nan && !self.nan_is_neg_zero && mant == self.mantissa_mask() {
                return f32::NAN;
            }
        } else if self.nan_is_neg_zero && bits == self.sign_bit() {
            return f32::NAN;
        } else if exp == 0 {
            let e = 1 - self.bias() - self.mantissa_bits as i32;
            return sign * (mant as f64 * 2f64.powi(e)) as f32;
        }
        let e = exp as i32 - self.bias() - self.mantissa_bits as i32;
        sign * ((mant + (1 << self.mantissa_bits)) as f64 * 2f64.powi(e)) as f32
    }

    /// Rounds to nearest-even; overflow gives inf, else NaN, else the max
    /// finite value, depending on what the format can encode.
    fn encode(self, value: f32) -> u32 {
        let u = value.to_bits();
        let sign = if u >> 31 != 0 { self.sign_bit() } else { 0 };
        let f_exp = (u >> 23) & 0xFF;
        let f_mant = u & 0x7F_FFFF;
        let shift = 23 - self.mantissa_bits;
        let emax_field = self.exp_field_max();
        let round = |m: u32, s: u32| -> u32 {
            if s == 0 {
                return m;
            }
            let even = 1u32 << s;
            let half = even >> 1;
            let bias = if m & even != 0 { half } else { half - 1 };
            (m + bias) >> s
        };
        let mut nan = false;
        let mut inf = false;
        let (mut e_field, mut m_field) = (0u32, 0u32);
        if f_exp == 0xFF {
            if f_mant != 0 {
                nan = true;
            } else {
                inf = true;
            }
        } else if f_exp == 0 {
            if self.exp_bits == 8 {
                m_field = round(f_mant, shift);
            }
        } else {
            let mut e = f_exp as i32 - 127;
            if e > (1 << (self.exp_bits - 1)) - self.has_inf as i32 {
                inf = true;
            } else if e + self.bias() <= 0 {
                let sub_exp = 1 - self.bias();
                let s = 23 - self.mantissa_bits as i32 - e + sub_exp;
                if (0..=23).contains(&s) {
                    m_field = round((1 << 23) + f_mant, s as u32);
                }
            } else {
                // Round the mantissa (in place, unshifted) and carry into the
                // exponent when it overflows.
                let even = 1u32 << shift;
                let half = even >> 1;
                let bias = if shift == 0 {
                    0
                } else if f_mant & even != 0 {
                    half
                } else {
                    half - 1
                };
                let mut m = f_mant + bias;
                if m > 0x7F_FFFF {
                    m = 0;
                    e += 1;
                }
                e_field = (e + self.bias()) as u32;
                m_field = m >> shift;
                if !self.has_inf && e_field > emax_field {
                    nan = true;
                }
            }
        }
        if inf {
            if self.has_inf {
                return sign | (emax_field << self.mantissa_bits);
            }
            if self.has_nan {
                nan = true;
            } else {
                return sign | (emax_field << self.mantissa_bits) | self.mantissa_mask();
            }
        }
        if nan {
            if !self.has_nan {
                return 0;
            }
            if self.nan_is_neg_zero {
                return self.sign_bit();
            }
            return sign | (emax_field << self.mantissa_bits) | self.mantissa_mask();
        }
        // A mantissa carry out of the subnormal range lands in the exponent
        // field naturally because the fields are added, not or-ed.
        let bits = (e_field << self.mantissa_bits) + m_field;
        if self.nan_is_neg_zero && bits == 0 {
            return 0;
        }
        sign | bits
    }
}

/// IEEE half bits to f32.
pub fn f16_to_f32(bits: u16) -> f32 {
    F16.decode(bits as u32)
}
/// f32 to IEEE half bits (round to nearest even).
pub fn f32_to_f16(v: f32) -> u16 {
    F16.encode(v) as u16
}
/// bfloat16 bits to f32.
pub fn bf16_to_f32(bits: u16) -> f32 {
    BF16.decode(bits as u32)
}
/// f32 to bfloat16 bits (round to nearest even).
pub fn f32_to_bf16(v: f32) -> u16 {
    BF16.encode(v) as u16
}
/// f8E5M2 bits to f32.
pub fn f8e5m2_to_f32(bits: u8) -> f32 {
    F8E5M2.decode(bits as u32)
}
/// f32 to f8E5M2 bits.
pub fn f32_to_f8e5m2(v: f32) -> u8 {
    F8E5M2.encode(v) as u8
}
/// f8E4M3FN bits to f32.
pub fn f8e4m3fn_to_f32(bits: u8) -> f32 {
    F8E4M3FN.decode(bits as u32)
}
/// f32 to f8E4M3FN bits.
pub fn f32_to_f8e4m3fn(v: f32) -> u8 {
    F8E4M3FN.encode(v) as u8
}
/// f8E5M2FNUZ bits to f32.
pub fn f8e5m2fnuz_to_f32(bits: u8) -> f32 {
    F8E5M2FNUZ.decode(bits as u32)
}
/// f32 to f8E5M2FNUZ bits.
pub fn f32_to_f8e5m2fnuz(v: f32) -> u8 {
    F8E5M2FNUZ.encode(v) as u8
}
/// f8E4M3FNUZ bits to f32.
pub fn f8e4m3fnuz_to_f32(bits: u8) -> f32 {
    F8E4M3FNUZ.decode(bits as u32)
}
/// f32 to f8E4M3FNUZ bits.
pub fn f32_to_f8e4m3fnuz(v: f32) -> u8 {
    F8E4M3FNUZ.encode(v) as u8
}
/// f8E8M0FNU (power-of-two scale) bits to f32; 0xFF is NaN.
pub fn f8e8m0fnu_to_f32(bits: u8) -> f32 {
    if bits == 0xFF {
        f32::NAN
    } else {
        2f64.powi(bits as i32 - 127) as f32
    }
}
/// f32 to f8E8M0FNU: nearest power of two (ties toward the larger when the
/// normalized fraction is at least 0.75), clamped; non-finite gives 0xFF.
pub fn f32_to_f8e8m0fnu(v: f32) -> u8 {
    if !v.is_finite() {
        return 0xFF;
    }
    if v <= 0.0 {
        return 0;
    }
    // frexp: v = frac * 2^exp with frac in [0.5, 1).
    let (frac, exp) = frexp(v as f64);
    let rounded = exp - (frac < 0.75) as i32;
    (rounded + 127).clamp(0, 0xFF) as u8
}

fn frexp(x: f64) -> (f64, i32) {
    if x == 0.0 || !x.is_finite() {
        return (x, 0);
    }
    let mut e = x.abs().log2().floor() as i32 + 1;
    let mut f = x / 2f64.powi(e);
    // Correct rare off-by-one from log2 rounding.
    while f.abs() >= 1.0 {
        f /= 2.0;
        e += 1;
    }
    while f.abs() < 0.5 {
        f *= 2.0;
        e -= 1;
    }
    (f, e)
}

/// Formats like C's `printf("%g")` (6 significant digits).
pub fn format_g(x: f64) -> String {
    ferrite_base::printf_float::format_g(x, 6)
}

/// Formats like C's `printf("%G")` (upper-case `E`, `INF`, `NAN`), which is
/// what upstream uses for buffer-view floats.
pub fn format_upper_g(x: f64) -> String {
    format_g(x).to_ascii_uppercase()
}

/// Result of a C-style integer scan: the magnitude, its sign, and whether it
/// overflowed 64 bits.
struct ScannedInt {
    negative: bool,
    magnitude: u64,
    overflow: bool,
}

/// Scans like `strtol` with base 0: leading whitespace, optional sign,
/// `0x`/`0X` hex or leading-`0` octal or decimal; stops at the first
/// non-digit (trailing text is ignored). `None` when no digit was read.
fn scan_int(s: &str) -> Option<ScannedInt> {
    let b = s.trim_start().as_bytes();
    let mut i = 0;
    let mut negative = false;
    if i < b.len() && (b[i] == b'+' || b[i] == b'-') {
        negative = b[i] == b'-';
        i += 1;
    }
    let mut radix = 10u64;
    if i + 1 < b.len()
        && b[i] == b'0'
        && (b[i + 1] | 0x20) == b'x'
        && i + 2 < b.len()
        && (b[i + 2] as char).is_ascii_hexdigit()
    {
        radix = 16;
        i += 2;
    } else if i < b.len() && b[i] == b'0' {
        radix = 8;
    }
    let start = i;
    let mut magnitude = 0u64;
    let mut overflow = false;
    while i < b.len() {
        let Some(d) = (b[i] as char).to_digit(radix as u32) else {
            break;
        };
        match magnitude
            .checked_mul(radix)
            .and_then(|m| m.checked_add(d as u64))
        {
            Some(m) => magnitude = m,
            None => overflow = true,
        }
        i += 1;
    }
    if i == start {
        return None;
    }
    Some(ScannedInt {
        negative,
        magnitude,
        overflow,
    })
}

/// Like upstream's `atoi_int64` (`strtoll`, base 0): `None` on no digits,
/// overflow, or a token of 32+ bytes.
pub fn parse_c_i64(s: &str) -> Option<i64> {
    if s.len() >= 32 {
        return None;
    }
    let v = scan_int(s)?;
    if v.overflow {
        return None;
    }
    if v.negative {
        if v.magnitude > 1u64 << 63 {
            return None;
        }
        Some((v.magnitude as i64).wrapping_neg())
    } else {
        i64::try_from(v.magnitude).ok()
    }
}

/// Like upstream's `atoi_uint64` (`strtoull`, base 0; a leading `-` negates
/// modulo 2^64 as C does).
pub fn parse_c_u64(s: &str) -> Option<u64> {
    if s.len() >= 32 {
        return None;
    }
    let v = scan_int(s)?;
    if v.overflow {
        return None;
    }
    Some(if v.negative {
        v.magnitude.wrapping_neg()
    } else {
        v.magnitude
    })
}

/// Like upstream's `atoi_int32`: a 64-bit `strtol` truncated to 32 bits
/// (tokens of 16+ bytes are rejected).
pub fn parse_c_i32(s: &str) -> Option<i32> {
    if s.len() >= 16 {
        return None;
    }
    parse_c_i64(s).map(|v| v as i32)
}

/// Like upstream's `atoi_uint32`: a 64-bit `strtoul` truncated to 32 bits
/// (tokens of 16+ bytes are rejected).
pub fn parse_c_u32(s: &str) -> Option<u32> {
    if s.len() >= 16 {
        return None;
    }
    parse_c_u64(s).map(|v| v as u32)
}

/// The longest prefix of `s` (after leading whitespace) that `strtod` would
/// consume, classified.
enum FloatPrefix<'a> {
    Decimal(&'a str),
    Hex {
        negative: bool,
        digits: &'a str,
        exp: i64,
    },
    Special(f64),
}

fn scan_float(s: &str) -> Option<(FloatPrefix<'_>, bool)> {
    let s = s.trim_start();
    let b = s.as_bytes();
    let mut i = 0;
    let mut negative = false;
    if i < b.len() && (b[i] == b'+' || b[i] == b'-') {
        negative = b[i] == b'-';
        i += 1;
    }
    let rest = &s[i..];
    let lower = rest
        .get(..8.min(rest.len()))
        .unwrap_or("")
        .to_ascii_lowercase();
    if lower.starts_with("inf") {
        let v = if negative {
            f64::NEG_INFINITY
        } else {
            f64::INFINITY
        };
        return Some((FloatPrefix::Special(v), true));
    }
    if lower.starts_with("nan") {
        let v = if negative { -f64::NAN } else { f64::NAN };
        return Some((FloatPrefix::Special(v), true));
    }
    if rest.len() > 2 && (lower.starts_with("0x")) {
        let hb = rest.as_bytes();
        let mut j = 2;
        let digits_start = j;
        while j < hb.len() && (hb[j].is_ascii_hexdigit() || hb[j] == b'.') {
            j += 1;
        }
        let digits = &rest[digits_start..j];
        if digits.bytes().filter(|&c| c == b'.').count() <= 1
            && digits.bytes().any(|c| c.is_ascii_hexdigit())
        {
            let mut exp = 0i64;
            if j < hb.len() && (hb[j] | 0x20) == b'p' {
                if let Some(e) = scan_int_dec(&rest[j + 1..]) {
                    exp = e;
                }
            }
            return Some((
                FloatPrefix::Hex {
                    negative,
                    digits,
                    exp,
                },
                true,
            ));
        }
    }
    // Decimal: digits [. digits] [e [sign] digits]
    let mut j = i;
    let mut mant_digits = 0;
    while j < b.len() && b[j].is_ascii_digit() {
        j += 1;
        mant_digits += 1;
    }
    if j < b.len() && b[j] == b'.' {
        j += 1;
        while j < b.len() && b[j].is_ascii_digit() {
            j += 1;
            mant_digits += 1;
        }
    }
    if mant_digits == 0 {
        return None;
    }
    if j < b.len() && (b[j] | 0x20) == b'e' {
        let mut k = j + 1;
        if k < b.len() && (b[k] == b'+' || b[k] == b'-') {
            k += 1;
        }
        if k < b.len() && b[k].is_ascii_digit() {
            while k < b.len() && b[k].is_ascii_digit() {
                k += 1;
            }
            j = k;
        }
    }
    let nonzero = s[i..j]
        .bytes()
        .take_while(|&c| c != b'e' && c != b'E')
        .any(|c| (b'1'..=b'9').contains(&c));
    Some((FloatPrefix::Decimal(&s[..j]), nonzero))
}

fn scan_int_dec(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    let mut i = 0;
    let mut neg = false;
    if i < b.len() && (b[i] == b'+' || b[i] == b'-') {
        neg = b[i] == b'-';
        i += 1;
    }
    let start = i;
    let mut v: i64 = 0;
    while i < b.len() && b[i].is_ascii_digit() {
        v = v.saturating_mul(10).saturating_add((b[i] - b'0') as i64);
        i += 1;
    }
    (i > start).then_some(if neg { -v } else { v })
}

fn hex_float_value(negative: bool, digits: &str, exp: i64) -> f64 {
    // Accumulate up to 64 significant bits exactly; later digits only shift
    // the exponent (good enough for the inputs tools see).
    let mut mant: u128 = 0;
    let mut scale: i64 = 0;
    let mut after_dot = false;
    for c in digits.bytes() {
        if c == b'.' {
            after_dot = true;
            continue;
        }
        let d = (c as char).to_digit(16).unwrap_or(0) as u128;
        if mant < (1u128 << 100) {
            mant = mant * 16 + d;
            if after_dot {
                scale -= 4;
            }
        } else if !after_dot {
            scale += 4;
        }
    }
    let v = mant as f64 * 2f64.powi((exp + scale).clamp(-2000, 2000) as i32);
    if negative {
        -v
    } else {
        v
    }
}

/// Like upstream's `atod` (`strtod`): leading whitespace, sign, decimal or
/// hex floats, `inf`/`nan`; trailing text ignored. `None` when nothing
/// parses, for tokens of 32+ bytes, and for nonzero inputs that underflow to
/// zero (C reports `ERANGE` there).
pub fn parse_c_f64(s: &str) -> Option<f64> {
    if s.len() >= 32 {
        return None;
    }
    let (prefix, nonzero) = scan_float(s)?;
    let v = match prefix {
        FloatPrefix::Special(v) => return Some(v),
        FloatPrefix::Hex {
            negative,
            digits,
            exp,
        } => hex_float_value(negative, digits, exp),
        FloatPrefix::Decimal(t) => t.trim_start().parse::<f64>().ok()?,
    };
    if v == 0.0 && nonzero {
        return None;
    }
    Some(v)
}

/// Like upstream's `atof` (`strtof`): as [`parse_c_f64`] but rounding
/// directly to `f32`.
pub fn parse_c_f32(s: &str) -> Option<f32> {
    if s.len() >= 32 {
        return None;
    }
    let (prefix, nonzero) = scan_float(s)?;
    let v = match prefix {
        FloatPrefix::Special(v) => return Some(v as f32),
        FloatPrefix::Hex {
            negative,
            digits,
            exp,
        } => hex_float_value(negative, digits, exp) as f32,
        FloatPrefix::Decimal(t) => t.trim_start().parse::<f32>().ok()?,
    };
    if v == 0.0 && nonzero {
        return None;
    }
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printf_g() {
        assert_eq!(format_g(0.1), "0.1");
        assert_eq!(format_g(1.0 / 3.0), "0.333333");
        assert_eq!(format_g(123456789.0), "1.23457e+08");
        assert_eq!(format_g(1e-7), "1e-07");
        assert_eq!(format_g(100000.0), "100000");
        assert_eq!(format_g(999999.5), "1e+06");
        assert_eq!(format_upper_g(1e7), "1E+07");
        assert_eq!(format_upper_g(-f64::NAN), "-NAN");
        assert_eq!(format_upper_g(f64::INFINITY), "INF");
        assert_eq!(format_upper_g(1e-40f32 as f64), "9.99995E-41");
    }

    #[test]
    fn half_and_brain() {
        assert_eq!(f32_to_f16(1.5), 0x3E00);
        assert_eq!(f16_to_f32(0x3E00), 1.5);
        assert_eq!(f32_to_f16(65504.0), 0x7BFF);
        assert_eq!(f32_to_f16(65520.0), 0x7C00); // rounds up to inf
        assert_eq!(f16_to_f32(f32_to_f16(0.1)), 0.099975586);
        assert_eq!(f32_to_f16(1e-7), 0x0002); // subnormal
        assert!(f16_to_f32(f32_to_f16(f32::NAN)).is_nan());
        assert_eq!(f32_to_bf16(1.5), 0x3FC0);
        assert_eq!(bf16_to_f32(f32_to_bf16(0.1)), 0.100097656);
        assert_eq!(
            format_upper_g(bf16_to_f32(f32_to_bf16(3e38)) as f64),
            "3.00406E+38"
        );
        assert_eq!(format_g(f16_to_f32(f32_to_f16(0.1)) as f64), "0.0999756");
    }

    #[test]
    fn f8_formats() {
        assert_eq!(f8e4m3fn_to_f32(f32_to_f8e4m3fn(448.0)), 448.0);
        assert!(f8e4m3fn_to_f32(f32_to_f8e4m3fn(1000.0)).is_nan()); // no inf
        assert_eq!(f32_to_f8e4m3fn(1.0), 0x38);
        assert_eq!(f32_to_f8e5m2(1.0), 0x3C);
        assert_eq!(f8e5m2_to_f32(0x7C), f32::INFINITY);
        assert_eq!(f32_to_f8e4m3fnuz(1.0), 0x40);
        assert!(f8e4m3fnuz_to_f32(0x80).is_nan());
        assert_eq!(f32_to_f8e4m3fnuz(-0.0), 0);
        assert_eq!(f32_to_f8e5m2fnuz(1.0), 0x40);
        assert_eq!(f8e8m0fnu_to_f32(127), 1.0);
        assert_eq!(f32_to_f8e8m0fnu(3.0), 129); // 0.75*4 rounds up to 4
        assert_eq!(f32_to_f8e8m0fnu(2.9), 128);
        for b in 0..=255u8 {
            let v = f8e4m3fn_to_f32(b);
            if !v.is_nan() {
                assert_eq!(f32_to_f8e4m3fn(v), b, "{b:#x}");
            }
            let v = f8e5m2_to_f32(b);
            if !v.is_nan() {
                assert_eq!(f32_to_f8e5m2(v), b, "{b:#x}");
            }
        }
    }

    #[test]
    fn c_number_parsing() {
        assert_eq!(parse_c_i32("0x10"), Some(16));
        assert_eq!(parse_c_i32("010"), Some(8));
        assert_eq!(parse_c_i32("12abc"), Some(12));
        assert_eq!(parse_c_i32("4294967295"), Some(-1));
        assert_eq!(parse_c_i32("+3"), Some(3));
        assert_eq!(parse_c_i32("1e3"), Some(1));
        assert_eq!(parse_c_i32("a"), None);
        assert_eq!(parse_c_i64("9223372036854775808"), None);
        assert_eq!(parse_c_i64("-9223372036854775808"), Some(i64::MIN));
        assert_eq!(parse_c_u64("-1"), Some(u64::MAX));
        assert_eq!(parse_c_f32("0x10"), Some(16.0));
        assert_eq!(parse_c_f32("1.5abc"), Some(1.5));
        assert_eq!(parse_c_f32("3.4e39"), Some(f32::INFINITY));
        assert_eq!(parse_c_f32("1e-50"), None);
        assert_eq!(parse_c_f32(".5"), Some(0.5));
        assert!(parse_c_f32("-nan").unwrap().is_sign_negative());
        assert_eq!(parse_c_f32("-0").map(f32::to_bits), Some(0x8000_0000));
        assert_eq!(parse_c_f32("0x1.8p1"), Some(3.0));
        assert_eq!(parse_c_f64("1e-320").map(|v| v > 0.0), Some(true));
        assert_eq!(parse_c_f32("e5"), None);
    }
}
