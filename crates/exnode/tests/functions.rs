//! End-to-end functions: round trips, corruption detection, LoRS layout.

use lors_exnode::Mapping;
use lors_exnode::functions::{
    Chain, Codec, E2eError, LegacyChain, LegacyKind, STORED_BLAKE3, Step, stored_digest,
};
use lors_exnode::xml;
use proptest::prelude::*;

fn chains() -> Vec<Vec<Step>> {
    let k = Step::random_key().unwrap();
    vec![
        vec![Step::Blake3],
        vec![Step::Md5],
        vec![Step::Zstd { level: 3 }],
        vec![Step::Aes256Gcm { key: k }],
        vec![Step::ChaCha20Poly1305 { key: k }],
        vec![
            Step::Zstd { level: 3 },
            Step::Aes256Gcm { key: k },
            Step::Blake3,
        ],
        vec![
            Step::Zstd { level: 1 },
            Step::ChaCha20Poly1305 { key: k },
            Step::Md5,
        ],
        vec![Step::Aes256Gcm { key: k }, Step::Md5],
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn every_chain_round_trips_over_sizes(len in 0usize..20_000, bs in 1u64..5000, which in 0usize..8, seed: u8) {
        let chain = Chain { block_size: bs, steps: chains()[which].clone() };
        let data: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed) % 13).collect();
        let stored = chain.encode(&data);
        prop_assert_eq!(chain.decode(&stored, len as u64).unwrap(), data);
        // And through the exNode representation.
        let m = Mapping { e2e_blocksize: bs, function: chain.to_function(), ..Mapping::default() };
        let back = Chain::from_mapping(&m).unwrap().unwrap();
        prop_assert_eq!(back.decode(&stored, len as u64).unwrap().len(), len);
    }

    #[test]
    fn any_flipped_byte_is_detected(len in 1usize..5000, bs in 1u64..2000, at: prop::sample::Index, bit in 0u8..8, which in 0usize..8) {
        let steps = chains()[which].clone();
        prop_assume!(steps != vec![Step::Zstd { level: 3 }]); // compression alone has no integrity
        let codec = Codec::Native(Chain { block_size: bs, steps });
        let (mut stored, m) = as_uploaded(&codec, &vec![0x5au8; len]);
        let i = at.index(stored.len());
        stored[i] ^= 1 << bit;
        prop_assert!(read_back(&m, &stored).is_err());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]
    /// Any range of a chain of fixed overhead is read from the blocks that
    /// hold it alone, and a flipped byte in them is still caught.
    #[test]
    fn slices_give_the_blocks_of_a_range_and_catch_flips(
        len in 1usize..20_000, bs in 1u64..5000, which in 0usize..8,
        at: prop::sample::Index, span: prop::sample::Index, flip: prop::sample::Index,
    ) {
        let codec = Codec::Native(Chain { block_size: bs, steps: chains()[which].clone() });
        let data: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31) ^ (i >> 8) as u8).collect();
        let (stored, m) = as_uploaded(&codec, &data);
        let start = at.index(len) as u64;
        let n = 1 + span.index(len - start as usize) as u64;
        let framed = chains()[which].iter().any(|s| matches!(s, Step::Zstd { .. }));
        // Compression has no fixed layout; our MD5 chains carry a digest of
        // the whole mapping: both are read whole.
        let whole = framed || codec.needs_stored_digest();
        prop_assert_eq!(codec.is_sliceable(&m), !whole);
        let Some(s) = codec.slice(&m, start, n) else {
            prop_assert!(whole);
            return Ok(());
        };
        prop_assert!(s.logical.start <= start && start + n <= s.logical.end);
        prop_assert!(s.logical.start % bs == 0 && s.logical.end - s.logical.start <= (n / bs + 2) * bs);
        let part = &stored[s.stored.start as usize..s.stored.end as usize];
        let got = codec.decode_slice(&s, part).unwrap();
        prop_assert_eq!(&got[..], &data[s.logical.start as usize..s.logical.end as usize]);
        let mut bad = part.to_vec();
        let i = flip.index(bad.len());
        bad[i] ^= 0x10;
        prop_assert!(codec.decode_slice(&s, &bad).is_err());
        // Checksums alone are checked in place, the data left where it is.
        let sums_only = chains()[which].iter().all(|s| matches!(s, Step::Blake3 | Step::Md5));
        match codec.check_slice(&s, part).unwrap() {
            Some(parts) => {
                prop_assert!(sums_only);
                let joined: Vec<u8> = parts.iter().flat_map(|r| part[r.clone()].to_vec()).collect();
                prop_assert_eq!(joined, got);
                prop_assert!(codec.check_slice(&s, &bad).is_err());
            }
            None => prop_assert!(!sums_only),
        }
        prop_assert!(codec.decode_slice(&s, &part[1..]).is_err());
        prop_assert!(codec.slice(&m, start, 0).is_none());
        prop_assert!(codec.slice(&m, len as u64, 1).is_none());
        prop_assert!(codec.slice(&m, u64::MAX, 2).is_none());
    }
}

/// A mapping whose stored size does not add up is read whole, where the
/// mismatch is reported.
#[test]
fn a_mapping_of_the_wrong_stored_size_is_not_sliced() {
    let codec = Codec::Native(Chain {
        block_size: 8,
        steps: vec![Step::Blake3],
    });
    let (_, mut m) = as_uploaded(&codec, b"0123456789abcdef0");
    assert!(codec.slice(&m, 0, 4).is_some());
    m.alloc_length += 1;
    assert!(codec.slice(&m, 0, 4).is_none());
}

/// Encodes `data` as `lors upload` does: the mapping records the chain and,
/// where the chain needs one, the stored bytes' BLAKE3; then through XML.
fn as_uploaded(codec: &Codec, data: &[u8]) -> (Vec<u8>, Mapping) {
    let (stored, function) = codec.encode(data).unwrap();
    let m = Mapping {
        logical_length: data.len() as u64,
        alloc_length: stored.len() as u64,
        e2e_blocksize: codec.e2e_blocksize(),
        function,
        metadata: codec
            .needs_stored_digest()
            .then(|| stored_digest(&stored))
            .into_iter()
            .collect(),
        ..Mapping::default()
    };
    let x = lors_exnode::ExNode {
        mappings: vec![m],
        ..Default::default()
    };
    let m = xml::parse(xml::write(&x).as_bytes())
        .unwrap()
        .mappings
        .remove(0);
    (stored, m)
}

/// Decodes as `lors download` does.
fn read_back(m: &Mapping, stored: &[u8]) -> Result<Vec<u8>, E2eError> {
    Codec::from_mapping(m)
        .unwrap()
        .unwrap()
        .decode_mapping(m, stored)
}

/// LoRS 0.82's MD5 on 64-bit hosts ORs bits together in its rotation, so
/// some single-bit flips keep the digest: the LoRS checksum alone (all that
/// `lors_download` checks) misses them. Our uploads record the stored
/// bytes' BLAKE3 beside it, which catches them.
#[test]
fn lors_md5_misses_flips_that_the_stored_digest_catches() {
    let xor = LegacyKind::Xor {
        key: b"k3Y!x9q".to_vec(),
    };
    let codec = Codec::Legacy(LegacyChain::new(350, vec![xor, LegacyKind::Checksum]));
    let (stored, m) = as_uploaded(&codec, &[7u8; 350]);
    assert!(m.metadata.iter().any(|x| x.name == STORED_BLAKE3));
    let recorded = Codec::from_mapping(&m).unwrap().unwrap();
    let mut missed = 0;
    for i in 0..stored.len() {
        for bit in 0..8 {
            let mut s = stored.clone();
            s[i] ^= 1 << bit;
            if recorded.decode(&s, 350).is_ok() {
                missed += 1;
            }
            assert!(read_back(&m, &s).is_err(), "flip at {i} bit {bit}");
        }
    }
    assert!(
        missed > 0,
        "the LoRS digest alone is known to miss some flips"
    );
    // A digest that is not 64 hex digits is an error, not a pass.
    let mut bad = m.clone();
    bad.metadata[0] = lors_exnode::Metadata::string(STORED_BLAKE3, "zz");
    assert!(read_back(&bad, &stored).is_err());
    // Strong chains need no extra digest.
    let strong = Codec::Native(Chain {
        block_size: 64,
        steps: vec![Step::Md5, Step::Blake3],
    });
    assert!(!strong.needs_stored_digest());
}

#[test]
fn md5_checksum_blocks_have_the_lors_layout() {
    let chain = Chain {
        block_size: 4,
        steps: vec![Step::Md5],
    };
    let stored = chain.encode(b"hello");
    // Two e2e blocks: "hell" and "o", each = 32 hex digits, ':', data. The
    // digests are LoRS 0.82's on a 64-bit host (64-bit UINT4), not md5sum's.
    let want = b"e53c819fced31b2fac750cd892369d8f:hell91ae8871ab56b458110da40a92cb2512:o";
    assert_eq!(stored, want.to_vec());
    let f = chain.to_function().unwrap();
    assert_eq!(f.name, "checksum");
    assert_eq!(
        f.argument("blocksize"),
        Some(&lors_exnode::Value::Integer(37)),
        "e2e block size + 33, as LoRS writes"
    );
    // The standard-MD5 variant, by name (digests from `printf hell | md5sum`).
    let rfc = Chain {
        block_size: 4,
        steps: vec![Step::Md5Rfc1321],
    };
    let std_stored = rfc.encode(b"hello");
    let want = b"4229d691b07b13341da53f17ab9f2416:helld95679752134a2d9eb61dbd7b91c4bcc:o";
    assert_eq!(std_stored, want.to_vec());
    assert_eq!(rfc.to_function().unwrap().name, "checksum");
    // A reader accepts either digest (and a mix of them), nothing else.
    for stored in [&stored, &std_stored] {
        assert_eq!(chain.decode(stored, 5).unwrap(), b"hello");
        assert_eq!(rfc.decode(stored, 5).unwrap(), b"hello");
    }
    let mixed = [&stored[..37], &std_stored[37..]].concat();
    assert_eq!(chain.decode(&mixed, 5).unwrap(), b"hello");
    let mut bad = stored.clone();
    bad[34] ^= 1;
    assert!(chain.decode(&bad, 5).is_err());
}

#[test]
fn lors_zlib_chain_checksums_with_the_64_bit_lors_digest() {
    let chain = LegacyChain::new(4, vec![LegacyKind::Checksum]);
    let (stored, _) = chain.encode(b"hello").unwrap();
    assert_eq!(
        stored,
        b"e53c819fced31b2fac750cd892369d8f:hell91ae8871ab56b458110da40a92cb2512:o".to_vec()
    );
}

#[test]
fn functions_nest_with_the_last_applied_outermost() {
    let k = [7u8; 32];
    let chain = Chain {
        block_size: 1024,
        steps: vec![
            Step::Zstd { level: 3 },
            Step::Aes256Gcm { key: k },
            Step::Blake3,
        ],
    };
    let f = chain.to_function().unwrap();
    let names: Vec<&str> = f.chain().iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        names,
        ["blake3_checksum", "aes256gcm_encrypt", "zstd_compress"]
    );
    assert!(
        !format!("{:?}", chain).contains("7, 7"),
        "keys stay out of Debug output"
    );
}

#[test]
fn unknown_and_malformed_functions_are_reported() {
    let mut m = Mapping {
        e2e_blocksize: 10,
        ..Mapping::default()
    };
    m.function = Some(lors_exnode::Function {
        name: "des_encrypt".into(),
        ..Default::default()
    });
    assert_eq!(
        Chain::from_mapping(&m),
        Err(E2eError::Unsupported("des_encrypt".into()))
    );
    m.function = Some(lors_exnode::Function {
        name: "aes256gcm_encrypt".into(),
        ..Default::default()
    });
    assert!(matches!(
        Chain::from_mapping(&m),
        Err(E2eError::Malformed(_))
    ));
}

#[test]
fn decompression_is_bounded_by_the_block_size() {
    // A zstd frame that inflates to 64 MiB, stored as a 1 KiB block.
    let bomb = zstd_bomb();
    let mut stored = (bomb.len() as u32).to_le_bytes().to_vec();
    stored.extend_from_slice(&bomb);
    let chain = Chain {
        block_size: 1024,
        steps: vec![Step::Zstd { level: 3 }],
    };
    assert!(matches!(
        chain.decode(&stored, 1024),
        Err(E2eError::Corrupt { .. })
    ));
}

fn zstd_bomb() -> Vec<u8> {
    let chain = Chain {
        block_size: 64 << 20,
        steps: vec![Step::Zstd { level: 19 }],
    };
    let enc = chain.encode(&vec![0u8; 64 << 20]);
    enc[4..].to_vec()
}

// --- The original LoRS functions (xor_encrypt, aes_encrypt, zlib_compress) ---

fn legacy_chains() -> Vec<Vec<LegacyKind>> {
    let xor = LegacyKind::Xor {
        key: b"k3Y!x9q".to_vec(),
    };
    let aes = LegacyKind::Aes { key: [0x42; 16] };
    vec![
        vec![LegacyKind::Checksum],
        vec![xor.clone()],
        vec![aes.clone()],
        vec![LegacyKind::Zlib],
        vec![aes.clone(), LegacyKind::Checksum],
        vec![xor, LegacyKind::Checksum],
        vec![LegacyKind::Zlib, LegacyKind::Checksum],
        vec![LegacyKind::Checksum, aes.clone()],
        vec![LegacyKind::Zlib, aes, LegacyKind::Checksum],
    ]
}

/// What `lors_download` finds: the mapping as our writer records it,
/// parsed back from XML.
fn through_xml(rec: &LegacyChain, len: u64, stored: u64) -> Mapping {
    let x = lors_exnode::ExNode {
        mappings: vec![Mapping {
            logical_length: len,
            alloc_length: stored,
            e2e_blocksize: rec.e2e_blocksize,
            function: rec.to_function(),
            ..Mapping::default()
        }],
        ..Default::default()
    };
    xml::parse(xml::write(&x).as_bytes())
        .unwrap()
        .mappings
        .remove(0)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn legacy_chains_round_trip_through_the_exnode(len in 1usize..20_000, bs in 1u64..5000, which in 0usize..9, seed: u8) {
        let data: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) % 17).collect();
        let (stored, rec) = LegacyChain::new(bs, legacy_chains()[which].clone()).encode(&data).unwrap();
        let m = through_xml(&rec, len as u64, stored.len() as u64);
        let codec = Codec::from_mapping(&m).unwrap().unwrap();
        prop_assert_eq!(codec.decode(&stored, len as u64).unwrap(), data);
    }

    #[test]
    fn legacy_checksum_outermost_catches_any_flip(len in 1usize..5000, bs in 1u64..2000, at: prop::sample::Index, bit in 0u8..8, which in 4usize..7) {
        let codec = Codec::Legacy(LegacyChain::new(bs, legacy_chains()[which].clone()));
        let (mut stored, m) = as_uploaded(&codec, &vec![7u8; len]);
        let i = at.index(stored.len());
        stored[i] ^= 1 << bit;
        prop_assert!(read_back(&m, &stored).is_err());
    }

    #[test]
    fn legacy_decoding_hostile_bytes_never_panics(stored in prop::collection::vec(any::<u8>(), 0..600), len in 0u64..1000, which in 0usize..9, bs in 1u64..300) {
        let (_, rec) = LegacyChain::new(bs, legacy_chains()[which].clone()).encode(b"x").unwrap();
        let _ = rec.decode(&stored, len);
    }
}

#[test]
fn lors_aes_fixture_is_decoded_by_the_legacy_codec() {
    let x = xml::parse(include_bytes!("fixtures/aes.xnd")).unwrap();
    let Some(Codec::Legacy(c)) = Codec::from_mapping(&x.mappings[0]).unwrap() else {
        panic!("aes_encrypt must select the LoRS codec");
    };
    let names: Vec<(String, u64)> = c
        .steps
        .iter()
        .map(|s| (format!("{s:?}"), s.blocksize))
        .collect();
    assert_eq!(
        names,
        [
            ("aes_encrypt(key redacted)/32784".to_string(), 32784),
            ("checksum/32817".to_string(), 32817)
        ]
    );
    // The fixture's sizes are the ones this layout produces for 32 KiB.
    let (stored, rec) = LegacyChain::new(
        32768,
        vec![LegacyKind::Aes { key: [1; 16] }, LegacyKind::Checksum],
    )
    .encode(&[0u8; 32768])
    .unwrap();
    assert_eq!(stored.len() as u64, x.mappings[0].alloc_length);
    assert_eq!(rec.steps[1].blocksize, 32817);
}

#[test]
fn des_exnodes_get_a_clear_error() {
    let m = Mapping {
        e2e_blocksize: 10,
        function: Some(lors_exnode::Function {
            name: "des_encrypt".into(),
            arguments: vec![
                lors_exnode::Metadata::string("KEY", "abcdefg"),
                lors_exnode::Metadata::integer("blocksize", 16),
            ],
            ..Default::default()
        }),
        ..Mapping::default()
    };
    let e = Codec::from_mapping(&m).unwrap_err().to_string();
    assert!(e.contains("des_encrypt") && e.contains("64-bit"), "{e}");
}

#[test]
fn zlib_bombs_are_refused_before_inflating() {
    // 64 MiB of zeros compressed, claimed by a 1 KiB mapping.
    let (stored, rec) = LegacyChain::new(1 << 20, vec![LegacyKind::Zlib])
        .encode(&vec![0u8; 64 << 20])
        .unwrap();
    assert!(stored.len() < 100_000);
    assert!(matches!(
        rec.decode(&stored, 1024),
        Err(E2eError::Corrupt { .. })
    ));
}
