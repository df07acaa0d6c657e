//! A small HTTP/1.1 client over one keep-alive connection: what `seckill load` measures with and
//! `seckill admin` calls the admin listener with. Written here rather than taken from a crate
//! (hyper's client, reqwest) because the load generator shares the machine with the server it
//! measures and must cost little per request: its buffers are reused from request to request,
//! and it speaks only what the engine's routes answer (content-length bodies, keep-alive).

use std::net::SocketAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One keep-alive HTTP/1.1 connection. Its buffers are reused from request to request: the
/// generator shares the machine with the server it measures, so it should cost little per request.
pub(crate) struct Conn {
    addr: SocketAddr,
    io: Option<TcpStream>,
    /// The request being sent.
    out: Vec<u8>,
    /// Bytes read and not yet consumed.
    input: Vec<u8>,
    /// The last response's body.
    pub(crate) body: Vec<u8>,
}

/// Responses larger than this are refused. A purchase's answer is a few hundred bytes, but the
/// admin listener's list of every installed sale grows with the sales (about 230 bytes each: the
/// test suite's 4,600 sales on one database passed 1 MiB and `seckill admin list` refused them).
/// The bound only keeps a broken server from filling memory; buffers grow to what was received.
const MAX_RESPONSE_BYTES: usize = 64 << 20;

impl Conn {
    pub(crate) fn new(addr: SocketAddr) -> Conn {
        Conn {
            addr,
            io: None,
            out: Vec::with_capacity(256),
            input: Vec::with_capacity(4096),
            body: Vec::with_capacity(1024),
        }
    }

    /// Send one request; the status comes back, the body is left in `self.body`.
    /// `bearer`: a user JWT for the `authorization` header (empty: none).
    pub(crate) async fn request(
        &mut self,
        method: &str,
        path: &str,
        bearer: &str,
        body: &str,
    ) -> std::io::Result<u16> {
        use std::io::Write;
        if self.io.is_none() {
            let s = TcpStream::connect(self.addr).await?;
            s.set_nodelay(true)?;
            self.io = Some(s);
            self.input.clear();
        }
        self.out.clear();
        write!(self.out, "{method} {path} HTTP/1.1\r\nhost: {}\r\n", self.addr)?;
        if !bearer.is_empty() {
            write!(self.out, "authorization: Bearer {bearer}\r\n")?;
        }
        write!(
            self.out,
            "content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )?;
        let result = Self::exchange(
            self.io.as_mut().expect("connected above"),
            &self.out,
            &mut self.input,
            &mut self.body,
        )
        .await;
        match result {
            Ok((status, close)) => {
                if close {
                    self.io = None;
                }
                Ok(status)
            }
            Err(e) => {
                self.io = None;
                Err(e)
            }
        }
    }

    async fn exchange(
        io: &mut TcpStream,
        request: &[u8],
        input: &mut Vec<u8>,
        body: &mut Vec<u8>,
    ) -> std::io::Result<(u16, bool)> {
        let bad = |what: &str| std::io::Error::other(what.to_string());
        io.write_all(request).await?;
        let head_end = loop {
            if let Some(i) = input.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            Self::fill(io, input).await?;
        };
        let head = std::str::from_utf8(&input[..head_end]).map_err(|_| bad("response head is not UTF-8"))?;
        let mut lines = head.split("\r\n");
        let status: u16 = lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad("bad status line"))?;
        let (mut len, mut close) = (0usize, false);
        for line in lines {
            let Some((k, v)) = line.split_once(':') else {
                continue;
            };
            let (k, v) = (k.trim(), v.trim());
            if k.eq_ignore_ascii_case("content-length") {
                len = v.parse().map_err(|_| bad("bad content-length"))?;
            } else if k.eq_ignore_ascii_case("connection") && v.eq_ignore_ascii_case("close") {
                close = true;
            }
        }
        if len > MAX_RESPONSE_BYTES {
            return Err(bad("response too large"));
        }
        while input.len() < head_end + len {
            Self::fill(io, input).await?;
        }
        body.clear();
        body.extend_from_slice(&input[head_end..head_end + len]);
        input.drain(..head_end + len);
        Ok((status, close))
    }

    async fn fill(io: &mut TcpStream, input: &mut Vec<u8>) -> std::io::Result<()> {
        if input.len() > MAX_RESPONSE_BYTES {
            return Err(std::io::Error::other("response too large"));
        }
        let n = io.read_buf(input).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        Ok(())
    }
}
