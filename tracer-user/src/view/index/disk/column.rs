//! A column of plain values: owned while the index is built, a typed slice
//! of the memory-mapped index file once it is reopened. Either way it reads
//! as `&[T]`, so the queries do not know which.
//!
//! Serialised (only into an index file, by [`super::write`]), a column's
//! values go to the file's column area, 64-byte aligned and little-endian,
//! and the serialised tree keeps a [`ColumnRef`] to them: that tree is the
//! index's typed table of contents.

use std::{cell::RefCell, io::Write, ops::Deref, sync::Arc};

use bytemuck::Pod;
use memmap2::Mmap;
use serde::{Deserialize, Deserializer, Serialize, Serializer, de, ser};

/// Where a column's values are in the index file.
#[derive(Serialize, Deserialize)]
struct ColumnRef {
    offset: u64,
    len: u64,
    /// Bytes per value: a layout change that kept the version is caught.
    width: u32,
}

/// Column values start at multiples of this (a cache line: any `T` fits).
pub const ALIGN: u64 = 64;

enum Owner<T> {
    Owned(Vec<T>),
    Mapped(#[allow(dead_code)] Arc<Mmap>),
}

pub struct Column<T: Pod> {
    /// Into `owner`'s heap block or mapping, which never move.
    ptr: *const T,
    len: usize,
    owner: Owner<T>,
}

// SAFETY: a column is an immutable `[T]` owned by itself (a Vec, or a
// shared read-only mapping): as thread-safe as `Vec<T>`.
unsafe impl<T: Pod + Send> Send for Column<T> {}
unsafe impl<T: Pod + Sync> Sync for Column<T> {}

impl<T: Pod> Deref for Column<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        // SAFETY: `ptr..ptr + len` is inside the owner, aligned for `T`
        // (checked when mapped), and immutable while `self` lives.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl<T: Pod> From<Vec<T>> for Column<T> {
    fn from(v: Vec<T>) -> Column<T> {
        Column { ptr: v.as_ptr(), len: v.len(), owner: Owner::Owned(v) }
    }
}

impl<T: Pod> Default for Column<T> {
    fn default() -> Column<T> {
        Vec::new().into()
    }
}

impl<T: Pod> Column<T> {
    /// The values as a Vec: the column's own when it has one.
    pub fn into_vec(self) -> Vec<T> {
        match self.owner {
            Owner::Owned(v) => v,
            Owner::Mapped(_) => self.to_vec(),
        }
    }
}

impl<T: Pod + std::fmt::Debug> std::fmt::Debug for Column<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// Where the columns being serialised go: the index file, at `pos`.
pub struct Sink {
    pub out: Box<dyn Write>,
    pub pos: u64,
}

thread_local! {
    static SINK: RefCell<Option<Sink>> = const { RefCell::new(None) };
    static SOURCE: RefCell<Option<Arc<Mmap>>> = const { RefCell::new(None) };
    /// Why a column could not be mapped (postcard's errors carry no text).
    static REFUSED: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Runs `f` (a serialisation) with its columns written to `sink`; gives the
/// sink back, at its new position.
pub fn with_sink<R>(sink: Sink, f: impl FnOnce() -> R) -> (R, Option<Sink>) {
    SINK.with(|s| *s.borrow_mut() = Some(sink));
    let r = f();
    (r, SINK.with(|s| s.borrow_mut().take()))
}

/// Runs `f` (a deserialisation) with its columns mapped from `map`; the
/// first column refused, and why, if one was.
pub fn with_source<R>(map: &Arc<Mmap>, f: impl FnOnce() -> R) -> (R, Option<String>) {
    SOURCE.with(|s| *s.borrow_mut() = Some(map.clone()));
    REFUSED.with(|r| r.borrow_mut().take());
    let r = f();
    SOURCE.with(|s| s.borrow_mut().take());
    (r, REFUSED.with(|r| r.borrow_mut().take()))
}

fn refuse<E: de::Error>(why: String) -> E {
    REFUSED.with(|r| r.borrow_mut().get_or_insert_with(|| why.clone()).clone());
    E::custom(why)
}

impl<T: Pod> Serialize for Column<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let bytes: &[u8] = bytemuck::cast_slice(self);
        let placed = SINK.with(|sink| {
            let mut sink = sink.borrow_mut();
            let sink = sink.as_mut().ok_or("a column serialises only into an index file")?;
            let pad = sink.pos.next_multiple_of(ALIGN) - sink.pos;
            sink.out.write_all(&[0u8; ALIGN as usize][..pad as usize]).map_err(|_| "cannot write the index")?;
            let offset = sink.pos + pad;
            sink.out.write_all(bytes).map_err(|_| "cannot write the index")?;
            sink.pos = offset + bytes.len() as u64;
            Ok::<u64, &str>(offset)
        });
        let offset = placed.map_err(ser::Error::custom)?;
        let width = std::mem::size_of::<T>() as u32;
        if bytes.len() >= 1 << 20 {
            // What an index's size is made of (RUST_LOG=debug).
            log::debug!(
                "index column at {offset}: {} MiB, {} x {}",
                bytes.len() >> 20,
                self.len,
                std::any::type_name::<T>()
            );
        }
        ColumnRef { offset, len: self.len as u64, width }.serialize(s)
    }
}

impl<'de, T: Pod> Deserialize<'de> for Column<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Column<T>, D::Error> {
        let r = ColumnRef::deserialize(d)?;
        let map = SOURCE
            .with(|s| s.borrow().clone())
            .ok_or_else(|| refuse("a column deserialises only from an index file".into()))?;
        let width = std::mem::size_of::<T>();
        if r.width as usize != width {
            return Err(refuse(format!("a column of {}-byte values where {width} were expected", r.width)));
        }
        let end = usize::try_from(r.len)
            .ok()
            .and_then(|n| n.checked_mul(width))
            .and_then(|b| usize::try_from(r.offset).ok()?.checked_add(b))
            .filter(|&end| end <= map.len())
            .ok_or_else(|| refuse("a column reaches past the end of the index file".into()))?;
        let bytes = &map[r.offset as usize..end];
        let values: &[T] = bytemuck::try_cast_slice(bytes)
            .map_err(|e| refuse(format!("a column is not aligned for its values: {e:?}")))?;
        let (ptr, len) = (values.as_ptr(), values.len());
        Ok(Column { ptr, len, owner: Owner::Mapped(map) })
    }
}

impl<T: Pod> Column<T> {
    /// Changes the values as a Vec (a mapped column is copied first).
    pub fn edit<R>(&mut self, f: impl FnOnce(&mut Vec<T>) -> R) -> R {
        let mut v = if let Owner::Owned(v) = &mut self.owner { std::mem::take(v) } else { self.to_vec() };
        let r = f(&mut v);
        *self = v.into();
        r
    }
}

/// `#[serde(with = "once")]` for a value computed at first use: saved when
/// it was, and then not computed again.
pub mod once {
    use std::sync::OnceLock;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<T: Serialize, S: Serializer>(v: &OnceLock<T>, s: S) -> Result<S::Ok, S::Error> {
        v.get().serialize(s)
    }

    pub fn deserialize<'de, T: Deserialize<'de>, D: Deserializer<'de>>(d: D) -> Result<OnceLock<T>, D::Error> {
        Ok(Option::<T>::deserialize(d)?.map(OnceLock::from).unwrap_or_default())
    }
}

impl<'a, T: Pod> IntoIterator for &'a Column<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}
