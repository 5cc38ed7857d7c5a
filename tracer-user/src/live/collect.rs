//! Stage 2, collect: read the ring buffer through tokio's `AsyncFd` (woken by
//! the kernel's epoll notification, no busy polling) and decode records.

use std::{future::Future, io};

use aya::maps::{MapData, RingBuf};
use tokio::io::{Interest, unix::AsyncFd};

use crate::{
    events::{Event, decode},
    live::load::Logger,
};

pub struct EventStream {
    ring: AsyncFd<RingBuf<MapData>>,
    /// Records that did not decode; non-zero means the two sides disagree on layouts.
    pub decode_errors: u64,
}

impl EventStream {
    pub fn new(ring: RingBuf<MapData>) -> io::Result<Self> {
        Ok(Self { ring: register(ring)?, decode_errors: 0 })
    }

    /// Wait until the kernel signals new records. Readiness is cleared
    /// before the caller drains, so records arriving meanwhile re-arm it.
    pub async fn readable(&mut self) -> io::Result<()> {
        self.ring.readable_mut().await?.clear_ready();
        Ok(())
    }

    /// Wait until records are available, then pass each decoded one to `sink`.
    pub async fn next_batch(&mut self, sink: &mut impl FnMut(Event)) -> io::Result<usize> {
        self.readable().await?;
        Ok(self.drain_now(sink))
    }

    /// Take whatever is in the ring now, without waiting.
    pub fn drain_now(&mut self, sink: &mut impl FnMut(Event)) -> usize {
        drain(self.ring.get_mut(), &mut self.decode_errors, sink)
    }

    /// Collect until `stop` resolves, then drain what is left so nothing
    /// submitted before the stop is lost.
    pub async fn collect_until(
        &mut self,
        stop: impl Future<Output = ()>,
        sink: &mut impl FnMut(Event),
    ) -> io::Result<()> {
        tokio::pin!(stop);
        loop {
            tokio::select! {
                biased;
                () = &mut stop => break,
                batch = self.next_batch(sink) => { batch?; }
            }
        }
        self.drain_now(sink);
        Ok(())
    }
}

fn drain(ring: &mut RingBuf<MapData>, decode_errors: &mut u64, sink: &mut impl FnMut(Event)) -> usize {
    let mut n = 0;
    while let Some(record) = ring.next() {
        match decode(&record) {
            Ok(event) => sink(event),
            Err(e) => {
                *decode_errors += 1;
                log::warn!("dropping undecodable record: {e}");
            }
        }
        n += 1;
    }
    n
}

/// Forward kernel-side aya-log records to the `log` crate until the task is dropped.
pub fn spawn_logger(logger: Logger) -> io::Result<tokio::task::JoinHandle<()>> {
    let mut fd = register(logger)?;
    Ok(tokio::spawn(async move {
        while let Ok(mut guard) = fd.readable_mut().await {
            guard.get_inner_mut().flush();
            guard.clear_ready();
        }
    }))
}

pub(crate) fn register<T: std::os::fd::AsRawFd>(owner: T) -> io::Result<AsyncFd<T>> {
    // SAFETY: ring buffers and the logger own their map fd for their whole
    // lifetime and always return the same one.
    unsafe { AsyncFd::register_with_interest(owner, Interest::READABLE) }.map_err(|e| e.into_parts().1)
}
