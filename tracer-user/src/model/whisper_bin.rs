//! whisper.cpp's model file: the legacy ggml format its loader
//! (`whisper_model_load`) reads, and its converters
//! (models/convert-pt-to-ggml.py) write. No alignment and no metadata
//! keys, just records in a row:
//! - magic `0x67676d6c` ("ggml" as a little-endian u32), eleven i32
//!   hyper-parameters (`WHISPER_HPARAMS`, in that order);
//! - the mel filter bank: i32 `n_mel`, i32 `n_fft`, then `n_mel * n_fft` f32;
//! - the vocabulary: i32 count, then per token an i32 length and its bytes;
//! - tensors to the end of the file, each i32 `n_dims`, i32 name length,
//!   i32 ggml type, `n_dims` i32 `ne` (ne0 first), the name, the data.
//!
//! Read into a [`GgufHeader`] (version 0, the hyper-parameters as `whisper.*`
//! keys, alignment 1) so that one model map serves both formats.

use std::io::Read;

use super::{
    GgmlType,
    gguf::{GgufHeader, KeyValue, MAX_DIMS, TensorRecord},
    gguf_value::Value,
};

/// The first four bytes of the file.
pub const MAGIC: [u8; 4] = 0x6767_6d6c_u32.to_le_bytes();
/// `GgufHeader::version` of a model read from this format.
pub const LEGACY_VERSION: u32 = 0;
pub const WHISPER_HPARAMS: [&str; 11] = [
    "n_vocab",
    "n_audio_ctx",
    "n_audio_state",
    "n_audio_head",
    "n_audio_layer",
    "n_text_ctx",
    "n_text_state",
    "n_text_head",
    "n_text_layer",
    "n_mels",
    "ftype",
];

#[derive(Debug, thiserror::Error)]
pub enum WhisperBinError {
    #[error("not whisper.cpp's ggml format: magic is {0:02x?}")]
    BadMagic([u8; 4]),
    #[error("at byte {offset}: file ends early: {need} bytes needed, {left} left")]
    Truncated { offset: u64, need: u64, left: u64 },
    #[error("at byte {offset}: {what} is {value}, out of range")]
    OutOfRange { offset: u64, what: &'static str, value: i64 },
    #[error("at byte {offset}: tensor {name:?} has unknown ggml type {ggml_type}")]
    UnknownType { offset: u64, name: String, ggml_type: u32 },
    #[error("at byte {offset}: tensor {name:?}: {ne:?} is no whole number of {ty} blocks")]
    BadShape { offset: u64, name: String, ne: Vec<u64>, ty: &'static str },
    #[error("reading at byte {offset}: {error}")]
    Io { offset: u64, error: std::io::Error },
}

type Result<T> = std::result::Result<T, WhisperBinError>;

struct Reader<R> {
    r: R,
    pos: u64,
    size: u64,
}

impl<R: Read> Reader<R> {
    fn bytes(&mut self, n: u64) -> Result<Vec<u8>> {
        let left = self.size.saturating_sub(self.pos);
        if n > left {
            return Err(WhisperBinError::Truncated { offset: self.pos, need: n, left });
        }
        let mut buf = vec![0; n as usize];
        self.r.read_exact(&mut buf).map_err(|error| WhisperBinError::Io { offset: self.pos, error })?;
        self.pos += n;
        Ok(buf)
    }

    /// Skips `n` bytes (tensor data, filters) without keeping them.
    fn skip(&mut self, n: u64) -> Result<()> {
        let left = self.size.saturating_sub(self.pos);
        if n > left {
            return Err(WhisperBinError::Truncated { offset: self.pos, need: n, left });
        }
        let copied = std::io::copy(&mut (&mut self.r).take(n), &mut std::io::sink())
            .map_err(|error| WhisperBinError::Io { offset: self.pos, error })?;
        if copied != n {
            return Err(WhisperBinError::Truncated { offset: self.pos, need: n, left: copied });
        }
        self.pos += n;
        Ok(())
    }

    fn i32(&mut self) -> Result<i32> {
        let b = self.bytes(4)?;
        Ok(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// An i32 that counts something: at least 0 and at most `max`.
    fn count(&mut self, what: &'static str, max: u64) -> Result<u64> {
        let offset = self.pos;
        let v = self.i32()?;
        match u64::try_from(v) {
            Ok(n) if n <= max => Ok(n),
            _ => Err(WhisperBinError::OutOfRange { offset, what, value: i64::from(v) }),
        }
    }
}

/// Reads the file's records, skipping the data, as a model header.
pub fn read<R: Read>(reader: R, file_size: u64) -> Result<GgufHeader> {
    let mut r = Reader { r: reader, pos: 0, size: file_size };
    let magic = r.bytes(4)?;
    if magic != MAGIC {
        return Err(WhisperBinError::BadMagic([magic[0], magic[1], magic[2], magic[3]]));
    }
    let mut kv = Vec::with_capacity(WHISPER_HPARAMS.len());
    for name in WHISPER_HPARAMS {
        let offset = r.pos;
        kv.push(KeyValue { key: format!("whisper.{name}"), value: Value::I32(r.i32()?), offset });
    }
    let n_mel = r.count("n_mel of the mel filters", 1 << 16)?;
    let n_fft = r.count("n_fft of the mel filters", 1 << 16)?;
    r.skip(n_mel * n_fft * 4)?;
    let n_tokens = r.count("the vocabulary's size", file_size / 4)?;
    for _ in 0..n_tokens {
        let len = r.count("a token's length", file_size)?;
        r.skip(len)?;
    }
    let infos_start = r.pos;
    let mut tensors = Vec::new();
    while r.pos < file_size {
        tensors.push(tensor(&mut r)?);
    }
    Ok(GgufHeader {
        version: LEGACY_VERSION,
        big_endian: false,
        kv,
        tensors,
        alignment: 1,
        infos_end: infos_start,
        data_offset: infos_start,
        file_size,
    })
}

fn tensor<R: Read>(r: &mut Reader<R>) -> Result<TensorRecord> {
    let info_offset = r.pos;
    let n_dims = r.count("a tensor's n_dims", MAX_DIMS as u64)?;
    let name_len = r.count("a tensor's name length", 4096)?;
    let type_at = r.pos;
    let type_id = r.count("a tensor's type", u64::from(u32::MAX >> 1))? as u32;
    let mut ne = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        ne.push(r.count("a tensor dimension", u64::from(i32::MAX as u32))?);
    }
    let name = String::from_utf8_lossy(&r.bytes(name_len)?).into_owned();
    let Some(ggml_type) = GgmlType::from_id(type_id) else {
        return Err(WhisperBinError::UnknownType { offset: type_at, name, ggml_type: type_id });
    };
    // Checked: a damaged file's dimensions may multiply past u64.
    let rows = ne.iter().skip(1).try_fold(1u64, |a, &n| a.checked_mul(n));
    let size = ne
        .first()
        .map_or(Some(u64::from(ggml_type.block_bytes)), |&ne0| ggml_type.row_bytes(ne0))
        .zip(rows)
        .and_then(|(row, rows)| row.checked_mul(rows));
    let Some(size_bytes) = size else {
        return Err(WhisperBinError::BadShape { offset: info_offset, name, ne, ty: ggml_type.name });
    };
    let file_offset = r.pos;
    r.skip(size_bytes)?;
    Ok(TensorRecord { name, ggml_type, shape: ne, rel_offset: file_offset, file_offset, size_bytes, info_offset })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file as whisper.cpp's converter writes it: `tensors` are
    /// (name, type id, ne, data bytes).
    fn file(hparams: [i32; 11], tokens: &[&[u8]], tensors: &[(&str, i32, &[i32], usize)]) -> Vec<u8> {
        let mut f = MAGIC.to_vec();
        let put = |f: &mut Vec<u8>, v: i32| f.extend(v.to_le_bytes());
        for h in hparams {
            put(&mut f, h);
        }
        put(&mut f, 2);
        put(&mut f, 3);
        f.extend([0u8; 24]);
        put(&mut f, tokens.len() as i32);
        for t in tokens {
            put(&mut f, t.len() as i32);
            f.extend(*t);
        }
        for &(name, ty, ne, bytes) in tensors {
            put(&mut f, ne.len() as i32);
            put(&mut f, name.len() as i32);
            put(&mut f, ty);
            for &n in ne {
                put(&mut f, n);
            }
            f.extend(name.as_bytes());
            f.extend(std::iter::repeat_n(0xab, bytes));
        }
        f
    }

    #[test]
    fn tensors_follow_the_vocabulary_unaligned() {
        let hp = [51864, 1500, 384, 6, 4, 448, 384, 6, 4, 80, 1];
        let f = file(
            hp,
            &[b"!", b"\xc4\xa0the"],
            &[("encoder.conv1.weight", 1, &[3, 80, 2], 960), ("a.bias", 0, &[5], 20)],
        );
        let h = read(&f[..], f.len() as u64).unwrap();
        assert_eq!(h.version, LEGACY_VERSION);
        assert_eq!(h.kv.iter().map(|kv| kv.value.clone()).collect::<Vec<_>>(), hp.map(Value::I32).to_vec());
        assert_eq!(h.kv[2].key, "whisper.n_audio_state");
        // magic + hparams + filter dims and data + vocabulary
        let first = 4 + 44 + 8 + 24 + 4 + (4 + 1) + (4 + 5);
        assert_eq!(h.tensors.len(), 2);
        let (a, b) = (&h.tensors[0], &h.tensors[1]);
        assert_eq!((a.info_offset, a.shape.as_slice(), a.ggml_type.name), (first, &[3, 80, 2][..], "F16"));
        assert_eq!((a.file_offset, a.size_bytes), (first + 12 + 12 + 20, 960));
        assert_eq!(b.file_offset, a.file_offset + 960 + 12 + 4 + 6);
        assert_eq!((b.size_bytes, b.name.as_str()), (20, "a.bias"));
    }

    #[test]
    fn damage_is_reported_where_it_is() {
        let hp = [1; 11];
        let f = file(hp, &[], &[("w", 1, &[4, 2], 16)]);
        assert!(matches!(read(&f[..f.len() - 1], f.len() as u64 - 1), Err(WhisperBinError::Truncated { .. })));
        let mut gguf = f.clone();
        gguf[..4].copy_from_slice(b"GGUF");
        assert!(matches!(read(&gguf[..], f.len() as u64), Err(WhisperBinError::BadMagic(m)) if &m == b"GGUF"));
        let bad_type = file(hp, &[], &[("w", 4, &[4], 0)]);
        let err = read(&bad_type[..], bad_type.len() as u64).unwrap_err();
        assert!(matches!(&err, WhisperBinError::UnknownType { ggml_type: 4, .. }), "{err}");
        let bad_shape = file(hp, &[], &[("q", 8, &[33], 0)]);
        assert!(matches!(read(&bad_shape[..], bad_shape.len() as u64), Err(WhisperBinError::BadShape { .. })));
        let huge = file(hp, &[], &[("h", 0, &[i32::MAX; 4], 0)]);
        assert!(matches!(read(&huge[..], huge.len() as u64), Err(WhisperBinError::BadShape { .. })));
    }
}
