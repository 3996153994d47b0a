//! Bounded async line reading, shared by the depot and the client.
//!
//! Never `read_line` into an unbounded `String`: a peer that sends no newline
//! would grow it forever. [`read_line`] stops at `max` bytes.

use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// What [`read_line`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Line {
    /// A full line (including `\n`) is in the buffer.
    Complete,
    /// The peer closed the connection before sending anything.
    Eof,
    /// The peer closed the connection in the middle of a line.
    Truncated,
    /// More than `max` bytes arrived without a newline.
    TooLong,
}

/// Reads one `\n`-terminated line into `buf` (cleared first), at most `max` bytes.
///
/// # Cancel safety
/// Not cancel safe: bytes already consumed are in `buf`, so a cancelled read
/// leaves the stream mid-line. Callers close the connection on timeout.
pub async fn read_line<R: AsyncBufRead + Unpin>(
    r: &mut R,
    max: usize,
    buf: &mut Vec<u8>,
) -> std::io::Result<Line> {
    buf.clear();
    loop {
        let avail = r.fill_buf().await?;
        if avail.is_empty() {
            return Ok(if buf.is_empty() {
                Line::Eof
            } else {
                Line::Truncated
            });
        }
        let (take, done) = match avail.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (avail.len(), false),
        };
        if buf.len() + take > max {
            return Ok(Line::TooLong);
        }
        buf.extend_from_slice(&avail[..take]);
        r.consume(take);
        if done {
            return Ok(Line::Complete);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn stops_at_the_limit_and_reports_truncation() {
        let mut buf = Vec::new();
        let mut r: &[u8] = b"1 2 3\nabc";
        assert_eq!(
            read_line(&mut r, 100, &mut buf).await.unwrap(),
            Line::Complete
        );
        assert_eq!(buf, b"1 2 3\n");
        assert_eq!(
            read_line(&mut r, 100, &mut buf).await.unwrap(),
            Line::Truncated
        );
        let mut r: &[u8] = b"";
        assert_eq!(read_line(&mut r, 100, &mut buf).await.unwrap(), Line::Eof);
        let long = vec![b'x'; 5000];
        let mut r: &[u8] = &long;
        assert_eq!(
            read_line(&mut r, 4096, &mut buf).await.unwrap(),
            Line::TooLong
        );
    }
}
