//! A connection must send its first request's complete header (up to the blank line) within a
//! deadline, or it is closed. Without this a client that connects and sends nothing, or one
//! header byte at a time, holds a connection (a task and a file descriptor) for ever: axum's
//! server arms no header timer. The body has its own limit (`--body-timeout-s`, answered with
//! 408); this is the same limit applied to the header, where no HTTP answer is possible yet.
//!
//! Only the first header is timed: once a request has arrived the connection is the client's
//! (an SSE stream may run for hours while hyper polls the socket for a hang-up), and an idle
//! keep-alive connection after a complete request costs what any idle connection costs.

use axum::serve::Listener;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Sleep;

/// A TCP listener whose connections are closed when their first header is late.
#[derive(Debug)]
pub(crate) struct HeaderDeadline {
    inner: TcpListener,
    timeout: Duration,
}

impl HeaderDeadline {
    /// Wraps `inner`; every accepted connection gets `timeout` to send its first header.
    pub(crate) fn new(inner: TcpListener, timeout: Duration) -> Self {
        Self { inner, timeout }
    }
}

impl Listener for HeaderDeadline {
    type Io = Timed;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Timed, SocketAddr) {
        let (io, addr) = Listener::accept(&mut self.inner).await;
        let deadline = Some(Box::pin(tokio::time::sleep(self.timeout)));
        (Timed { io, deadline, timeout: self.timeout, matched: 0 }, addr)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// An accepted connection: reads fail with `TimedOut` (and hyper closes the connection) once
/// the deadline passes before the header's end has been read.
#[derive(Debug)]
pub(crate) struct Timed {
    io: TcpStream,
    /// Running until the end of the first header is seen; `None` after.
    deadline: Option<Pin<Box<Sleep>>>,
    timeout: Duration,
    /// How many bytes of `\r\n\r\n` the bytes read so far end with.
    matched: usize,
}

impl Timed {
    /// Advances the end-of-header match over `bytes`; true once `\r\n\r\n` has been read.
    fn scan(&mut self, bytes: &[u8]) -> bool {
        const END: &[u8; 4] = b"\r\n\r\n";
        for &b in bytes {
            self.matched =
                if b == END[self.matched] { self.matched + 1 } else { usize::from(b == b'\r') };
            if self.matched == END.len() {
                return true;
            }
        }
        false
    }
}

impl AsyncRead for Timed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let res = Pin::new(&mut self.io).poll_read(cx, buf);
        if self.deadline.is_none() {
            return res;
        }
        if let Poll::Ready(Ok(())) = &res {
            let new = buf.filled()[before..].to_vec();
            if self.scan(&new) {
                self.deadline = None;
                return res;
            }
            if !new.is_empty() {
                // Bytes arrived; the caller will read again and the deadline is polled then.
                return res;
            }
        }
        let timeout = self.timeout;
        match self.deadline.as_mut().map(|d| d.as_mut().poll(cx)) {
            Some(Poll::Ready(())) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no complete request header within {}s", timeout.as_secs_f64()),
            ))),
            _ => res,
        }
    }
}

impl AsyncWrite for Timed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_end_of_a_header_is_found_across_reads() {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        let _c = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let (io, _) = l.accept().await.expect("accept");
        let mut t = Timed { io, deadline: None, timeout: Duration::from_secs(1), matched: 0 };
        assert!(!t.scan(b"GET / HTTP/1.1\r\nHost: x\r\n\r"));
        assert!(t.scan(b"\n"));
        t.matched = 0;
        assert!(!t.scan(b"a\r\n\r\r\nb"), "\\r\\n\\r\\r\\n is not the end");
        assert!(t.scan(b"\r\n\r\n"));
    }
}
