//! The job's shared secret and the message authentication built on it
//! (HMAC-SHA256 from the `hmac` and `sha2` crates; nonces from the
//! operating system through `getrandom`).

use ferrite_base::{bail, status, Result};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::sync::Arc;

/// The variable holding the job's secret for a TCP store.
pub const TOKEN_VARIABLE: &str = "FERRITE_STORE_TOKEN";

/// The shortest secret accepted, in bytes.
pub const MIN_TOKEN_LEN: usize = 16;

/// How a new secret is usually made, for error messages.
pub(crate) const TOKEN_HINT: &str = "e.g. export FERRITE_STORE_TOKEN=$(python3 -c 'import secrets; print(secrets.token_hex(32))') once per job, before the launcher starts the ranks";

/// A secret every rank of one job holds and nobody else does: the key of
/// the store's challenge/response. Its bytes are never printed (`Debug`
/// shows only its length).
#[derive(Clone)]
pub struct Secret(Arc<[u8]>);

impl Secret {
    /// A secret from the token text: at least [`MIN_TOKEN_LEN`] bytes, no
    /// surrounding white space.
    pub fn new(token: &str) -> Result<Secret> {
        if token.trim() != token {
            bail!(
                InvalidArgument,
                "{TOKEN_VARIABLE} has leading or trailing white space; {TOKEN_HINT}"
            );
        }
        if token.len() < MIN_TOKEN_LEN {
            bail!(
                InvalidArgument,
                "{TOKEN_VARIABLE} is {} bytes long, at least {MIN_TOKEN_LEN} are needed; {TOKEN_HINT}",
                token.len()
            );
        }
        Ok(Secret(token.as_bytes().into()))
    }

    /// A fresh random secret (tests; launchers that start the ranks
    /// themselves and pass it on).
    pub fn random() -> Result<Secret> {
        let bytes = nonce::<32>()?;
        Ok(Secret(hex(&bytes).into_bytes().into()))
    }

    /// The secret as the token text to hand to other ranks (through
    /// [`TOKEN_VARIABLE`]).
    pub fn token(&self) -> &str {
        std::str::from_utf8(&self.0).expect("made from a str")
    }

    /// The tag of `parts`, each length-prefixed so that no two different
    /// part lists have the same message.
    pub(crate) fn tag(&self, parts: &[&[u8]]) -> [u8; 32] {
        self.hmac(parts).finalize().into_bytes().into()
    }

    /// Whether `tag` is the tag of `parts` (compared in constant time).
    pub(crate) fn verify(&self, parts: &[&[u8]], tag: &[u8]) -> bool {
        self.hmac(parts).verify_slice(tag).is_ok()
    }

    fn hmac(&self, parts: &[&[u8]]) -> Hmac<Sha256> {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes any key");
        for p in parts {
            m.update(&(p.len() as u64).to_be_bytes());
            m.update(p);
        }
        m
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret({} bytes)", self.0.len())
    }
}

/// `N` random bytes from the operating system.
pub(crate) fn nonce<const N: usize>() -> Result<[u8; N]> {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).map_err(|e| status!(Unavailable, "no random bytes: {e}"))?;
    Ok(b)
}

/// Lower-case hexadecimal.
pub(crate) fn hex(b: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(b.len() * 2);
    for x in b {
        let _ = write!(s, "{x:02x}");
    }
    s
}

/// The bytes of lower- or upper-case hexadecimal text.
pub(crate) fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.is_ascii() {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_bind_every_part_and_the_key() {
        let a = Secret::new("0123456789abcdef").unwrap();
        let b = Secret::new("0123456789abcdeF").unwrap();
        let t = a.tag(&[b"x", b"yz"]);
        assert!(a.verify(&[b"x", b"yz"], &t));
        assert!(!a.verify(&[b"xy", b"z"], &t), "parts are length-prefixed");
        assert!(!b.verify(&[b"x", b"yz"], &t));
        assert!(!a.verify(&[b"x", b"yz"], &t[..31]));
    }

    #[test]
    fn short_or_padded_tokens_are_refused_and_never_printed() {
        let e = Secret::new("short").unwrap_err().to_string();
        assert!(e.contains("at least 16"), "{e}");
        assert!(!e.contains("short"), "{e}");
        assert!(Secret::new(" 0123456789abcdef").is_err());
        let s = Secret::random().unwrap();
        assert_eq!(s.token().len(), 64);
        assert_eq!(format!("{s:?}"), "Secret(64 bytes)");
        assert_eq!(unhex(&hex(&[0, 255, 16])).unwrap(), [0, 255, 16]);
        assert!(unhex("0g").is_none());
    }
}
