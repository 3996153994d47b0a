//! The one hexadecimal encoding of the workspace: digests in exNodes and
//! checksummed data phases, keys in `.xnd` metadata, sealed share fields.
//!
//! ```
//! use lors_ibp::hex;
//! assert_eq!(hex::encode(&[0x00, 0xab, 0xff]), "00abff");
//! assert_eq!(hex::decode("00ABff"), Some(vec![0x00, 0xab, 0xff]));
//! assert_eq!(hex::decode("abc"), None);
//! ```

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// `bytes` as lowercase hex digits, two per byte.
pub fn encode(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    s
}

/// The bytes hex digits `s` (either case) spell; `None` for an odd
/// length or a character that is not a hex digit.
pub fn decode(s: &str) -> Option<Vec<u8>> {
    let digit = |c: u8| {
        char::from(c)
            .to_digit(16)
            .and_then(|d| u8::try_from(d).ok())
    };
    let b = s.as_bytes();
    if !b.len().is_multiple_of(2) {
        return None;
    }
    b.chunks_exact(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}
