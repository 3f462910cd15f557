//! IREE calling-convention strings.
//!
//! A cconv string is `0<args>_<results>` with one character per value:
//! `i` i32, `I` i64, `f` f32, `F` f64, `r` ref, `v` void (no values), and
//! `C...D` a variadic span whose elements repeat the enclosed types.
//! Example: `0rCiD_r` takes a ref and a span of i32s and returns a ref.

use ferrite_base::{bail, Result};
use std::fmt;

/// One value type in a calling convention.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CconvType {
    /// `i`
    I32,
    /// `I`
    I64,
    /// `f`
    F32,
    /// `F`
    F64,
    /// `r`
    Ref,
    /// `C...D`: a count followed by that many repetitions of the tuple.
    Span(Vec<CconvType>),
}

impl CconvType {
    fn code(&self, out: &mut String) {
        match self {
            CconvType::I32 => out.push('i'),
            CconvType::I64 => out.push('I'),
            CconvType::F32 => out.push('f'),
            CconvType::F64 => out.push('F'),
            CconvType::Ref => out.push('r'),
            CconvType::Span(items) => {
                out.push('C');
                for i in items {
                    i.code(out);
                }
                out.push('D');
            }
        }
    }

    /// Number of i32 register slots a scalar of this type occupies.
    pub fn i32_slots(&self) -> usize {
        match self {
            CconvType::I32 | CconvType::F32 => 1,
            CconvType::I64 | CconvType::F64 => 2,
            _ => 0,
        }
    }
}

/// A parsed calling convention.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cconv {
    /// Argument types in order.
    pub args: Vec<CconvType>,
    /// Result types in order.
    pub results: Vec<CconvType>,
}

impl Cconv {
    /// Parses `0ii_r` style strings; errors name the offending character.
    pub fn parse(s: &str) -> Result<Cconv> {
        let Some(body) = s.strip_prefix('0') else {
            bail!(
                InvalidArgument,
                "calling convention '{s}' must start with version '0'"
            );
        };
        let Some((a, r)) = body.split_once('_') else {
            bail!(
                InvalidArgument,
                "calling convention '{s}' has no '_' between arguments and results"
            );
        };
        Ok(Cconv {
            args: parse_list(s, a)?,
            results: parse_list(s, r)?,
        })
    }

    /// True when any argument is a variadic span.
    pub fn is_variadic(&self) -> bool {
        self.args.iter().any(|a| matches!(a, CconvType::Span(_)))
    }
}

fn parse_list(whole: &str, s: &str) -> Result<Vec<CconvType>> {
    let mut stack: Vec<Vec<CconvType>> = vec![Vec::new()];
    for (i, c) in s.chars().enumerate() {
        let t = match c {
            'i' => CconvType::I32,
            'I' => CconvType::I64,
            'f' => CconvType::F32,
            'F' => CconvType::F64,
            'r' => CconvType::Ref,
            'v' => continue,
            'C' => {
                stack.push(Vec::new());
                continue;
            }
            'D' => {
                if stack.len() < 2 {
                    bail!(
                        InvalidArgument,
                        "calling convention '{whole}': 'D' without matching 'C'"
                    );
                }
                let items = stack.pop().unwrap_or_default();
                CconvType::Span(items)
            }
            other => bail!(
                InvalidArgument,
                "calling convention '{whole}': unknown type character '{other}' at position {i}"
            ),
        };
        if let Some(top) = stack.last_mut() {
            top.push(t);
        }
    }
    if stack.len() != 1 {
        bail!(
            InvalidArgument,
            "calling convention '{whole}': unterminated span 'C'"
        );
    }
    Ok(stack.pop().unwrap_or_default())
}

impl fmt::Display for Cconv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = String::from("0");
        if self.args.is_empty() {
            s.push('v');
        }
        for a in &self.args {
            a.code(&mut s);
        }
        s.push('_');
        if self.results.is_empty() {
            s.push('v');
        }
        for r in &self.results {
            r.code(&mut s);
        }
        f.write_str(&s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_print() {
        let c = Cconv::parse("0rCiD_r").unwrap();
        assert_eq!(
            c.args,
            vec![CconvType::Ref, CconvType::Span(vec![CconvType::I32])]
        );
        assert_eq!(c.to_string(), "0rCiD_r");
        assert_eq!(Cconv::parse("0v_v").unwrap().to_string(), "0v_v");
        assert!(Cconv::parse("0x_v").unwrap_err().message().contains("'x'"));
        assert!(Cconv::parse("0C_v").is_err());
        assert!(Cconv::parse("1i_i").is_err());
    }
}
