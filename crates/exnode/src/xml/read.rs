//! Streaming, bounded reader for `.xnd` files.

use quick_xml::NsReader;
use quick_xml::events::{BytesStart, Event};
use quick_xml::name::{Namespace, ResolveResult};

use super::{Limits, NAMESPACE};
use crate::model::{ExNode, Function, Mapping, Metadata, ModelError, Value};
use lors_ibp::Capability;

/// Why a document was rejected. Positions are byte offsets into the input.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum XmlError {
    /// Larger than [`Limits::max_bytes`].
    #[error("exNode is {size} bytes, more than the limit of {limit}")]
    TooLarge {
        /// Document size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// A limit other than size was exceeded.
    #[error("exNode exceeds a limit at byte {at}: {what}")]
    Limit {
        /// Which limit.
        what: &'static str,
        /// Where.
        at: u64,
    },
    /// A DOCTYPE declaration (refused: no DTDs, no entity definitions).
    #[error("exNode contains a DOCTYPE declaration at byte {at}; DTDs are not accepted")]
    DocType {
        /// Where.
        at: u64,
    },
    /// Not well-formed XML, or not UTF-8.
    #[error("malformed XML at byte {at}: {detail}")]
    Malformed {
        /// Where.
        at: u64,
        /// What the XML reader said.
        detail: String,
    },
    /// The root element is not `exnode`.
    #[error("not an exNode: the root element is not <exnode>")]
    NotExnode,
    /// A value does not fit its declared type or its place.
    #[error("invalid {what} at byte {at}: {detail}")]
    Invalid {
        /// What was being read.
        what: &'static str,
        /// Where.
        at: u64,
        /// Why.
        detail: String,
    },
    /// Parsed, but the model is inconsistent.
    #[error("inconsistent exNode: {0}")]
    Model(#[from] ModelError),
}

/// Parses an exNode with the default [`Limits`].
pub fn parse(input: &[u8]) -> Result<ExNode, XmlError> {
    parse_with(input, &Limits::default())
}

/// Parses an exNode with explicit limits.
pub fn parse_with(input: &[u8], limits: &Limits) -> Result<ExNode, XmlError> {
    if input.len() > limits.max_bytes {
        return Err(XmlError::TooLarge {
            size: input.len(),
            limit: limits.max_bytes,
        });
    }
    let text = std::str::from_utf8(input).map_err(|e| XmlError::Malformed {
        at: e.valid_up_to() as u64,
        detail: "not UTF-8".into(),
    })?;
    let mut p = Parser {
        r: NsReader::from_str(text),
        limits,
        depth: 0,
    };
    let x = p.document()?;
    x.validate()?;
    Ok(x)
}

/// An element start, owned.
struct Elem {
    exnode_ns: bool,
    local: String,
    attrs: Vec<(String, String)>,
    empty: bool,
}

enum Ev {
    Start(Elem),
    End,
    Text(String),
    Eof,
}

struct Parser<'a> {
    r: NsReader<&'a [u8]>,
    limits: &'a Limits,
    depth: usize,
}

impl Parser<'_> {
    fn at(&self) -> u64 {
        self.r.buffer_position()
    }

    fn malformed(&self, e: impl std::fmt::Display) -> XmlError {
        XmlError::Malformed {
            at: self.at(),
            detail: e.to_string(),
        }
    }

    fn limit(&self, what: &'static str) -> XmlError {
        XmlError::Limit {
            what,
            at: self.at(),
        }
    }

    fn invalid(&self, what: &'static str, detail: impl Into<String>) -> XmlError {
        XmlError::Invalid {
            what,
            at: self.at(),
            detail: detail.into(),
        }
    }

    fn elem(&self, exnode_ns: bool, e: &BytesStart<'_>, empty: bool) -> Result<Elem, XmlError> {
        let local = std::str::from_utf8(e.local_name().into_inner())
            .map_err(|err| self.malformed(err))?
            .to_owned();
        if local.len() > self.limits.max_name_bytes {
            return Err(self.limit("element name length"));
        }
        let mut attrs = Vec::new();
        for a in e.attributes() {
            let a = a.map_err(|err| self.malformed(err))?;
            if attrs.len() == 16 {
                return Err(self.limit("attributes per element"));
            }
            let key = std::str::from_utf8(a.key.local_name().into_inner())
                .map_err(|err| self.malformed(err))?
                .to_owned();
            if key.len() > self.limits.max_name_bytes {
                return Err(self.limit("attribute name length"));
            }
            let value = a.unescape_value().map_err(|err| self.malformed(err))?;
            if value.len() > self.limits.max_text_bytes {
                return Err(self.limit("attribute value length"));
            }
            attrs.push((key, value.into_owned()));
        }
        Ok(Elem {
            exnode_ns,
            local,
            attrs,
            empty,
        })
    }

    /// The next event of interest, as owned data.
    fn next(&mut self) -> Result<Ev, XmlError> {
        loop {
            let at = self.at();
            let (ns, ev) = match self.r.read_resolved_event() {
                Ok(x) => x,
                Err(e) => {
                    return Err(XmlError::Malformed {
                        at,
                        detail: e.to_string(),
                    });
                }
            };
            // The resolution borrows the reader; keep only what we need.
            let ns = matches!(ns, ResolveResult::Bound(Namespace(n)) if n == NAMESPACE.as_bytes());
            match ev {
                Event::Start(e) => {
                    self.depth += 1;
                    if self.depth > self.limits.max_depth {
                        return Err(self.limit("element nesting depth"));
                    }
                    return self.elem(ns, &e, false).map(Ev::Start);
                }
                Event::Empty(e) => return self.elem(ns, &e, true).map(Ev::Start),
                Event::End(_) => {
                    self.depth = self.depth.saturating_sub(1);
                    return Ok(Ev::End);
                }
                Event::Text(t) => {
                    let s = t.unescape().map_err(|e| self.malformed(e))?;
                    // XML 1.0 allows no control characters but tab, CR, LF
                    // (character references included); libxml2 refuses them too.
                    if s.chars()
                        .any(|c| c < ' ' && !matches!(c, '\t' | '\n' | '\r'))
                    {
                        return Err(self.malformed("control character in text"));
                    }
                    return Ok(Ev::Text(s.into_owned()));
                }
                Event::CData(c) => {
                    let s = std::str::from_utf8(&c).map_err(|e| self.malformed(e))?;
                    return Ok(Ev::Text(s.to_owned()));
                }
                Event::DocType(_) => return Err(XmlError::DocType { at: self.at() }),
                Event::Eof => return Ok(Ev::Eof),
                Event::Decl(_) | Event::PI(_) | Event::Comment(_) => {}
            }
        }
    }

    /// Skips the rest of an element whose start was just read.
    fn skip(&mut self, e: &Elem) -> Result<(), XmlError> {
        if e.empty {
            return Ok(());
        }
        let mut open = 1usize;
        while open > 0 {
            match self.next()? {
                Ev::Start(c) if !c.empty => open += 1,
                Ev::End => open -= 1,
                Ev::Eof => return Err(self.malformed("unexpected end of document")),
                _ => {}
            }
        }
        Ok(())
    }

    /// Collects the text of a leaf element (child elements are skipped).
    fn text(&mut self, e: &Elem) -> Result<String, XmlError> {
        let mut s = String::new();
        if e.empty {
            return Ok(s);
        }
        loop {
            match self.next()? {
                Ev::Text(t) => {
                    if s.len() + t.len() > self.limits.max_text_bytes {
                        return Err(self.limit("text length"));
                    }
                    s.push_str(&t);
                }
                Ev::Start(c) => self.skip(&c)?,
                Ev::End => return Ok(s),
                Ev::Eof => return Err(self.malformed("unexpected end of document")),
            }
        }
    }

    fn document(&mut self) -> Result<ExNode, XmlError> {
        let root = loop {
            match self.next()? {
                Ev::Start(e) => break e,
                Ev::Text(t) if t.trim().is_empty() => {}
                Ev::Text(_) => return Err(self.malformed("text before the root element")),
                Ev::End | Ev::Eof => return Err(XmlError::NotExnode),
            }
        };
        if root.local != "exnode" {
            return Err(XmlError::NotExnode);
        }
        let mut x = ExNode::default();
        if !root.empty {
            self.root_children(&mut x)?;
        }
        // Nothing but whitespace and comments may follow the root.
        loop {
            match self.next()? {
                Ev::Eof => return Ok(x),
                Ev::Text(t) if t.trim().is_empty() => {}
                _ => return Err(self.malformed("content after the root element")),
            }
        }
    }

    /// The children of `<exnode>`, up to its end tag.
    fn root_children(&mut self, x: &mut ExNode) -> Result<(), XmlError> {
        loop {
            match self.next()? {
                Ev::Start(e) if e.exnode_ns && e.local == "metadata" => {
                    if x.metadata.len() == self.limits.max_items {
                        return Err(self.limit("exNode metadata items"));
                    }
                    x.metadata.push(self.metadata(&e)?);
                }
                Ev::Start(e) if e.exnode_ns && e.local == "mapping" => {
                    if x.mappings.len() + x.parity.len() + x.holes.len() == self.limits.max_mappings
                    {
                        return Err(self.limit("mappings"));
                    }
                    x.mappings.push(self.mapping(&e)?);
                }
                // Parity blocks of an erasure-coded file: their own element,
                // which the LoRS 0.82 tools skip (they would read parity as
                // file data otherwise).
                Ev::Start(e) if e.exnode_ns && e.local == "parity" => {
                    if x.mappings.len() + x.parity.len() + x.holes.len() == self.limits.max_mappings
                    {
                        return Err(self.limit("mappings"));
                    }
                    x.parity.push(self.mapping(&e)?);
                }
                // Holes of a sparse file: element and rule as for parity,
                // so the LoRS tools see a gap and refuse it.
                Ev::Start(e) if e.exnode_ns && e.local == "hole" => {
                    if x.mappings.len() + x.parity.len() + x.holes.len() == self.limits.max_mappings
                    {
                        return Err(self.limit("mappings"));
                    }
                    let m = self.mapping(&e)?;
                    if m.read.is_some() || m.write.is_some() || m.manage.is_some() {
                        return Err(self.invalid("hole", "a hole holds no capability"));
                    }
                    x.holes.push(crate::model::Hole {
                        offset: m.exnode_offset,
                        length: m.logical_length,
                    });
                }
                Ev::Start(e) => self.skip(&e)?,
                Ev::Text(_) => {}
                Ev::End => return Ok(()),
                Ev::Eof => return Err(self.malformed("unexpected end of document")),
            }
        }
    }

    fn attr<'e>(e: &'e Elem, name: &str) -> Option<&'e str> {
        e.attrs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// `<exnode:metadata name=… type=…>` or `<exnode:argument …>`.
    fn metadata(&mut self, e: &Elem) -> Result<Metadata, XmlError> {
        let name = Self::attr(e, "name")
            .ok_or_else(|| self.invalid("metadata", "missing name attribute"))?
            .to_owned();
        let ty = Self::attr(e, "type").unwrap_or("string").to_owned();
        let value = match ty.as_str() {
            "meta" => {
                let mut items = Vec::new();
                if !e.empty {
                    loop {
                        match self.next()? {
                            Ev::Start(c) if c.exnode_ns && c.local == "metadata" => {
                                if items.len() == self.limits.max_items {
                                    return Err(self.limit("nested metadata items"));
                                }
                                items.push(self.metadata(&c)?);
                            }
                            Ev::Start(c) => self.skip(&c)?,
                            Ev::Text(_) => {}
                            Ev::End => break,
                            Ev::Eof => return Err(self.malformed("unexpected end of document")),
                        }
                    }
                }
                Value::Meta(items)
            }
            "string" => Value::String(self.text(e)?),
            "integer" => {
                let t = self.text(e)?;
                Value::Integer(t.trim().parse().map_err(|_| {
                    self.invalid(
                        "integer metadata",
                        format!("{name}: {t:?} is not a 64-bit integer"),
                    )
                })?)
            }
            "double" => {
                let t = self.text(e)?;
                let v: f64 = t.trim().parse().map_err(|_| {
                    self.invalid("double metadata", format!("{name}: {t:?} is not a number"))
                })?;
                if !v.is_finite() {
                    return Err(self.invalid("double metadata", format!("{name}: not finite")));
                }
                Value::Double(v)
            }
            other => {
                return Err(self.invalid("metadata", format!("{name}: unknown type {other:?}")));
            }
        };
        Ok(Metadata { name, value })
    }

    fn function(&mut self, e: &Elem) -> Result<Function, XmlError> {
        let name = Self::attr(e, "name")
            .ok_or_else(|| self.invalid("function", "missing name attribute"))?
            .to_owned();
        let mut f = Function {
            name,
            ..Function::default()
        };
        if e.empty {
            return Ok(f);
        }
        loop {
            match self.next()? {
                Ev::Start(c) if c.exnode_ns && (c.local == "metadata" || c.local == "argument") => {
                    let list = if c.local == "metadata" {
                        &mut f.metadata
                    } else {
                        &mut f.arguments
                    };
                    if list.len() == self.limits.max_items {
                        return Err(self.limit("function items"));
                    }
                    let item = self.metadata(&c)?;
                    let list = if c.local == "metadata" {
                        &mut f.metadata
                    } else {
                        &mut f.arguments
                    };
                    list.push(item);
                }
                Ev::Start(c) if c.exnode_ns && c.local == "function" => {
                    if f.inner.len() == self.limits.max_items {
                        return Err(self.limit("nested functions"));
                    }
                    let inner = self.function(&c)?;
                    f.inner.push(inner);
                }
                Ev::Start(c) => self.skip(&c)?,
                Ev::Text(_) => {}
                Ev::End => return Ok(f),
                Ev::Eof => return Err(self.malformed("unexpected end of document")),
            }
        }
    }

    fn mapping(&mut self, e: &Elem) -> Result<Mapping, XmlError> {
        let mut m = Mapping::default();
        if e.empty {
            return Ok(m);
        }
        loop {
            match self.next()? {
                Ev::Start(c) if c.exnode_ns && c.local == "metadata" => {
                    let item = self.metadata(&c)?;
                    let slot = match item.name.as_str() {
                        "exnode_offset" => Some(&mut m.exnode_offset),
                        "logical_length" => Some(&mut m.logical_length),
                        "alloc_offset" => Some(&mut m.alloc_offset),
                        "alloc_length" => Some(&mut m.alloc_length),
                        "e2e_blocksize" => Some(&mut m.e2e_blocksize),
                        _ => None,
                    };
                    match (slot, &item.value) {
                        (Some(s), Value::Integer(v)) => {
                            *s = u64::try_from(*v).map_err(|_| {
                                self.invalid(
                                    "mapping metadata",
                                    format!("{} is negative", item.name),
                                )
                            })?;
                        }
                        (Some(_), _) => {
                            return Err(self.invalid(
                                "mapping metadata",
                                format!("{} must be an integer", item.name),
                            ));
                        }
                        (None, _) => {
                            if m.metadata.len() == self.limits.max_items {
                                return Err(self.limit("mapping metadata items"));
                            }
                            m.metadata.push(item);
                        }
                    }
                }
                Ev::Start(c) if c.exnode_ns && c.local == "function" => {
                    if m.function.is_some() {
                        return Err(self.invalid("mapping", "more than one function element"));
                    }
                    m.function = Some(self.function(&c)?);
                }
                Ev::Start(c)
                    if c.exnode_ns && matches!(c.local.as_str(), "read" | "write" | "manage") =>
                {
                    let t = self.text(&c)?;
                    let t = t.trim();
                    let cap = if t.is_empty() {
                        None
                    } else {
                        Some(Capability::parse(t).map_err(|err| {
                            self.invalid("capability", format!("<{}>: {err}", c.local))
                        })?)
                    };
                    match c.local.as_str() {
                        "read" => m.read = cap,
                        "write" => m.write = cap,
                        _ => m.manage = cap,
                    }
                }
                Ev::Start(c) => self.skip(&c)?,
                Ev::Text(_) => {}
                Ev::End => return Ok(m),
                Ev::Eof => return Err(self.malformed("unexpected end of document")),
            }
        }
    }
}
