//! The row schema of the JSONL, CSV and Parquet exports, declared once: the
//! JSONL/CSV header, the Parquet schema, `ttrace export --help` and the
//! documentation table all come from [`COLUMNS`]; tests hold the writers'
//! rows to it.

/// What a column holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColumnType {
    U64,
    U32,
    Text,
}

#[derive(Clone, Copy, Debug)]
pub struct Column {
    pub name: &'static str,
    pub ty: ColumnType,
    /// Empty (`null`, no value) where it does not apply.
    pub optional: bool,
    pub meaning: &'static str,
}

const fn col(name: &'static str, ty: ColumnType, optional: bool, meaning: &'static str) -> Column {
    Column { name, ty, optional, meaning }
}

use ColumnType::{Text, U32, U64};

/// Every row has every column, in this order.
pub const COLUMNS: [Column; 32] = [
    col("seq", U64, false, "order in the trace file (ops by start)"),
    col("kind", Text, false, "`op`, `marker`, `fault`, `page_cache`, `block`"),
    col("ts_ns", U64, false, "CLOCK_MONOTONIC"),
    col("rel_ns", U64, false, "since tracing started (`header.start_monotonic_ns`)"),
    col("dur_ns", U64, true, "op: until the next op on its thread or the graph's return"),
    col("tid", U32, false, "thread"),
    col("ubatch", U32, true, "index into `report --json` `ubatches`"),
    col("phase", Text, true, "`warmup`, `prompt`, `generate`, `aux`"),
    col("token_index", U32, true, "which generated token (generate ubatches)"),
    col(
        "name",
        Text,
        false,
        "op name (`MUL_MAT`), marker name, `page_fault`, `issue`/`complete`, `add`/`filemap_fault`",
    ),
    col("layer", U32, true, "op: its weights' layer, else the `-N` of its output name"),
    col("dst", Text, true, "op: output tensor name"),
    col("dst_memory", Text, true, "`model_file`, `copy`, `anon`, `other_file`, `unmapped`"),
    col("srcs", Text, true, "op: source tensor names joined by `;`"),
    col("n_srcs", U32, false, "op: number of sources"),
    col("weights_file", U32, false, "sources read through the model file mapping"),
    col("weights_copy", U32, false, "sources that are copies of model tensors"),
    col("weight_bytes", U64, false, "bytes of those weight sources (views as viewed)"),
    col("ith", U32, true, "op: thread index of the op's work split"),
    col("nth", U32, true, "op: thread count of the op's work split"),
    col("address", U64, true, "fault: address; marker: first argument"),
    col("ip", U64, true, "fault: instruction pointer"),
    col("error_code", U64, true, "fault: x86 error code (bit 1 write, bit 2 user); marker: cookie; block: error"),
    col("fault_tensor", Text, true, "fault, page_cache: the model tensor the address or page is in"),
    col("file_offset", U64, true, "fault: offset in the model file; page_cache: the page's offset"),
    col("op_seq", U64, true, "fault: `seq` of the op it happened in"),
    col("dev", U32, true, "block, page_cache: device number (kernel `dev_t` encoding)"),
    col("sector", U64, true, "block: first 512-byte sector"),
    col("io_bytes", U64, true, "block: request bytes; page_cache: folio bytes"),
    col("rwbs", Text, true, "block: blktrace's R/W/S/M flags"),
    col("seq_ids", Text, true, "the ubatch's sequence ids, in token order, joined by `;`"),
    col("positions", Text, true, "per sequence of `seq_ids`: its tokens' positions (`first-last`), joined by `;`"),
];

/// The JSONL keys and the CSV header, in order.
pub fn names() -> impl Iterator<Item = &'static str> {
    COLUMNS.iter().map(|c| c.name)
}

/// The Parquet message type (unsigned integers, UTF-8 strings).
pub fn parquet_schema() -> String {
    let mut schema = String::from("message ttrace_event {\n");
    for c in &COLUMNS {
        let repetition = if c.optional { "optional" } else { "required" };
        let physical = match c.ty {
            U64 => "int64",
            U32 => "int32",
            Text => "binary",
        };
        let logical = match c.ty {
            U64 => "INTEGER(64,false)",
            U32 => "INTEGER(32,false)",
            Text => "STRING",
        };
        schema.push_str(&format!("  {repetition} {physical} {} ({logical});\n", c.name));
    }
    schema.push('}');
    schema
}

/// `ttrace export --help`'s description of the rows.
pub fn help() -> String {
    let mut text = String::from(
        "Rows (jsonl, csv, parquet): one per op, marker, page fault, page-cache event and block request \
         (kinds op, marker, fault, page_cache, block); a column that does not apply is empty (null):\n",
    );
    for c in &COLUMNS {
        let ty = match c.ty {
            U64 => "u64",
            U32 => "u32",
            Text => "string",
        };
        text.push_str(&format!(
            "  {:<13} {:<8} {}\n",
            c.name,
            format!("{ty}{}", if c.optional { "?" } else { "" }),
            c.meaning
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_snake_case() {
        let mut seen = std::collections::HashSet::new();
        for c in &COLUMNS {
            assert!(seen.insert(c.name), "{} twice", c.name);
            assert!(c.name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'), "{}", c.name);
        }
    }

    #[test]
    fn the_owned_row_serialises_in_column_order() {
        let json = serde_json::to_string(&super::super::rows::Row::default()).unwrap();
        let keys: Vec<&str> =
            json.split(",\"").map(|k| k.trim_start_matches("{\"").split('"').next().unwrap()).collect();
        assert_eq!(keys, names().collect::<Vec<_>>());
    }
}
