//! MD5 as LoRS 0.82 computes it on 64-bit hosts, and the choice between it
//! and standard MD5 (RFC 1321).
//!
//! LoRS's `libe2e/md5` is the RFC 1321 reference code with `UINT4` defined as
//! `unsigned long`: 64 bits on every 64-bit build in use. Its digest is not
//! MD5's: the state words and their sums are kept modulo 2^64, the rotation
//! `(x << n) | (x >> (32 - n))` lets bits above 32 shift back in, message
//! words are still read as 32-bit little endian, the bit count is written as
//! its low 32 bits then the `count[1]` word, and the digest is the low 32 bits
//! of each state word, little endian. `lors_download` 0.82 on such a host
//! checks blocks against this digest only, so we write it for the LoRS
//! `checksum` function and accept either digest when reading.

/// Streaming LoRS-MD5 (the 64-bit `UINT4` variant).
///
/// ```
/// use lors_exnode::functions::lors_md5::LorsMd5;
/// let hex: String = LorsMd5::digest(b"abc").iter().map(|b| format!("{b:02x}")).collect();
/// assert_eq!(hex, "7999dc75e8da648c6727e137c5b77803");
/// ```
#[derive(Clone)]
pub struct LorsMd5 {
    state: [u64; 4],
    /// `count[0]`: bits hashed, kept in a 64-bit word.
    bits: u64,
    /// `count[1]`: what the 32-bit carry logic adds (`len >> 29` per update).
    high: u64,
    buf: [u8; 64],
}

impl Default for LorsMd5 {
    fn default() -> Self {
        LorsMd5 {
            state: [0x6745_2301, 0xefcd_ab89, 0x98ba_dcfe, 0x1032_5476],
            bits: 0,
            high: 0,
            buf: [0; 64],
        }
    }
}

/// Shift amounts per round.
const S: [[u32; 4]; 4] = [
    [7, 12, 17, 22],
    [5, 9, 14, 20],
    [4, 11, 16, 23],
    [6, 10, 15, 21],
];

/// The RFC 1321 constant for step `i`: floor(abs(sin(i + 1)) * 2^32).
fn k(i: usize) -> u64 {
    const T: [u32; 64] = [
        0xd76aa478, 0xe8c7b756, 0x242070db, 0xc1bdceee, 0xf57c0faf, 0x4787c62a, 0xa8304613,
        0xfd469501, 0x698098d8, 0x8b44f7af, 0xffff5bb1, 0x895cd7be, 0x6b901122, 0xfd987193,
        0xa679438e, 0x49b40821, 0xf61e2562, 0xc040b340, 0x265e5a51, 0xe9b6c7aa, 0xd62f105d,
        0x02441453, 0xd8a1e681, 0xe7d3fbc8, 0x21e1cde6, 0xc33707d6, 0xf4d50d87, 0x455a14ed,
        0xa9e3e905, 0xfcefa3f8, 0x676f02d9, 0x8d2a4c8a, 0xfffa3942, 0x8771f681, 0x6d9d6122,
        0xfde5380c, 0xa4beea44, 0x4bdecfa9, 0xf6bb4b60, 0xbebfbc70, 0x289b7ec6, 0xeaa127fa,
        0xd4ef3085, 0x04881d05, 0xd9d4d039, 0xe6db99e5, 0x1fa27cf8, 0xc4ac5665, 0xf4292244,
        0x432aff97, 0xab9423a7, 0xfc93a039, 0x655b59c3, 0x8f0ccc92, 0xffeff47d, 0x85845dd1,
        0x6fa87e4f, 0xfe2ce6e0, 0xa3014314, 0x4e0811a1, 0xf7537e82, 0xbd3af235, 0x2ad7d2bb,
        0xeb86d391,
    ];
    u64::from(T[i])
}

/// `ROTATE_LEFT` on a 64-bit `UINT4`: bits above 32 shift in from the right.
fn rotl(x: u64, n: u32) -> u64 {
    (x << n) | (x >> (32 - n))
}

fn transform(state: &mut [u64; 4], block: &[u8; 64]) {
    let mut x = [0u64; 16];
    for (i, w) in x.iter_mut().enumerate() {
        let b = &block[4 * i..4 * i + 4];
        *w = u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    }
    let [mut a, mut b, mut c, mut d] = *state;
    for i in 0..64 {
        let (f, g) = match i / 16 {
            0 => ((b & c) | (!b & d), i),
            1 => ((b & d) | (c & !d), (5 * i + 1) % 16),
            2 => (b ^ c ^ d, (3 * i + 5) % 16),
            _ => (c ^ (b | !d), (7 * i) % 16),
        };
        let s = S[i / 16][i % 4];
        let t = rotl(a.wrapping_add(f).wrapping_add(x[g]).wrapping_add(k(i)), s).wrapping_add(b);
        a = d;
        d = c;
        c = b;
        b = t;
    }
    state[0] = state[0].wrapping_add(a);
    state[1] = state[1].wrapping_add(b);
    state[2] = state[2].wrapping_add(c);
    state[3] = state[3].wrapping_add(d);
}

impl LorsMd5 {
    /// Hashes more bytes (`MD5Update`, including its 32-bit carry logic for
    /// the bit count).
    pub fn update(&mut self, mut data: &[u8]) {
        let len = u64::try_from(data.len()).unwrap_or(u64::MAX);
        let index = usize::from((self.bits >> 3) as u8 & 0x3f);
        self.bits = self.bits.wrapping_add(len << 3);
        if self.bits < (len << 3) {
            self.high = self.high.wrapping_add(1);
        }
        self.high = self.high.wrapping_add(len >> 29);
        let part = 64 - index;
        if data.len() >= part {
            self.buf[index..].copy_from_slice(&data[..part]);
            let blk = self.buf;
            transform(&mut self.state, &blk);
            data = &data[part..];
            while data.len() >= 64 {
                let blk: [u8; 64] = data[..64].try_into().expect("64 bytes");
                transform(&mut self.state, &blk);
                data = &data[64..];
            }
            self.buf[..data.len()].copy_from_slice(data);
        } else {
            self.buf[index..index + data.len()].copy_from_slice(data);
        }
    }

    /// The digest (`MD5Final`).
    pub fn finalize(mut self) -> [u8; 16] {
        let mut bits = [0u8; 8];
        bits[..4].copy_from_slice(&(self.bits as u32).to_le_bytes());
        bits[4..].copy_from_slice(&(self.high as u32).to_le_bytes());
        let index = usize::from((self.bits >> 3) as u8 & 0x3f);
        let pad = if index < 56 { 56 - index } else { 120 - index };
        let mut padding = [0u8; 64];
        padding[0] = 0x80;
        self.update(&padding[..pad]);
        self.update(&bits);
        let mut out = [0u8; 16];
        for (i, w) in self.state.iter().enumerate() {
            out[4 * i..4 * i + 4].copy_from_slice(&(*w as u32).to_le_bytes());
        }
        out
    }

    /// The digest of `data` in one update, as LoRS hashes a block.
    pub fn digest(data: &[u8]) -> [u8; 16] {
        let mut h = LorsMd5::default();
        h.update(data);
        h.finalize()
    }
}

/// Which MD5 a `checksum` function's digests are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Md5Variant {
    /// What LoRS 0.82 computes on 64-bit hosts ([`LorsMd5`]); what we write
    /// for `-k md5`, so the original tools read our files.
    Lors64,
    /// Standard MD5 (RFC 1321), as a 32-bit LoRS build computes it.
    Rfc1321,
}

impl Md5Variant {
    /// The digest of `data` as 32 lowercase hex digits.
    pub fn hex_digest(self, data: &[u8]) -> String {
        use md5::Digest as _;
        match self {
            Md5Variant::Lors64 => super::hex(&LorsMd5::digest(data)),
            Md5Variant::Rfc1321 => super::hex(&md5::Md5::digest(data)),
        }
    }
}

/// Whether `hex` (as stored in a `checksum` block header) is the digest of
/// `data` by either variant: files come from 64-bit and 32-bit LoRS builds
/// and from earlier versions of ours, which wrote standard MD5.
pub fn matches(hex: &[u8], data: &[u8]) -> bool {
    Md5Variant::Lors64.hex_digest(data).as_bytes() == hex
        || Md5Variant::Rfc1321.hex_digest(data).as_bytes() == hex
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_answers_of_lors_on_64_bit_hosts() {
        let seq: Vec<u8> = (0..65_536u32).map(|i| i as u8).collect();
        for (input, want) in [
            (&b""[..], "e4c23762ed2823a27e62a64b95c024e7"),
            (b"abc", "7999dc75e8da648c6727e137c5b77803"),
            (&[b'a'; 1000][..], "b867829e0b155dc0b0d832b183f8bbdc"),
            (&seq[..], "739654ec2c2ce7b2e0c5d66b8303f717"),
        ] {
            assert_eq!(
                Md5Variant::Lors64.hex_digest(input),
                want,
                "{} bytes",
                input.len()
            );
        }
    }

    #[test]
    fn streaming_in_pieces_gives_the_one_shot_digest() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        let mut h = LorsMd5::default();
        for piece in data.chunks(37) {
            h.update(piece);
        }
        assert_eq!(h.finalize(), LorsMd5::digest(&data));
    }

    #[test]
    fn both_variants_are_accepted_and_nothing_else() {
        assert_eq!(
            Md5Variant::Rfc1321.hex_digest(b"abc"),
            "900150983cd24fb0d6963f7d28e17f72"
        );
        assert!(matches(b"7999dc75e8da648c6727e137c5b77803", b"abc"));
        assert!(matches(b"900150983cd24fb0d6963f7d28e17f72", b"abc"));
        assert!(!matches(b"900150983cd24fb0d6963f7d28e17f72", b"abd"));
        assert!(!matches(b"7999DC75E8DA648C6727E137C5B77803", b"abc"));
    }
}
