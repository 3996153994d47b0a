//! Writer for `.xnd` files in the shape libxml2 gives the original tools.

use std::fmt::Write as _;

use super::NAMESPACE;
use crate::model::{ExNode, Function, Hole, Mapping, Metadata, Value};

fn escape(s: &str, out: &mut String) {
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
}

fn item(out: &mut String, indent: usize, tag: &str, m: &Metadata) {
    let pad = "  ".repeat(indent);
    let ty = match m.value {
        Value::String(_) => "string",
        Value::Integer(_) => "integer",
        Value::Double(_) => "double",
        Value::Meta(_) => "meta",
    };
    let _ = write!(out, "{pad}<exnode:{tag} name=\"");
    escape(&m.name, out);
    let _ = write!(out, "\" type=\"{ty}\">");
    match &m.value {
        Value::String(s) => escape(s, out),
        Value::Integer(i) => {
            let _ = write!(out, "{i}");
        }
        // C's %lf: six decimals.
        Value::Double(d) => {
            let _ = write!(out, "{d:.6}");
        }
        Value::Meta(items) => {
            out.push('\n');
            for i in items {
                item(out, indent + 1, "metadata", i);
            }
            out.push_str(&pad);
        }
    }
    let _ = writeln!(out, "</exnode:{tag}>");
}

fn function(out: &mut String, indent: usize, f: &Function) {
    let pad = "  ".repeat(indent);
    let _ = write!(out, "{pad}<exnode:function name=\"");
    escape(&f.name, out);
    out.push_str("\">\n");
    for m in &f.metadata {
        item(out, indent + 1, "metadata", m);
    }
    for a in &f.arguments {
        item(out, indent + 1, "argument", a);
    }
    for i in &f.inner {
        function(out, indent + 1, i);
    }
    let _ = writeln!(out, "{pad}</exnode:function>");
}

fn mapping(out: &mut String, tag: &str, m: &Mapping) {
    let _ = writeln!(out, "  <exnode:{tag}>");
    // libexnode keeps mapping metadata sorted by name; so do we.
    for (name, v) in [
        ("alloc_length", m.alloc_length),
        ("alloc_offset", m.alloc_offset),
        ("e2e_blocksize", m.e2e_blocksize),
        ("exnode_offset", m.exnode_offset),
        ("logical_length", m.logical_length),
    ] {
        let _ = writeln!(
            out,
            "    <exnode:metadata name=\"{name}\" type=\"integer\">{v}</exnode:metadata>"
        );
    }
    for x in &m.metadata {
        item(out, 2, "metadata", x);
    }
    if let Some(f) = &m.function {
        function(out, 2, f);
    }
    // Absent capabilities are left out rather than written empty: the
    // original reader treats an element as a capability to use.
    for (tag, cap) in [
        ("read", &m.read),
        ("write", &m.write),
        ("manage", &m.manage),
    ] {
        if let Some(c) = cap {
            let _ = write!(out, "    <exnode:{tag}>");
            escape(&c.to_url(), out);
            let _ = writeln!(out, "</exnode:{tag}>");
        }
    }
    let _ = writeln!(out, "  </exnode:{tag}>");
}

/// A hole: its range as a mapping's would be, and nothing else (the LoRS
/// tools skip the element; the gap it leaves makes them refuse the range).
fn hole(out: &mut String, h: &Hole) {
    let _ = writeln!(out, "  <exnode:hole>");
    for (name, v) in [("exnode_offset", h.offset), ("logical_length", h.length)] {
        let _ = writeln!(
            out,
            "    <exnode:metadata name=\"{name}\" type=\"integer\">{v}</exnode:metadata>"
        );
    }
    let _ = writeln!(out, "  </exnode:hole>");
}

/// Serializes an exNode. Values are written as given; callers set
/// `filename`/`lorsversion` metadata (see [`super::LORS_VERSION`]).
pub fn write(x: &ExNode) -> String {
    let mut out = String::with_capacity(
        256 + 700 * (x.mappings.len() + x.parity.len()) + 160 * x.holes.len(),
    );
    out.push_str("<?xml version=\"1.0\"?>\n");
    let _ = writeln!(out, "<exnode xmlns:exnode=\"{NAMESPACE}\">");
    for m in &x.metadata {
        item(&mut out, 1, "metadata", m);
    }
    for m in &x.mappings {
        mapping(&mut out, "mapping", m);
    }
    for m in &x.parity {
        mapping(&mut out, "parity", m);
    }
    for h in &x.holes {
        hole(&mut out, h);
    }
    out.push_str("</exnode>\n");
    out
}
