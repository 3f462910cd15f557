//! The argument types a function declares in its `iree.abi.declaration`
//! reflection (`sync func @add(%input0: tensor<4xf32>, ...) -> (...)`),
//! parsed once per function so calls can check numpy arguments up front.

use ferrite_hal::element_type::ElementType;

/// What one argument of a function is declared to be.
#[derive(Debug, Clone, PartialEq)]
pub enum ArgType {
    /// `tensor<4x?xf32>`: dimensions (`None` for `?`) and the element type
    /// (`None` when the declaration names one we do not map).
    Tensor {
        dims: Vec<Option<u64>>,
        element_type: Option<ElementType>,
    },
    /// A scalar integer (`i32`, `index`, ...).
    Int,
    /// A scalar float (`f32`, `f64`, ...).
    Float,
    /// Anything else (`!hal.buffer_view`, `!util.list<?>`, ...): not checked.
    Other,
}

/// One declared argument: its name (`input0`), its type text and its type.
#[derive(Debug, Clone, PartialEq)]
pub struct ArgDecl {
    pub name: String,
    pub text: String,
    pub ty: ArgType,
    /// Carries `iree.abi.output`: the program writes its result into this
    /// argument's buffer, so it must never be the caller's own memory.
    pub is_output: bool,
}

/// The arguments of `declaration`, or `None` when it is not of the
/// `... func @name(args) -> ...` form we understand (calls then go unchecked,
/// as upstream's do without reflection).
pub fn parse_arguments(declaration: &str) -> Option<Vec<ArgDecl>> {
    let at = declaration.find('@')?;
    let open = at + declaration[at..].find('(')?;
    let inner = balanced(&declaration[open..])?;
    split_top_level(inner, ',')
        .into_iter()
        .filter(|s| !s.trim().is_empty())
        .map(parse_arg)
        .collect()
}

/// The text between the bracket `s` starts with and its matching close.
fn balanced(s: &str) -> Option<&str> {
    let mut depth = 0usize;
    for (i, c) in s.char_indices() {
        match c {
            '(' | '<' | '{' | '[' => depth += 1,
            ')' | '>' | '}' | ']' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(&s[1..i]);
                }
            }
            _ => {}
        }
    }
    None
}

/// Splits at `sep` outside any brackets (`->` is not a bracket).
fn split_top_level(s: &str, sep: char) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    let mut prev = ' ';
    for (i, c) in s.char_indices() {
        match c {
            '(' | '<' | '{' | '[' => depth += 1,
            '>' if prev == '-' => {}
            ')' | '>' | '}' | ']' => depth = depth.saturating_sub(1),
            c if c == sep && depth == 0 => {
                parts.push(&s[start..i]);
                start = i + c.len_utf8();
            }
            _ => {}
        }
        prev = c;
    }
    parts.push(&s[start..]);
    parts
}

/// `%input0: tensor<4xf32> {attrs}` -> its declaration.
fn parse_arg(s: &str) -> Option<ArgDecl> {
    let (name, ty) = s.trim().split_once(':')?;
    let name = name.trim().trim_start_matches('%').to_string();
    let ty = ty.trim();
    let text = without_attributes(ty).trim().to_string();
    let is_output = ty[text.len()..].contains("iree.abi.output");
    Some(ArgDecl {
        name,
        ty: parse_type(&text),
        text,
        is_output,
    })
}

/// A type without its trailing attribute dictionary (`{iree.abi... = ...}`).
fn without_attributes(ty: &str) -> &str {
    let mut depth = 0usize;
    for (i, c) in ty.char_indices() {
        match c {
            '(' | '<' | '[' => depth += 1,
            ')' | '>' | ']' => depth = depth.saturating_sub(1),
            '{' if depth == 0 => return &ty[..i],
            _ => {}
        }
    }
    ty
}

fn parse_type(text: &str) -> ArgType {
    if let Some(rest) = text.strip_prefix("tensor") {
        return match balanced(rest) {
            Some(inner) => parse_tensor(split_top_level(inner, ',')[0].trim()),
            None => ArgType::Other,
        };
    }
    match text {
        "index" => ArgType::Int,
        t if t.starts_with('i') || t.starts_with("si") || t.starts_with("ui") => {
            if ElementType::parse(t).is_ok() {
                ArgType::Int
            } else {
                ArgType::Other
            }
        }
        t if t.starts_with('f') || t.starts_with("bf") => {
            if ElementType::parse(t).is_ok() {
                ArgType::Float
            } else {
                ArgType::Other
            }
        }
        _ => ArgType::Other,
    }
}

/// `4x?xf32` (or `f32` for rank 0) -> dimensions and element type.
fn parse_tensor(shape: &str) -> ArgType {
    let mut dims = Vec::new();
    let mut rest = shape;
    while let Some((dim, tail)) = rest.split_once('x') {
        if dim == "?" {
            dims.push(None);
        } else if !dim.is_empty() && dim.bytes().all(|b| b.is_ascii_digit()) {
            match dim.parse() {
                Ok(d) => dims.push(Some(d)),
                Err(_) => return ArgType::Other,
            }
        } else {
            break;
        }
        rest = tail;
    }
    ArgType::Tensor {
        dims,
        element_type: element_type_of(rest),
    }
}

/// The HAL element type an MLIR element type names (`f32`, `i8`, `i1`,
/// `complex<f32>`, `f8E4M3FN`).
fn element_type_of(mlir: &str) -> Option<ElementType> {
    match mlir {
        "complex<f32>" => Some(ElementType::COMPLEX_FLOAT_64),
        "complex<f64>" => Some(ElementType::COMPLEX_FLOAT_128),
        t => ElementType::parse(t).ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_tensors_scalars_and_others() {
        let args = parse_arguments(
            "sync func @f(%input0: tensor<4x?xf32>, %input1: i32, %input2: !util.list<?>, \
             %input3: tensor<i1>, %input4: tensor<2xcomplex<f32>> {iree.abi.x = 1}, \
             %input5: f64, %input6: tensor<3xindex>) -> (%output0: tensor<4xf32>)",
        )
        .unwrap();
        let tys: Vec<ArgType> = args.iter().map(|a| a.ty.clone()).collect();
        assert_eq!(
            tys,
            vec![
                ArgType::Tensor {
                    dims: vec![Some(4), None],
                    element_type: Some(ElementType::FLOAT_32)
                },
                ArgType::Int,
                ArgType::Other,
                ArgType::Tensor {
                    dims: vec![],
                    element_type: Some(ElementType::BOOL_8)
                },
                ArgType::Tensor {
                    dims: vec![Some(2)],
                    element_type: Some(ElementType::COMPLEX_FLOAT_64)
                },
                ArgType::Float,
                ArgType::Tensor {
                    dims: vec![Some(3)],
                    element_type: None
                },
            ]
        );
        assert_eq!(args[0].name, "input0");
        assert_eq!(args[4].text, "tensor<2xcomplex<f32>>");
        assert!(!args[4].is_output);
        let out = parse_arguments(
            "sync func @f(%input0: tensor<4xf32> {iree.abi.output = 0 : index}) -> ()",
        )
        .unwrap();
        assert!(out[0].is_output);
    }

    #[test]
    fn no_arguments_and_malformed_text() {
        assert_eq!(
            parse_arguments("sync func @f() -> ()").unwrap(),
            Vec::<ArgDecl>::new()
        );
        assert!(parse_arguments("garbage").is_none());
        assert!(parse_arguments("sync func @f(%a tensor<4xf32>)").is_none());
    }
}
