//! The end-to-end encoding an upload asks for, as `lors upload`'s flags and
//! the Python `lors.upload` keywords say it, turned into a [`Codec`].

use lors_exnode::functions::{Chain, Codec, LegacyChain, LegacyKind, MAX_E2E_BLOCK, Step};

use crate::xndrc::Xndrc;

/// What a user asks of the end-to-end functions. The default is what
/// `lors upload` does without flags: BLAKE3 checksums on 1 MiB blocks.
///
/// ```
/// use lors::upload::E2e;
/// let rc = lors::xndrc::Xndrc::default();
/// let codec = E2e { compress: true, ..E2e::default() }.codec(&rc).unwrap();
/// assert!(codec.is_some());
/// assert!(E2e { none: true, ..E2e::default() }.codec(&rc).unwrap().is_none());
/// ```
#[derive(Debug, Clone, Default)]
pub struct E2e {
    /// No functions at all: the bytes are stored as they are.
    pub none: bool,
    /// `blake3` (the default), `md5`, `md5-rfc1321` or `none`.
    pub checksum: Option<String>,
    /// zstd on every e2e block.
    pub compress: bool,
    /// The original LoRS zlib format (with the LoRS MD5 unless `checksum`
    /// is `none`): exNodes the LoRS 0.82 tools can download.
    pub zlib: bool,
    /// `aes` (AES-256-GCM) or `chacha` (ChaCha20-Poly1305); the key is kept
    /// in the exNode.
    pub encrypt: Option<String>,
    /// The unit the functions work on [default: `E2E_BLOCKSIZE` of
    /// `~/.xndrc`, else 1 MiB].
    pub block_size: Option<u64>,
}

impl E2e {
    /// The codec these choices make, `None` for none; the error says which
    /// choice cannot be had.
    pub fn codec(&self, rc: &Xndrc) -> Result<Option<Codec>, String> {
        if self.none {
            return Ok(None);
        }
        let block_size = self.block_size.or(rc.e2e_block_size).unwrap_or(1 << 20);
        if block_size == 0 || block_size > MAX_E2E_BLOCK {
            return Err("the e2e block size (-E) must be between 1 byte and 256 MiB".into());
        }
        let checksum = self.checksum.as_deref();
        if self.zlib {
            if self.compress || self.encrypt.is_some() {
                return Err(
                    "zlib (the LoRS format) cannot be combined with zstd or encryption".into(),
                );
            }
            let mut kinds = vec![LegacyKind::Zlib];
            match checksum {
                None | Some("md5") => kinds.push(LegacyKind::Checksum),
                Some("none") => {}
                Some(_) => {
                    return Err(
                        "zlib writes the LoRS format with the 64-bit LoRS MD5: use the checksum md5 (-k md5) or none (-k none)"
                            .into(),
                    );
                }
            }
            return Ok(Some(Codec::Legacy(LegacyChain::new(block_size, kinds))));
        }
        let mut steps = Vec::new();
        if self.compress {
            steps.push(Step::Zstd { level: 3 });
        }
        let random = || Step::random_key().map_err(|e| e.to_string());
        match self.encrypt.as_deref() {
            Some("aes") => steps.push(Step::Aes256Gcm { key: random()? }),
            Some("chacha") => steps.push(Step::ChaCha20Poly1305 { key: random()? }),
            Some(other) => return Err(format!("unknown cipher {other:?}: use aes or chacha")),
            None => {}
        }
        match checksum {
            None | Some("blake3") => steps.push(Step::Blake3),
            Some("md5") => steps.push(Step::Md5),
            Some("md5-rfc1321") => steps.push(Step::Md5Rfc1321),
            Some("none") => {}
            Some(other) => {
                return Err(format!(
                    "unknown checksum {other:?}: use blake3, md5, md5-rfc1321 or none"
                ));
            }
        }
        if steps.is_empty() {
            return Ok(None);
        }
        Ok(Some(Codec::Native(Chain { block_size, steps })))
    }
}
