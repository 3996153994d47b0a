use proptest::prelude::*;

use super::fields::{parse_key_token, parse_timeout};
use super::*;
use crate::caps::{CapKind, Capability, Key};
use crate::proto::MAX_CHKSUM_BLOCK;
use crate::proto::chksum::{ChksumType, NetChksum};

fn key_text() -> impl Strategy<Value = String> {
    "[A-Za-z0-9+-]{1,40}"
}

fn key_token() -> impl Strategy<Value = KeyToken> {
    (proptest::option::of("[0-9a-z]{1,8}"), key_text()).prop_map(|(rid, k)| KeyToken {
        rid,
        key: Key::new(&k).unwrap(),
    })
}

fn timeout() -> impl Strategy<Value = Timeout> {
    prop_oneof![
        Just(Timeout::Default),
        (1u32..=u32::MAX).prop_map(Timeout::Secs)
    ]
}

fn version() -> impl Strategy<Value = Version> {
    prop_oneof![Just(Version::V13), Just(Version::V14)]
}

fn typekey() -> impl Strategy<Value = String> {
    "[0-9]{1,20}"
}

fn capability() -> impl Strategy<Value = Capability> {
    (
        "[a-z0-9.]{1,20}",
        1u16..,
        "[0-9]{1,3}",
        key_text(),
        typekey(),
    )
        .prop_map(|(h, p, rid, k, t)| Capability {
            host: h,
            port: p,
            rid: Some(rid),
            key: Key::new(&k).unwrap(),
            typekey: t,
            kind: CapKind::Write,
        })
}

fn keyed() -> impl Strategy<Value = Keyed> {
    (version(), key_token(), typekey(), timeout()).prop_map(|(version, key, typekey, timeout)| {
        Keyed {
            version,
            key,
            typekey,
            timeout,
        }
    })
}

/// A lease as ALLOCATE carries it (`-1` is the longest).
fn lease() -> impl Strategy<Value = Lease> {
    prop_oneof![
        Just(Lease::Longest),
        (0..=i64::MAX as u64).prop_map(Lease::Secs)
    ]
}

fn manage_op() -> impl Strategy<Value = ManageOp> {
    prop_oneof![
        (0u32..4).prop_map(|c| ManageOp::Probe { cap_type: c }),
        (0u32..4).prop_map(|c| ManageOp::Incr { cap_type: c }),
        (0u32..4).prop_map(|c| ManageOp::Decr { cap_type: c }),
        (
            0u32..4,
            any::<u64>(),
            proptest::option::of(0..=i64::MAX as u64),
            proptest::option::of(reliability())
        )
            .prop_map(|(c, s, d, r)| ManageOp::Change {
                cap_type: c,
                max_size: s,
                duration: d,
                reliability: r,
            }),
        any::<u64>().prop_map(|s| ManageOp::Truncate { size: s }),
    ]
}

fn status_op(v: Version) -> BoxedStrategy<StatusOp> {
    let pw = "[a-zA-Z0-9@]{1,12}";
    match v {
        Version::V13 => prop_oneof![
            pw.prop_map(|p| StatusOp::Inquire {
                rid: None,
                password: p
            }),
            pw.prop_map(|p| StatusOp::Change {
                rid: None,
                password: p
            }),
        ]
        .boxed(),
        Version::V14 => prop_oneof![
            ("[0-9a-z]{1,8}", pw).prop_map(|(r, p)| StatusOp::Inquire {
                rid: Some(r),
                password: p
            }),
            ("[0-9a-z]{1,8}", pw).prop_map(|(r, p)| StatusOp::Change {
                rid: Some(r),
                password: p
            }),
            Just(StatusOp::Resources),
            Just(StatusOp::Version),
        ]
        .boxed(),
    }
}

fn reliability() -> impl Strategy<Value = Reliability> {
    prop_oneof![Just(Reliability::Soft), Just(Reliability::Hard)]
}

fn alloc_type() -> impl Strategy<Value = AllocType> {
    prop_oneof![
        Just(AllocType::ByteArray),
        Just(AllocType::Buffer),
        Just(AllocType::Fifo),
        Just(AllocType::Circular)
    ]
}

fn allocate(version: Version) -> impl Strategy<Value = Allocate> {
    (
        "[0-9a-z]{1,8}",
        reliability(),
        alloc_type(),
        lease(),
        any::<u64>(),
        timeout(),
    )
        .prop_map(move |(rid, r, t, lease, size, timeout)| Allocate {
            version,
            rid: (version == Version::V14).then_some(rid),
            reliability: r,
            alloc_type: t,
            lease,
            size,
            timeout,
        })
}

fn request() -> impl Strategy<Value = Request> {
    let off_len = || (0u64..u64::MAX / 2, 0u64..u64::MAX / 2);
    prop_oneof![
        version()
            .prop_flat_map(allocate)
            .prop_map(Request::Allocate),
        (keyed(), any::<u64>()).prop_map(|(at, length)| Request::Store(Store { at, length })),
        (keyed(), off_len())
            .prop_map(|(at, (offset, length))| { Request::Write(Write { at, offset, length }) }),
        (keyed(), off_len())
            .prop_map(|(at, (offset, length))| { Request::Load(Load { at, offset, length }) }),
        (keyed(), capability(), off_len(), timeout(), timeout()).prop_map(
            |(at, dest, (offset, length), t2, t3)| {
                Request::Send(Send {
                    at,
                    dest,
                    offset,
                    length,
                    dest_timeout: t2,
                    client_timeout: t3,
                })
            }
        ),
        (keyed(), manage_op()).prop_map(|(at, op)| Request::Manage(Manage { at, op })),
        version()
            .prop_flat_map(|v| (Just(v), status_op(v), timeout()))
            .prop_map(|(version, op, timeout)| Request::Status(Status {
                version,
                op,
                timeout
            })),
    ]
}

fn alias_op() -> impl Strategy<Value = AliasOp> {
    let master = || (key_token(), typekey());
    prop_oneof![
        (0u32..4).prop_map(|cap_type| AliasOp::Probe { cap_type }),
        (0u32..4, master()).prop_map(|(cap_type, (master, master_typekey))| {
            AliasOp::Incr {
                cap_type,
                master,
                master_typekey,
            }
        }),
        (0u32..4, master()).prop_map(|(cap_type, (master, master_typekey))| {
            AliasOp::Decr {
                cap_type,
                master,
                master_typekey,
            }
        }),
        (
            proptest::option::of(0u32..4),
            (0u64..u64::MAX / 2, 0u64..u64::MAX / 2),
            proptest::option::of(lease()),
            master()
        )
            .prop_map(
                |(cap_type, (offset, length), lease, (master, master_typekey))| {
                    AliasOp::Change {
                        cap_type,
                        offset,
                        length,
                        lease: lease.map(|l| match l {
                            Lease::Secs(0) => Lease::Longest,
                            l => l,
                        }),
                        master,
                        master_typekey,
                    }
                }
            ),
    ]
}

/// LStore's extensions (commands 14, 15, 29, 31, 32).
fn lstore_request() -> impl Strategy<Value = Request> {
    prop_oneof![
        (
            keyed(),
            (0u64..u64::MAX / 2, 0u64..u64::MAX / 2),
            proptest::option::of(1u64..)
        )
            .prop_map(|(at, (offset, length), secs)| {
                Request::AliasAllocate(AliasAllocate {
                    at,
                    offset,
                    length,
                    lease: secs.map_or(Lease::Longest, Lease::Secs),
                })
            }),
        (keyed(), alias_op()).prop_map(|(at, op)| Request::AliasManage(AliasManage { at, op })),
        (
            proptest::option::of((1i64..=4, 1u64..=MAX_CHKSUM_BLOCK)),
            allocate(Version::V14)
        )
            .prop_map(|(cs, alloc)| Request::AllocateChksum(AllocateChksum {
                chksum: cs.map(|(k, b)| NetChksum {
                    kind: ChksumType::from_number(k).unwrap(),
                    block_size: b
                }),
                alloc,
            })),
        (keyed(), any::<bool>(), any::<bool>()).prop_map(|(at, flag, get)| {
            let q = ChksumQuery { at, flag };
            if get {
                Request::GetChksum(q)
            } else {
                Request::ValidateChksum(q)
            }
        }),
    ]
}

proptest! {
    #[test]
    fn lstore_extensions_round_trip_through_the_codec(req in lstore_request()) {
        let line = req.encode();
        prop_assert!(line.len() <= MAX_LINE_BYTES);
        prop_assert_eq!(Request::parse(line.as_bytes()), Ok(req));
    }

    #[test]
    fn every_request_round_trips_through_the_codec(req in request()) {
        let line = req.encode();
        prop_assert!(line.len() <= MAX_LINE_BYTES);
        prop_assert_eq!(Request::parse(line.as_bytes()), Ok(req));
    }

    #[test]
    fn checksummed_requests_round_trip(
        at in keyed(),
        (offset, length) in (0u64..u64::MAX / 2, 0u64..u64::MAX / 2),
        kind in 1i64..=4,
        block_size in 1u64..=MAX_CHKSUM_BLOCK,
        which in 0..3,
    ) {
        let req = match which {
            0 => Plain::Store(Store { at, length }),
            1 => Plain::Write(Write { at, offset, length }),
            _ => Plain::Load(Load { at, offset, length }),
        };
        let chksum = NetChksum { kind: ChksumType::from_number(kind).unwrap(), block_size };
        let req = Request::Checksummed(Checksummed { chksum, req });
        let line = req.encode();
        prop_assert_eq!(Request::parse(line.as_bytes()), Ok(req));
    }

    #[test]
    fn parser_never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let _ = Request::parse(&bytes);
    }
}

#[test]
fn parses_what_lors_0_82_sends() {
    // ibp-protocol.md §1.10, observed traffic of the original tools.
    let r = Request::parse(b"1 4 0 1 ibp 0\n").unwrap();
    assert_eq!(
        r,
        Request::Status(Status {
            version: Version::V14,
            op: StatusOp::Inquire {
                rid: Some("0".into()),
                password: "ibp".into()
            },
            timeout: Timeout::Default
        })
    );
    let r = Request::parse(b"0 4 1 ibp 0\n").unwrap();
    assert!(matches!(
        r,
        Request::Status(Status {
            version: Version::V13,
            op: StatusOp::Inquire { rid: None, .. },
            ..
        })
    ));
    let r = Request::parse(b"1 1 0 2 1 3600 65536 0\n").unwrap();
    assert!(matches!(
        r,
        Request::Allocate(Allocate {
            size: 65536,
            lease: Lease::Secs(3600),
            ..
        })
    ));
    let r = Request::parse(b"0 2 1#abcDEF12 14571742334203452377 65536 30 \n").unwrap();
    assert!(matches!(
        r,
        Request::Store(Store {
            at: Keyed {
                version: Version::V13,
                timeout: Timeout::Secs(30),
                ..
            },
            length: 65536,
        })
    ));
    let r = Request::parse(b"0 9 1#abcDEF12 1457 40 0 0 0 0 0\n").unwrap();
    assert!(matches!(
        r,
        Request::Manage(Manage {
            op: ManageOp::Probe { cap_type: 0 },
            ..
        })
    ));
    let r = Request::parse(b"0 8 1#abcDEF12 1457 0 65536 61 \n").unwrap();
    assert!(matches!(
        r,
        Request::Load(Load {
            offset: 0,
            length: 65536,
            ..
        })
    ));
    // The reference depot's RID-less STATUS forms.
    assert!(matches!(
        Request::parse(b"1 4 3 10\n").unwrap(),
        Request::Status(Status {
            op: StatusOp::Resources,
            ..
        })
    ));
    assert!(matches!(
        Request::parse(b"1 4 5 10\n").unwrap(),
        Request::Status(Status {
            op: StatusOp::Version,
            ..
        })
    ));
}

/// Found by the `ibp_request` fuzz target: the RID-less v1.4 INQ re-encoded
/// with RID 0.
#[test]
fn rid_less_v14_inquiry_round_trips() {
    let r = Request::parse(b"1 4  1 4  44410").unwrap();
    assert_eq!(Request::parse(r.encode().as_bytes()), Ok(r));
}

#[test]
fn fractional_and_zero_timeouts_mean_default() {
    assert_eq!(parse_timeout("0"), Ok(Timeout::Default));
    assert_eq!(parse_timeout("0.5"), Ok(Timeout::Default));
    assert_eq!(parse_timeout(".5"), Ok(Timeout::Default));
    assert_eq!(parse_timeout("2.5"), Ok(Timeout::Secs(3)));
    assert_eq!(parse_timeout("2.0"), Ok(Timeout::Secs(2)));
    assert!(parse_timeout("-1").is_err());
    assert!(parse_timeout("1e3").is_err());
    assert!(parse_timeout(".").is_err());
    // Found by the fuzzer: rounding u64::MAX up must not overflow.
    assert_eq!(
        parse_timeout("18446744073709551615.4"),
        Ok(Timeout::Secs(u32::MAX))
    );
}

/// One named case per malformed-input class, with the status the depot sends.
#[test]
fn parses_what_lstore_sends_with_network_checksums() {
    // ibp_perf -network_chksum MD5 64: write_command / read_command / append_command.
    let w = Request::parse(b"1 27 4 65536 0#abcdefgh 77 131072 65536 30\n").unwrap();
    let Request::Checksummed(Checksummed { chksum, req }) = w else {
        panic!("{w:?}")
    };
    assert_eq!(chksum.kind, ChksumType::Md5);
    assert_eq!(chksum.block_size, 65536);
    assert!(matches!(
        req,
        Plain::Write(Write {
            offset: 131072,
            length: 65536,
            ..
        })
    ));
    let l = Request::parse(b"1 24 1 1024 0#abcdefgh 77 0 10 30\n").unwrap();
    assert!(matches!(
        l,
        Request::Checksummed(Checksummed {
            req: Plain::Load(Load { length: 10, .. }),
            ..
        })
    ));
    let s = Request::parse(b"1 28 3 1 0#abcdefgh 77 5 30\n").unwrap();
    assert!(matches!(
        s,
        Request::Checksummed(Checksummed {
            req: Plain::Store(Store { length: 5, .. }),
            ..
        })
    ));
}

#[test]
fn parses_what_lstore_sends_for_aliases_and_disk_checksums() {
    // ibp_perf -proxy: proxy_allocate_command, proxy_probe_command,
    // proxy_modify_count_command (remove), proxy_modify_alloc_command.
    assert_eq!(
        Request::parse(b"1 14 0#mkey 77 0 0 0 30\n").unwrap(),
        Request::AliasAllocate(AliasAllocate {
            at: Keyed {
                version: Version::V14,
                key: parse_key_token("0#mkey").unwrap(),
                typekey: "77".into(),
                timeout: Timeout::Secs(30),
            },
            offset: 0,
            length: 0,
            lease: Lease::Longest,
        })
    );
    let probe = Request::parse(b"1 15 0#akey 77 40 3 30 \n").unwrap();
    assert!(matches!(
        probe,
        Request::AliasManage(AliasManage {
            op: AliasOp::Probe { cap_type: 3 },
            ..
        })
    ));
    let remove = Request::parse(b"1 15 0#akey 77 42 1 0#mkey 78 30\n").unwrap();
    let Request::AliasManage(AliasManage {
        op:
            AliasOp::Decr {
                cap_type: 1,
                master,
                master_typekey,
            },
        ..
    }) = remove
    else {
        panic!("{remove:?}")
    };
    assert_eq!(master.key.expose(), "mkey");
    assert_eq!(master_typekey, "78");
    // LStore's client sends no cap type in CHNG; the ACCRE depot reads one.
    for (line, cap) in [
        (&b"1 15 0#akey 77 43 10 20 60 0#mkey 78 30\n"[..], None),
        (b"1 15 0#akey 77 43 3 10 20 60 0#mkey 78 30\n", Some(3)),
    ] {
        let r = Request::parse(line).unwrap();
        assert!(
            matches!(
                &r,
                Request::AliasManage(AliasManage {
                    op: AliasOp::Change {
                        cap_type,
                        offset: 10,
                        length: 20,
                        lease: Some(Lease::Secs(60)),
                        ..
                    },
                    ..
                }) if *cap_type == cap
            ),
            "{r:?}"
        );
    }
    // ibp_perf -disk_chksum MD5 65536: allocate_command.
    let a = Request::parse(b"1 29 4 65536 0 2 1 900 1048576 30\n").unwrap();
    let Request::AllocateChksum(AllocateChksum {
        chksum: Some(cs),
        alloc,
    }) = a
    else {
        panic!("{a:?}")
    };
    assert_eq!((cs.kind, cs.block_size), (ChksumType::Md5, 65536));
    assert_eq!((alloc.size, alloc.lease), (1_048_576, Lease::Secs(900)));
    // CHKSUM_NONE takes any block size, even none.
    assert!(matches!(
        Request::parse(b"1 29 0 0 0 2 1 900 10 30\n").unwrap(),
        Request::AllocateChksum(AllocateChksum { chksum: None, .. })
    ));
    assert!(matches!(
        Request::parse(b"1 31 0#mkey 77 1 30\n").unwrap(),
        Request::GetChksum(ChksumQuery { flag: true, .. })
    ));
    assert!(matches!(
        Request::parse(b"1 32 0#mkey 77 0 30\n").unwrap(),
        Request::ValidateChksum(ChksumQuery { flag: false, .. })
    ));
}

#[test]
fn rejection_table() {
    let long = format!("1 8 1#k 1 0 1 {}\n", "9".repeat(MAX_LINE_BYTES));
    let many = format!("1 2 {}\n", "1 ".repeat(40));
    let cases: Vec<(&str, &[u8], StatusCode)> = vec![
        ("garbage", b"garbage\n", StatusCode::BAD_FORMAT),
        ("empty line", b"\n", StatusCode::BAD_FORMAT),
        ("version only", b"1\n", StatusCode::BAD_FORMAT),
        ("non-numeric command", b"1 x\n", StatusCode::BAD_FORMAT),
        (
            "unknown command",
            b"1 77 a b\n",
            StatusCode::UNKNOWN_FUNCTION,
        ),
        (
            "unsupported version",
            b"7 1 0 2 1 10 10 10\n",
            StatusCode::PROT_VERS,
        ),
        ("line too long", long.as_bytes(), StatusCode::BAD_FORMAT),
        (
            "checksum type none",
            b"1 27 0 64 0#k 1 0 1 1\n",
            StatusCode::CHKSUM_TYPE,
        ),
        (
            "unknown checksum type",
            b"1 24 9 64 0#k 1 0 1 1\n",
            StatusCode::CHKSUM_TYPE,
        ),
        (
            "checksum block size 0",
            b"1 28 1 0 0#k 1 1 1\n",
            StatusCode::CHKSUM_BLOCKSIZE,
        ),
        (
            "checksum block size above 2 GiB",
            b"1 28 1 2147483649 0#k 1 1 1\n",
            StatusCode::CHKSUM_BLOCKSIZE,
        ),
        (
            "checksummed write missing fields",
            b"1 27 1 64 0#k 1 0 1\n",
            StatusCode::BAD_FORMAT,
        ),
        ("too many fields", many.as_bytes(), StatusCode::BAD_FORMAT),
        (
            "alias allocate missing duration",
            b"1 14 0#k 1 0 0 10\n",
            StatusCode::BAD_FORMAT,
        ),
        (
            "alias window overflow",
            b"1 14 0#k 1 18446744073709551615 1 0 10\n",
            StatusCode::INVALID_PARAMETER,
        ),
        (
            "alias allocate negative duration",
            b"1 14 0#k 1 0 0 -5 10\n",
            StatusCode::INVALID_PARAMETER,
        ),
        (
            "alias manage truncate",
            b"1 15 0#k 1 45 10 10\n",
            StatusCode::INVALID_PARAMETER,
        ),
        (
            "alias incr without master",
            b"1 15 0#k 1 41 1 10\n",
            StatusCode::BAD_FORMAT,
        ),
        (
            "alias chng missing field",
            b"1 15 0#k 1 43 0 10 0#m 1 10\n",
            StatusCode::BAD_FORMAT,
        ),
        (
            "disk checksum type unknown",
            b"1 29 7 64 0 2 1 10 10 10\n",
            StatusCode::CHKSUM_TYPE,
        ),
        (
            "disk checksum block size 0",
            b"1 29 1 0 0 2 1 10 10 10\n",
            StatusCode::CHKSUM_BLOCKSIZE,
        ),
        (
            "disk checksum block size above 2 GiB",
            b"1 29 0 2147483649 0 2 1 10 10 10\n",
            StatusCode::CHKSUM_BLOCKSIZE,
        ),
        (
            "disk checksum allocate without rid",
            b"1 29 1 64 2 1 10 10 10\n",
            StatusCode::BAD_FORMAT,
        ),
        (
            "negative validate flag",
            b"1 32 0#k 1 -1 10\n",
            StatusCode::INVALID_PARAMETER,
        ),
        (
            "non-ascii",
            "1 8 1#kéy 1 0 1 1\n".as_bytes(),
            StatusCode::BAD_FORMAT,
        ),
        (
            "invalid utf8",
            b"1 8 \xff\xfe 1 0 1 1\n",
            StatusCode::BAD_FORMAT,
        ),
        ("nul byte", b"1 8 1#k\0 1 0 1 1\n", StatusCode::BAD_FORMAT),
        (
            "store missing field",
            b"1 2 1#k 1 10\n",
            StatusCode::BAD_FORMAT,
        ),
        (
            "store trailing field",
            b"1 2 1#k 1 10 10 10\n",
            StatusCode::BAD_FORMAT,
        ),
        (
            "negative length",
            b"1 2 1#k 1 -5 10\n",
            StatusCode::INVALID_PARAMETER,
        ),
        (
            "length overflow",
            b"1 2 1#k 1 99999999999999999999999 10\n",
            StatusCode::INVALID_PARAMETER,
        ),
        (
            "offset+length overflow",
            b"1 8 1#k 1 18446744073709551615 1 10\n",
            StatusCode::INVALID_PARAMETER,
        ),
        (
            "plus-signed number",
            b"1 8 1#k 1 +5 1 10\n",
            StatusCode::INVALID_PARAMETER,
        ),
        (
            "bad reliability",
            b"1 1 0 7 1 10 10 10\n",
            StatusCode::INVALID_PARAMETER,
        ),
        (
            "bad type",
            b"1 1 0 2 9 10 10 10\n",
            StatusCode::INVALID_PARAMETER,
        ),
        (
            "allocate v1.4 without rid",
            b"1 1 2 1 10 10 10\n",
            StatusCode::BAD_FORMAT,
        ),
        (
            "empty key",
            b"1 8 1# 1 0 1 1\n",
            StatusCode::INVALID_PARAMETER,
        ),
        (
            "key with slash",
            b"1 8 1#a/b 1 0 1 1\n",
            StatusCode::INVALID_PARAMETER,
        ),
        (
            "bad timeout",
            b"1 8 1#k 1 0 1 soon\n",
            StatusCode::INVALID_PARAMETER,
        ),
        (
            "send bad cap",
            b"1 5 1#k http://x/y 1 0 1 1 1 1\n",
            StatusCode::WRONG_CAP_FORMAT,
        ),
        (
            "manage unknown sub",
            b"1 9 1#k 1 99 1 10\n",
            StatusCode::INVALID_PARAMETER,
        ),
        (
            "probe wrong count",
            b"1 9 1#k 1 40 0 10\n",
            StatusCode::BAD_FORMAT,
        ),
        (
            "status unknown sub",
            b"1 4 0 9 pw 10\n",
            StatusCode::INVALID_PARAMETER,
        ),
        (
            "status wrong count",
            b"1 4 0 1 pw 1 2 3\n",
            StatusCode::BAD_FORMAT,
        ),
    ];
    for (name, line, status) in cases {
        match Request::parse(line) {
            Ok(r) => panic!("{name}: accepted as {r:?}"),
            Err(e) => assert_eq!(e.status(), status, "{name}: {e}"),
        }
    }
}

#[test]
fn unserved_commands_are_sorted_by_whether_data_follows() {
    // ALIAS_ALLOCATE, RENAME, MERGE, PUSH, GET_CHKSUM, VEC_READ.
    for n in [14, 16, 19, 20, 31, 35] {
        assert!(sends_no_data(n), "{n}");
    }
    // VEC_WRITE and its checksummed form, LoCI DELIVER, ACCRE internal, unknown.
    for n in [33, 34, 3, 90, 77, -1, i64::MAX] {
        assert!(!sends_no_data(n), "{n}");
    }
}
