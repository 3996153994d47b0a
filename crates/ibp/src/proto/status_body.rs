//! The body of a v1.4 STATUS INQ reply (`docs/ibp-protocol.md` §2.8): after
//! `1 <nbytes> \n`, exactly `nbytes` of `KEY:VALUE` tokens ending in `RE`.
//! The depot [`encode`](StatusBody::encode)s one, the client
//! [`parse`](StatusBody::parse)s it; sizes are in bytes.
//!
//! ```
//! use lors_ibp::proto::StatusBody;
//! let body = StatusBody { rid: "0".into(), config_total: 100 << 20, ..StatusBody::default() };
//! let wire = body.encode();
//! assert!(wire.starts_with("VS:1.4:1.0 DT:1  RID:0 RT:1 CT:104857600 "));
//! assert_eq!(StatusBody::parse(&wire), Ok(body));
//! ```

use std::fmt::Write;

use crate::caps::valid_rid;

/// What a depot reports about a resource (or all of them, RID `0`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusBody {
    /// `DT`: the data mover (1 = TCP).
    pub data_mover: u64,
    /// `RID`: the resource reported on (`0`: the whole depot).
    pub rid: String,
    /// `RT`: the resource type (1 = disk).
    pub resource_type: u64,
    /// `CT`: bytes configured.
    pub config_total: u64,
    /// `ST`: bytes served (offered to clients).
    pub served_total: u64,
    /// `UT`: bytes in use, hard and soft.
    pub used_total: u64,
    /// `UH`: bytes in use by hard allocations.
    pub used_hard: u64,
    /// `SH`: hard bytes served.
    pub served_hard: u64,
    /// `CH`: hard bytes configured.
    pub config_hard: u64,
    /// `AT`: bytes still allocatable.
    pub free_total: u64,
    /// `AH`: hard bytes still allocatable.
    pub free_hard: u64,
    /// `DR`: the longest lease granted, in seconds.
    pub max_duration: u64,
}

impl Default for StatusBody {
    fn default() -> StatusBody {
        StatusBody {
            data_mover: 1,
            rid: "0".to_owned(),
            resource_type: 1,
            config_total: 0,
            served_total: 0,
            used_total: 0,
            used_hard: 0,
            served_hard: 0,
            config_hard: 0,
            free_total: 0,
            free_hard: 0,
            max_duration: 0,
        }
    }
}

/// Why a STATUS body was not understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StatusBodyError {
    /// A field the reference depot always sends is missing.
    #[error("STATUS reply lacks its {0} field")]
    Missing(&'static str),
    /// A field is not a number, or the RID is malformed.
    #[error("STATUS reply has an invalid {0} field")]
    Invalid(&'static str),
    /// No `RE` token ends the body.
    #[error("STATUS reply does not end in RE")]
    Unterminated,
}

/// The numeric fields by key, in the reference depot's order after `RT`.
const SIZES: [&str; 9] = ["CT", "ST", "UT", "UH", "SH", "CH", "AT", "AH", "DR"];

impl StatusBody {
    fn sizes(&self) -> [u64; 9] {
        [
            self.config_total,
            self.served_total,
            self.used_total,
            self.used_hard,
            self.served_hard,
            self.config_hard,
            self.free_total,
            self.free_hard,
            self.max_duration,
        ]
    }

    fn sizes_mut(&mut self) -> [&mut u64; 9] {
        [
            &mut self.config_total,
            &mut self.served_total,
            &mut self.used_total,
            &mut self.used_hard,
            &mut self.served_hard,
            &mut self.config_hard,
            &mut self.free_total,
            &mut self.free_hard,
            &mut self.max_duration,
        ]
    }

    /// The body's bytes, as the reference depot writes them (the double
    /// space after `DT:1` included).
    pub fn encode(&self) -> String {
        let mut s = format!(
            "VS:1.4:1.0 DT:{}  RID:{} RT:{}",
            self.data_mover, self.rid, self.resource_type
        );
        for (key, value) in SIZES.iter().zip(self.sizes()) {
            let _ = write!(s, " {key}:{value}");
        }
        s.push_str(" RE \n");
        s
    }

    /// Reads a body. Total: any text gives a body or an error. Keys it does
    /// not know (`VS`, LoCI's `NFU`, `RL`) are skipped; `DT` and `RT` may be
    /// absent (1 is assumed); the RID and the sizes must be there.
    pub fn parse(text: &str) -> Result<StatusBody, StatusBodyError> {
        let mut body = StatusBody::default();
        let mut seen = [false; SIZES.len()];
        let mut rid = None;
        let mut ended = false;
        for token in text.split_ascii_whitespace() {
            if token == "RE" {
                ended = true;
                break;
            }
            let Some((key, value)) = token.split_once(':') else {
                continue;
            };
            let number = |what| {
                value
                    .parse::<u64>()
                    .map_err(|_| StatusBodyError::Invalid(what))
            };
            match key {
                "RID" if valid_rid(value) => rid = Some(value.to_owned()),
                "RID" => return Err(StatusBodyError::Invalid("RID")),
                "DT" => body.data_mover = number("DT")?,
                "RT" => body.resource_type = number("RT")?,
                _ => {
                    if let Some(i) = SIZES.iter().position(|k| *k == key) {
                        *body.sizes_mut()[i] = number(SIZES[i])?;
                        seen[i] = true;
                    }
                }
            }
        }
        if !ended {
            return Err(StatusBodyError::Unterminated);
        }
        body.rid = rid.ok_or(StatusBodyError::Missing("RID"))?;
        if let Some(i) = seen.iter().position(|s| !s) {
            return Err(StatusBodyError::Missing(SIZES[i]));
        }
        Ok(body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_reference_depots_body() {
        // A body in the ACCRE depot's format (docs/ibp-protocol.md §2.8).
        let wire = "VS:1.4:1.0 DT:1  RID:0 RT:1 CT:104857600 ST:104857600 UT:0 UH:0 \
                    SH:104857600 CH:104857600 AT:104857600 AH:104857600 DR:2592000 RE \n";
        let b = StatusBody::parse(wire).unwrap();
        assert_eq!(b.config_total, 100 << 20);
        assert_eq!(b.free_hard, 100 << 20);
        assert_eq!(b.max_duration, 2_592_000);
        assert_eq!(b.encode(), wire, "our encoding is the reference's format");
    }

    #[test]
    fn refuses_what_it_cannot_read() {
        let full = StatusBody::default().encode();
        assert_eq!(
            StatusBody::parse(&full.replace(" DR:0", "")),
            Err(StatusBodyError::Missing("DR"))
        );
        assert_eq!(
            StatusBody::parse(&full.replace("AT:0", "AT:-5")),
            Err(StatusBodyError::Invalid("AT"))
        );
        assert_eq!(
            StatusBody::parse(&full.replace(" RE", "")),
            Err(StatusBodyError::Unterminated)
        );
        assert_eq!(
            StatusBody::parse(&full.replace("RID:0", "RID:a/b")),
            Err(StatusBodyError::Invalid("RID"))
        );
        // Keys it does not know are skipped.
        let extra = full.replace(" RE", " NFU:3 RL:1,2 RE");
        assert_eq!(StatusBody::parse(&extra), Ok(StatusBody::default()));
    }
}
