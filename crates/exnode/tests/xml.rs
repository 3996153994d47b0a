//! exNode XML: fixtures in the LoRS format, round trips, hostile input.

use lors_exnode::ExNode;
use lors_exnode::model::{Function, Mapping, Metadata, Value};
use lors_exnode::xml::{self, Limits, XmlError};
use lors_ibp::caps::{CapKind, Capability, Key};
use proptest::prelude::*;

fn fixture(name: &str) -> ExNode {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    let bytes = std::fs::read(&path).unwrap();
    xml::parse(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn plain_fixture_parses_with_replica_ranges_and_caps() {
    let x = fixture("plain.xnd");
    assert_eq!(x.filename(), Some("data.bin"));
    assert_eq!(x.meta("lorsversion"), Some(&Value::Double(0.826)));
    assert_eq!(x.mappings.len(), 2);
    let m = &x.mappings[1];
    assert_eq!(
        (m.exnode_offset, m.logical_length, m.alloc_length),
        (1 << 20, 512 << 10, 512 << 10)
    );
    assert_eq!(m.read.as_ref().unwrap().kind, CapKind::Read);
    assert_eq!(m.depot().as_deref(), Some("depot2.example.org:6714"));
    assert_eq!(x.logical_size(), (1 << 20) + (512 << 10));
    assert!(x.holds_secrets());
}

#[test]
fn e2e_fixtures_parse_their_function_chains() {
    let x = fixture("checksum.xnd");
    let f = x.mappings[0].function.as_ref().unwrap();
    assert_eq!(f.name, "checksum");
    assert_eq!(f.argument("blocksize"), Some(&Value::Integer(1_048_609)));

    let x = fixture("aes.xnd");
    let m = &x.mappings[0];
    let chain: Vec<&str> = m
        .function
        .as_ref()
        .unwrap()
        .chain()
        .iter()
        .map(|f| f.name.as_str())
        .collect();
    assert_eq!(chain, ["checksum", "aes_encrypt"], "outermost first");
    let aes = &m.function.as_ref().unwrap().inner[0];
    assert_eq!(
        aes.argument("KEY"),
        Some(&Value::String("3f1a9c0b7d2e4f6a8b1c3d5e7f90a2b4".into()))
    );
    assert!(m.write.is_none() && m.manage.is_none(), "a read-only copy");
    assert!(!x.holds_secrets());

    let x = fixture("zlib.xnd");
    let m = &x.mappings[0];
    assert_eq!(m.function.as_ref().unwrap().name, "zlib_compress");
    assert!(m.alloc_length < m.logical_length);
}

#[test]
fn fixtures_round_trip_through_our_writer() {
    for name in ["plain.xnd", "checksum.xnd", "aes.xnd", "zlib.xnd"] {
        let x = fixture(name);
        let text = xml::write(&x);
        assert_eq!(xml::parse(text.as_bytes()).unwrap(), x, "{name}");
        // Our output for the LoRS-format fixtures is the same document.
        let original = std::fs::read_to_string(format!(
            "{}/tests/fixtures/{name}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap();
        assert_eq!(
            text, original,
            "{name}: writer output differs from the LoRS layout"
        );
    }
}

#[test]
fn namespace_is_found_by_uri_not_by_prefix() {
    let doc = r#"<?xml version="1.0"?>
<exnode xmlns:x="http://loci.cs.utk.edu/exnode" xmlns:other="urn:else">
  <x:metadata name="filename" type="string">a &amp; b</x:metadata>
  <other:metadata name="filename" type="string">ignored</other:metadata>
  <x:unknown><x:mapping/></x:unknown>
  <x:mapping>
    <x:metadata name="exnode_offset" type="integer"> 5 </x:metadata>
    <x:metadata name="start" type="string">2016-01-01 00:00:00</x:metadata>
    <!-- comment -->
    <x:read><![CDATA[ibp://h:1/1#k/2/READ]]></x:read>
  </x:mapping>
</exnode>"#;
    let x = xml::parse(doc.as_bytes()).unwrap();
    assert_eq!(x.filename(), Some("a & b"));
    assert_eq!(x.metadata.len(), 1);
    assert_eq!(x.mappings.len(), 1);
    assert_eq!(x.mappings[0].exnode_offset, 5);
    assert_eq!(
        x.mappings[0].metadata,
        vec![Metadata::string("start", "2016-01-01 00:00:00")]
    );
    assert_eq!(x.mappings[0].read.as_ref().unwrap().host, "h");
}

fn reject(doc: &str, limits: &Limits) -> XmlError {
    match xml::parse_with(doc.as_bytes(), limits) {
        Ok(x) => panic!("accepted {doc:?} as {x:?}"),
        Err(e) => e,
    }
}

/// The range metadata of a mapping or hole.
fn range(offset: u64, length: u64) -> String {
    format!(
        "<exnode:metadata name=\"exnode_offset\" type=\"integer\">{offset}</exnode:metadata><exnode:metadata name=\"logical_length\" type=\"integer\">{length}</exnode:metadata>"
    )
}

/// A name, a document, the limits to read it with, and the expected error.
type Case<'a> = (&'a str, String, &'a Limits, fn(&XmlError) -> bool);

/// One named case per class of malformed or hostile input.
#[test]
fn rejection_table() {
    let d = Limits::default();
    let ns = r#"xmlns:exnode="http://loci.cs.utk.edu/exnode""#;
    let laughs = r#"<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;">]><exnode>&lol2;</exnode>"#;
    let external = r#"<?xml version="1.0"?><!DOCTYPE x SYSTEM "file:///etc/passwd"><exnode/>"#;
    let deep = format!(
        "<exnode {ns}>{}{}</exnode>",
        "<a>".repeat(40),
        "</a>".repeat(40)
    );
    let many = format!("<exnode {ns}>{}</exnode>", "<exnode:mapping/>".repeat(11));
    let small = Limits {
        max_mappings: 10,
        ..Limits::default()
    };
    let tiny = Limits {
        max_bytes: 50,
        ..Limits::default()
    };
    let long_text = format!(
        "<exnode {ns}><exnode:metadata name=\"n\" type=\"string\">{}</exnode:metadata></exnode>",
        "x".repeat(70_000)
    );
    let cases: Vec<Case<'_>> = vec![
        ("billion laughs (DTD)", laughs.into(), &d, |e| {
            matches!(e, XmlError::DocType { .. })
        }),
        ("external entity (DTD)", external.into(), &d, |e| {
            matches!(e, XmlError::DocType { .. })
        }),
        (
            "undefined entity",
            format!("<exnode {ns}><exnode:metadata name=\"a\">&xxe;</exnode:metadata></exnode>"),
            &d,
            |e| matches!(e, XmlError::Malformed { .. }),
        ),
        ("too deep", deep, &d, |e| {
            matches!(
                e,
                XmlError::Limit {
                    what: "element nesting depth",
                    ..
                }
            )
        }),
        ("too many mappings", many, &small, |e| {
            matches!(
                e,
                XmlError::Limit {
                    what: "mappings",
                    ..
                }
            )
        }),
        ("text too long", long_text, &d, |e| {
            matches!(
                e,
                XmlError::Limit {
                    what: "text length",
                    ..
                }
            )
        }),
        ("document too large", "<exnode/>".repeat(10), &tiny, |e| {
            matches!(e, XmlError::TooLarge { .. })
        }),
        (
            "control character",
            "<exnode>\u{0}</exnode>".into(),
            &d,
            |e| matches!(e, XmlError::Malformed { .. }),
        ),
        (
            "control character reference",
            "<exnode>&#1;</exnode>".into(),
            &d,
            |e| matches!(e, XmlError::Malformed { .. }),
        ),
        (
            "unclosed",
            format!("<exnode {ns}><exnode:mapping>"),
            &d,
            |e| matches!(e, XmlError::Malformed { .. }),
        ),
        (
            "mismatched tags",
            format!("<exnode {ns}><exnode:mapping></exnode>"),
            &d,
            |e| matches!(e, XmlError::Malformed { .. }),
        ),
        ("wrong root", "<html/>".into(), &d, |e| {
            matches!(e, XmlError::NotExnode)
        }),
        ("empty document", "".into(), &d, |e| {
            matches!(e, XmlError::NotExnode)
        }),
        ("content after root", "<exnode/><exnode/>".into(), &d, |e| {
            matches!(e, XmlError::Malformed { .. })
        }),
        (
            "bad integer",
            format!(
                "<exnode {ns}><exnode:metadata name=\"a\" type=\"integer\">12x</exnode:metadata></exnode>"
            ),
            &d,
            |e| matches!(e, XmlError::Invalid { .. }),
        ),
        (
            "non-finite double",
            format!(
                "<exnode {ns}><exnode:metadata name=\"a\" type=\"double\">inf</exnode:metadata></exnode>"
            ),
            &d,
            |e| matches!(e, XmlError::Invalid { .. }),
        ),
        (
            "unknown type",
            format!(
                "<exnode {ns}><exnode:metadata name=\"a\" type=\"blob\">1</exnode:metadata></exnode>"
            ),
            &d,
            |e| matches!(e, XmlError::Invalid { .. }),
        ),
        (
            "metadata without name",
            format!("<exnode {ns}><exnode:metadata type=\"string\">1</exnode:metadata></exnode>"),
            &d,
            |e| matches!(e, XmlError::Invalid { .. }),
        ),
        (
            "negative offset",
            format!(
                "<exnode {ns}><exnode:mapping><exnode:metadata name=\"exnode_offset\" type=\"integer\">-1</exnode:metadata></exnode:mapping></exnode>"
            ),
            &d,
            |e| matches!(e, XmlError::Invalid { .. }),
        ),
        (
            "offset as string",
            format!(
                "<exnode {ns}><exnode:mapping><exnode:metadata name=\"alloc_length\" type=\"string\">1</exnode:metadata></exnode:mapping></exnode>"
            ),
            &d,
            |e| matches!(e, XmlError::Invalid { .. }),
        ),
        (
            "malformed capability",
            format!(
                "<exnode {ns}><exnode:mapping><exnode:read>http://x</exnode:read></exnode:mapping></exnode>"
            ),
            &d,
            |e| {
                matches!(
                    e,
                    XmlError::Invalid {
                        what: "capability",
                        ..
                    }
                )
            },
        ),
        (
            "write cap in read slot",
            format!(
                "<exnode {ns}><exnode:mapping><exnode:read>ibp://h:1/1#k/2/WRITE</exnode:read></exnode:mapping></exnode>"
            ),
            &d,
            |e| matches!(e, XmlError::Model(_)),
        ),
        (
            "hole over a mapping",
            format!(
                "<exnode {ns}><exnode:mapping>{}</exnode:mapping><exnode:hole>{}</exnode:hole></exnode>",
                range(0, 100),
                range(50, 100)
            ),
            &d,
            |e| matches!(e, XmlError::Model(_)),
        ),
        (
            "holes out of order",
            format!(
                "<exnode {ns}><exnode:hole>{}</exnode:hole><exnode:hole>{}</exnode:hole></exnode>",
                range(500, 10),
                range(100, 10)
            ),
            &d,
            |e| matches!(e, XmlError::Model(_)),
        ),
        (
            "empty hole",
            format!(
                "<exnode {ns}><exnode:hole>{}</exnode:hole></exnode>",
                range(7, 0)
            ),
            &d,
            |e| matches!(e, XmlError::Model(_)),
        ),
        (
            "hole with a capability",
            format!(
                "<exnode {ns}><exnode:hole>{}<exnode:read>ibp://h:1/1#k/2/READ</exnode:read></exnode:hole></exnode>",
                range(0, 10)
            ),
            &d,
            |e| matches!(e, XmlError::Invalid { .. }),
        ),
        (
            "holes past the mapping limit",
            format!("<exnode {ns}>{}</exnode>", "<exnode:hole/>".repeat(11)),
            &small,
            |e| matches!(e, XmlError::Limit { .. }),
        ),
        (
            "two functions",
            format!(
                "<exnode {ns}><exnode:mapping><exnode:function name=\"a\"/><exnode:function name=\"b\"/></exnode:mapping></exnode>"
            ),
            &d,
            |e| matches!(e, XmlError::Invalid { .. }),
        ),
    ];
    assert!(
        matches!(
            xml::parse(b"<exnode>\xff\xfe</exnode>"),
            Err(XmlError::Malformed { .. })
        ),
        "not UTF-8"
    );
    for (name, doc, limits, ok) in cases {
        let e = reject(&doc, limits);
        assert!(ok(&e), "{name}: unexpected error {e:?}");
        assert!(!e.to_string().is_empty());
    }
}

#[test]
fn holes_round_trip_and_count_in_the_size() {
    let ns = r#"xmlns:exnode="http://loci.cs.utk.edu/exnode""#;
    let doc = format!(
        "<exnode {ns}><exnode:mapping>{}</exnode:mapping><exnode:hole>{}</exnode:hole><exnode:hole>{}</exnode:hole></exnode>",
        range(100, 50),
        range(0, 100),
        range(150, 1000)
    );
    let x = xml::parse(doc.as_bytes()).unwrap();
    assert_eq!(x.holes.len(), 2);
    assert_eq!((x.logical_size(), x.hole_bytes()), (1150, 1100));
    assert_eq!(x.hole_at(120), None);
    assert_eq!(x.hole_at(149 + 1).map(|h| h.offset), Some(150));
    assert_eq!(xml::parse(xml::write(&x).as_bytes()).unwrap(), x);
    // Writing into a hole takes the range out of it.
    let mut y = x.clone();
    y.fill_holes(500, 600);
    let got: Vec<(u64, u64)> = y.holes.iter().map(|h| (h.offset, h.end())).collect();
    assert_eq!(got, [(0, 100), (150, 500), (600, 1150)]);
}

#[test]
fn validate_rejects_ranges_that_overflow() {
    let x = ExNode {
        mappings: vec![Mapping {
            exnode_offset: u64::MAX,
            logical_length: 1,
            ..Mapping::default()
        }],
        ..ExNode::default()
    };
    assert!(x.validate().is_err());
}

fn cap(kind: CapKind, host: String, port: u16) -> Capability {
    Capability::new(&host, port, "1", Key::generate().unwrap(), 42, kind)
}

fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        "[ -~]{0,20}".prop_map(Value::String),
        any::<i64>().prop_map(Value::Integer),
        // Written with six decimals: generate values that survive that.
        (-1_000_000i64..1_000_000).prop_map(|v| Value::Double(v as f64 / 1000.0)),
    ];
    leaf.prop_recursive(2, 8, 3, |inner| {
        proptest::collection::vec(
            ("[a-z_]{1,8}", inner).prop_map(|(name, value)| Metadata { name, value }),
            0..3,
        )
        .prop_map(Value::Meta)
    })
}

fn metadata() -> impl Strategy<Value = Metadata> {
    ("[a-zA-Z_]{1,12}", value()).prop_map(|(name, value)| Metadata { name, value })
}

fn function() -> impl Strategy<Value = Function> {
    let base = (
        "[a-z_]{1,12}",
        proptest::collection::vec(metadata(), 0..2),
        proptest::collection::vec(metadata(), 0..3),
    )
        .prop_map(|(name, metadata, arguments)| Function {
            name,
            metadata,
            arguments,
            inner: vec![],
        });
    base.prop_recursive(2, 4, 1, |inner| {
        (inner.clone(), inner).prop_map(|(mut outer, i)| {
            outer.inner = vec![i];
            outer
        })
    })
}

fn mapping() -> impl Strategy<Value = Mapping> {
    (
        (
            0u64..1 << 50,
            0u64..1 << 40,
            0u64..1 << 40,
            0u64..1 << 40,
            0u64..1 << 24,
        ),
        proptest::collection::vec(
            metadata().prop_filter("reserved names", |m| {
                ![
                    "exnode_offset",
                    "logical_length",
                    "alloc_offset",
                    "alloc_length",
                    "e2e_blocksize",
                ]
                .contains(&m.name.as_str())
            }),
            0..2,
        ),
        proptest::option::of(function()),
        (
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            "[a-z0-9.-]{1,15}",
            1u16..,
        ),
    )
        .prop_map(
            |((eo, ll, ao, al, bs), metadata, function, (r, w, m, host, port))| Mapping {
                exnode_offset: eo,
                logical_length: ll,
                alloc_offset: ao,
                alloc_length: al,
                e2e_blocksize: bs,
                metadata,
                function,
                read: r.then(|| cap(CapKind::Read, host.clone(), port)),
                write: w.then(|| cap(CapKind::Write, host.clone(), port)),
                manage: m.then(|| cap(CapKind::Manage, host.clone(), port)),
            },
        )
}

proptest! {
    #[test]
    fn any_exnode_round_trips(
        metadata in proptest::collection::vec(metadata(), 0..4),
        mappings in proptest::collection::vec(mapping(), 0..6),
        gaps in proptest::collection::vec((0u64..1 << 40, 1u64..1 << 40), 0..4),
    ) {
        // Holes past every mapping, in order, apart.
        let mut at = mappings.iter().map(Mapping::logical_end).max().unwrap_or(0);
        let mut holes = Vec::new();
        for (gap, length) in gaps {
            let Some(offset) = at.checked_add(gap) else { break };
            let Some(end) = offset.checked_add(length) else { break };
            holes.push(lors_exnode::Hole { offset, length });
            at = end;
        }
        let x = ExNode {
            metadata,
            mappings,
            parity: Vec::new(),
            holes,
        };
        let text = xml::write(&x);
        prop_assert_eq!(xml::parse(text.as_bytes()).unwrap(), x);
    }

    #[test]
    fn parser_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let _ = xml::parse(&bytes);
    }
}
