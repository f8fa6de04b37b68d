//! Admission limits: concurrent connections (accepting waits for a free slot) and the
//! number of requests waiting for their first token (a full queue is refused at once).

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::serve::Listener;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A TCP listener that holds at most `limit` connections open; further clients wait in
/// the kernel's backlog until one closes.
pub struct LimitedListener {
    inner: TcpListener,
    slots: Arc<Semaphore>,
}

impl LimitedListener {
    /// Wraps `inner` with room for `limit` connections.
    pub fn new(inner: TcpListener, limit: usize) -> Self {
        Self {
            inner,
            slots: Arc::new(Semaphore::new(limit.max(1))),
        }
    }
}

/// A connection holding its slot until dropped.
pub struct LimitedStream {
    io: TcpStream,
    _slot: OwnedSemaphorePermit,
}

impl Listener for LimitedListener {
    type Io = LimitedStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let slot = self
            .slots
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let (io, addr) = Listener::accept(&mut self.inner).await;
        let _ = io.set_nodelay(true);
        (LimitedStream { io, _slot: slot }, addr)
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

impl AsyncRead for LimitedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for LimitedStream {
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
}

/// Requests accepted but without a first token yet, bounded.
#[derive(Debug)]
pub struct Queue {
    waiting: Arc<AtomicUsize>,
    limit: usize,
}

/// One place in the queue, given back on drop.
#[derive(Debug)]
pub struct QueueSlot(Arc<AtomicUsize>);

impl Queue {
    /// A queue of at most `limit` waiting requests.
    pub fn new(limit: usize) -> Self {
        Self {
            waiting: Arc::new(AtomicUsize::new(0)),
            limit,
        }
    }

    /// Takes a place, or `None` when the queue is full.
    pub fn enter(&self) -> Option<QueueSlot> {
        let before = self.waiting.fetch_add(1, Ordering::AcqRel);
        if before >= self.limit {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(QueueSlot(self.waiting.clone()))
    }

    /// The limit.
    pub fn limit(&self) -> usize {
        self.limit
    }
}

impl Drop for QueueSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_queue_refuses_until_a_place_is_given_back() {
        let q = Queue::new(2);
        let a = q.enter().expect("first");
        let _b = q.enter().expect("second");
        assert!(q.enter().is_none(), "full");
        drop(a);
        assert!(q.enter().is_some(), "a place came back");
    }
}
