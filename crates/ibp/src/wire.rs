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

/// [`read_line`] straight from a socket, taking no byte past the newline.
///
/// A LOAD reply is followed at once by the data; a buffered reader would
/// pull the data's first bytes into user space with the line, and those
/// then need a copy of their own instead of a splice into place. Here the
/// socket is peeked for the newline and only the line is read off it.
///
/// # Cancel safety
/// As [`read_line`].
pub async fn read_line_exact(
    sock: &mut tokio::net::TcpStream,
    max: usize,
    buf: &mut Vec<u8>,
) -> std::io::Result<Line> {
    use tokio::io::AsyncReadExt;
    // Replies are short: the newline is almost always in the first peek.
    let mut peek = [0u8; 512];
    buf.clear();
    loop {
        let n = sock.peek(&mut peek).await?;
        if n == 0 {
            return Ok(if buf.is_empty() {
                Line::Eof
            } else {
                Line::Truncated
            });
        }
        let (take, done) = match peek[..n].iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (n, false),
        };
        if buf.len() + take > max {
            return Ok(Line::TooLong);
        }
        // The peeked bytes stay queued until read, so this cannot come up short.
        let start = buf.len();
        buf.resize(start + take, 0);
        sock.read_exact(&mut buf[start..]).await?;
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

    #[tokio::test]
    async fn exact_read_leaves_the_bytes_after_the_line_on_the_socket() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut a = tokio::net::TcpStream::connect(l.local_addr().unwrap())
            .await
            .unwrap();
        let (mut b, _) = l.accept().await.unwrap();
        let mut buf = Vec::new();
        // A line split over two sends, with data right behind it.
        a.write_all(b"1 5").await.unwrap();
        let writer = tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            a.write_all(b" \nhello").await.unwrap();
            a.write_all(&[b'y'; 600]).await.unwrap();
            a
        });
        assert_eq!(
            read_line_exact(&mut b, 100, &mut buf).await.unwrap(),
            Line::Complete
        );
        assert_eq!(buf, b"1 5 \n");
        let mut rest = [0u8; 5];
        b.read_exact(&mut rest).await.unwrap();
        assert_eq!(&rest, b"hello");
        // 600 bytes with no newline: longer than the limit.
        assert_eq!(
            read_line_exact(&mut b, 100, &mut buf).await.unwrap(),
            Line::TooLong
        );
        drop(writer.await.unwrap());
        let mut sink = Vec::new();
        b.read_to_end(&mut sink).await.unwrap();
        assert_eq!(
            read_line_exact(&mut b, 100, &mut buf).await.unwrap(),
            Line::Eof
        );
    }
}
