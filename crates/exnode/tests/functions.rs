//! End-to-end functions: round trips, corruption detection, LoRS layout.

use lors_exnode::Mapping;
use lors_exnode::functions::{Chain, E2eError, Step};
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
        let chain = Chain { block_size: bs, steps };
        let data = vec![0x5au8; len];
        let mut stored = chain.encode(&data);
        let i = at.index(stored.len());
        stored[i] ^= 1 << bit;
        prop_assert!(chain.decode(&stored, len as u64).is_err());
    }
}

#[test]
fn md5_checksum_blocks_have_the_lors_layout() {
    let chain = Chain {
        block_size: 4,
        steps: vec![Step::Md5],
    };
    let stored = chain.encode(b"hello");
    // Two e2e blocks: "hell" and "o", each = 32 hex MD5 digits, ':', data.
    // (digests from `printf hell | md5sum` and `printf o | md5sum`)
    let want = b"4229d691b07b13341da53f17ab9f2416:helld95679752134a2d9eb61dbd7b91c4bcc:o";
    assert_eq!(stored, want.to_vec());
    let f = chain.to_function().unwrap();
    assert_eq!(f.name, "checksum");
    assert_eq!(
        f.argument("blocksize"),
        Some(&lors_exnode::Value::Integer(37)),
        "e2e block size + 33, as LoRS writes"
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
