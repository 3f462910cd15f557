//! GPT-2's pre-tokenizer pattern as a hand-written scanner.
//!
//! The pattern (the `ByteLevel` pre-tokenizer's, with `use_regex`) is
//! `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
//! At each position the first alternative that matches wins; the scanner
//! below decides the same from the class of the next one or two
//! characters. Character classes come from the `regex` crate (the engine
//! the `tokenizers` crate's patterns run on), so both agree on every
//! Unicode character: ASCII from a table, the rest of the BMP from a table
//! built once, other planes asked directly.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

/// The classes the pattern tells apart.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub enum Class {
    /// `\p{L}`
    Letter = 0,
    /// `\p{N}`
    Number = 1,
    /// `\s`
    Space = 2,
    /// Anything else.
    Other = 3,
}

struct Classifier {
    letter: regex::Regex,
    number: regex::Regex,
    space: regex::Regex,
}

impl Classifier {
    fn new() -> Classifier {
        // Fixed patterns: they always compile.
        let re = |p: &str| regex::Regex::new(p).unwrap_or_else(|_| unreachable!());
        Classifier {
            letter: re(r"^\p{L}$"),
            number: re(r"^\p{N}$"),
            space: re(r"^\s$"),
        }
    }

    fn class(&self, c: char) -> Class {
        let mut buf = [0u8; 4];
        let s = c.encode_utf8(&mut buf);
        if self.letter.is_match(s) {
            Class::Letter
        } else if self.number.is_match(s) {
            Class::Number
        } else if self.space.is_match(s) {
            Class::Space
        } else {
            Class::Other
        }
    }
}

fn classifier() -> &'static Classifier {
    static C: OnceLock<Classifier> = OnceLock::new();
    C.get_or_init(Classifier::new)
}

/// Classes of U+0000..U+FFFF, filled in as characters are met (`UNKNOWN`
/// until then): asking the regex engine costs about a microsecond, and a
/// text uses few distinct characters.
fn bmp_table() -> &'static [AtomicU8] {
    static T: OnceLock<Vec<AtomicU8>> = OnceLock::new();
    T.get_or_init(|| (0..=0xFFFFu32).map(|_| AtomicU8::new(UNKNOWN)).collect())
}

const UNKNOWN: u8 = 0xFF;

fn from_u8(v: u8) -> Class {
    match v {
        0 => Class::Letter,
        1 => Class::Number,
        2 => Class::Space,
        _ => Class::Other,
    }
}

/// The class of `c`.
#[inline]
pub fn class_of(c: char) -> Class {
    let u = c as u32;
    if u < 0x80 {
        let b = u as u8;
        if b.is_ascii_alphabetic() {
            Class::Letter
        } else if b.is_ascii_digit() {
            Class::Number
        } else if matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r') {
            Class::Space
        } else {
            Class::Other
        }
    } else if u <= 0xFFFF {
        let slot = &bmp_table()[u as usize];
        let v = slot.load(Ordering::Relaxed);
        if v != UNKNOWN {
            return from_u8(v);
        }
        let class = classifier().class(c);
        slot.store(class as u8, Ordering::Relaxed);
        class
    } else {
        classifier().class(c)
    }
}

/// The character at byte `i` of `s` (a char boundary) and its length.
#[inline]
fn char_at(s: &str, i: usize) -> (char, usize) {
    let b = s.as_bytes()[i];
    if b < 0x80 {
        return (b as char, 1);
    }
    let c = s[i..].chars().next().unwrap_or('\0');
    (c, c.len_utf8())
}

/// End of the run of `class` characters starting at byte `i`.
#[inline]
fn run_end(s: &str, mut i: usize, class: Class) -> usize {
    let b = s.as_bytes();
    while i < b.len() {
        if b[i] < 0x80 {
            if class_of(b[i] as char) != class {
                break;
            }
            i += 1;
        } else {
            let (c, n) = char_at(s, i);
            if class_of(c) != class {
                break;
            }
            i += n;
        }
    }
    i
}

/// Byte end of the piece that starts at byte `i` (< `s.len()`).
pub fn piece_end(s: &str, i: usize) -> usize {
    let b = s.as_bytes();
    let n = b.len();
    // 's 't 're 've 'm 'll 'd
    if b[i] == b'\'' && i + 1 < n {
        match b[i + 1] {
            b's' | b't' | b'm' | b'd' => return i + 2,
            b'r' | b'v' if i + 2 < n && b[i + 2] == b'e' => return i + 3,
            b'l' if i + 2 < n && b[i + 2] == b'l' => return i + 3,
            _ => {}
        }
    }
    let (c0, l0) = char_at(s, i);
    let k0 = class_of(c0);
    if k0 != Class::Space {
        // \p{L}+, \p{N}+ or [^\s\p{L}\p{N}]+
        return run_end(s, i + l0, k0);
    }
    if c0 == ' ' && i + 1 < n {
        // " ?" before a non-space run.
        let (c1, l1) = char_at(s, i + 1);
        let k1 = class_of(c1);
        if k1 != Class::Space {
            return run_end(s, i + 1 + l1, k1);
        }
    }
    // \s+(?!\S) and \s+: a whitespace run, less its last character when
    // a non-space follows and that leaves something.
    let end = run_end(s, i + l0, Class::Space);
    if end == n {
        return end;
    }
    let mut last = end - 1;
    while !s.is_char_boundary(last) {
        last -= 1;
    }
    if last > i {
        last
    } else {
        end
    }
}

/// Calls `f` with each piece of `s`.
pub fn for_each_piece(s: &str, mut f: impl FnMut(&str)) {
    let mut i = 0;
    while i < s.len() {
        let end = piece_end(s, i);
        f(&s[i..end]);
        i = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pattern through `fancy-regex`, as the `tokenizers` crate runs it.
    fn reference(s: &str) -> Vec<String> {
        let re = fancy_regex::Regex::new(
            r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
        )
        .unwrap();
        re.find_iter(s)
            .map(|m| m.unwrap().as_str().to_string())
            .collect()
    }

    fn ours(s: &str) -> Vec<String> {
        let mut out = Vec::new();
        for_each_piece(s, |p| out.push(p.to_string()));
        out
    }

    #[test]
    fn matches_the_regex() {
        let cases = [
            "",
            "hello world",
            "  leading and trailing  ",
            "a\n\nb",
            "x \t y",
            " \tword",
            "don't we'll I'M 's 'x '",
            "12345 3.14 ½ ²",
            "héllo wörld 日本語 😀😀 Ωmega",
            "a\u{00A0}b\u{3000}c\u{2028}d",
            "!!! ...,,, == ->",
            "tail '",
            "ends with space ",
            "\u{0301}combining e\u{0301}",
        ];
        for s in cases {
            assert_eq!(ours(s), reference(s), "{s:?}");
        }
    }

    #[test]
    fn matches_the_regex_on_random_text() {
        let alphabet: Vec<char> =
            "ab Z09 \t\n\r'sltmdrve.,!-_é日😀\u{00A0}\u{3000}\u{0301}²Ⅻ\u{200B}\u{0}"
                .chars()
                .collect();
        let mut x = 0x2545_F491u32;
        for len in 0..40 {
            for _ in 0..50 {
                let s: String = (0..len)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 17;
                        x ^= x << 5;
                        alphabet[x as usize % alphabet.len()]
                    })
                    .collect();
                assert_eq!(ours(&s), reference(&s), "{s:?}");
            }
        }
    }
}
