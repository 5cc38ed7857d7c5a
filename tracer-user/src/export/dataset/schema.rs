//! The sweep dataset's schema, declared once: the Parquet schemas, the
//! writers' checks, `docs/DATASET.md`'s table (a test keeps it in step) all
//! come from [`TABLES`]. Bump [`VERSION`] on any change to a table.
//!
//! Integers are signed (Parquet INT32/INT64 without the unsigned
//! annotation): Spark has no unsigned types and reads UINT64 as
//! DECIMAL(20,0). The `ops` table is `ttrace export --format parquet`'s rows
//! ([`super::super::columns`]), whose unsigned columns Spark reads that way.

/// Written into every `runs` row (`schema_version`).
pub const VERSION: i32 = 1;

/// What a column holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    I32,
    I64,
    F64,
    Bool,
    Text,
}

#[derive(Clone, Copy, Debug)]
pub struct Column {
    pub name: &'static str,
    pub ty: DType,
    /// Null where it does not apply.
    pub optional: bool,
    pub meaning: &'static str,
}

const fn req(name: &'static str, ty: DType, meaning: &'static str) -> Column {
    Column { name, ty, optional: false, meaning }
}

const fn opt(name: &'static str, ty: DType, meaning: &'static str) -> Column {
    Column { name, ty, optional: true, meaning }
}

use DType::{Bool, F64, I32, I64, Text};

/// The dataset's tables: `DIR/dataset/table=<name>/model=<model>/run_id=<id>/part-0.parquet`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Table {
    Runs,
    Ubatches,
    Tokens,
    Tensors,
    Routing,
    Io,
    /// `ttrace sweep --ops`: every event's row, as `ttrace export --format parquet`.
    Ops,
}

pub const TABLES: [Table; 7] =
    [Table::Runs, Table::Ubatches, Table::Tokens, Table::Tensors, Table::Routing, Table::Io, Table::Ops];

/// Hive partition columns, in the path of every file, not inside it.
pub const PARTITIONS: [Column; 2] = [
    req("model", Text, "the model file's name without `.gguf` (path partition)"),
    req("run_id", Text, "`r` and 12 hex digits of a hash of the run's parameters (path partition)"),
];

const RUNS: &[Column] = &[
    req("schema_version", I32, "this schema's version"),
    req("status", Text, "`ok`, or `failed` (then `error` says why and the figures are null)"),
    opt("error", Text, "why the run failed"),
    req("model_path", Text, "the model as the plan names it"),
    req("domain", Text, "the prompt's domain label"),
    req("prompt", Text, "the prompt text"),
    req("threads", I32, "`-t`"),
    opt("mem_limit_bytes", I64, "the memory cgroup's limit (null: none)"),
    req("cache", Text, "`cold` (a private copy of the model evicted before the run) or `warm`"),
    req("repeat", I32, "0-based repeat of the same parameters"),
    req("n_predict", I32, "`-n`"),
    req("command", Text, "the traced command line"),
    opt("clients", I32, "llama-server runs: concurrent `/completion` clients (and slots)"),
    req("host", Text, "the machine's host name"),
    req("started_unix_ms", I64, "when the run started"),
    req("trace", Text, "the trace file, relative to the sweep directory"),
    opt("llama_load_ms", F64, "llama.cpp's `common_perf_print`: load time"),
    opt("llama_prompt_tokens", I64, "llama.cpp's `common_perf_print`: prompt eval tokens"),
    opt("llama_prompt_ms", F64, "llama.cpp's `common_perf_print`: prompt eval time"),
    opt("llama_eval_runs", I64, "llama.cpp's `common_perf_print`: eval runs"),
    opt("llama_eval_ms", F64, "llama.cpp's `common_perf_print`: eval time"),
    opt("prompt_tokens", I64, "prompt tokens, warm-up apart (`report --json` `summary.prompt_tokens`)"),
    opt("generated_tokens", I64, "generate ubatches (one generated token each for llama-completion)"),
    opt("duration_ns", I64, "first to last traced event"),
    opt("ops", I64, "ops executed"),
    opt("tokens_per_s", F64, "generated tokens over the generate ubatches' time"),
    opt("weight_bytes_per_token", F64, "mean `weight_bytes` of the generate ubatches"),
    opt("disk_bytes_per_token", F64, "mean model-file bytes read from disk per generate ubatch"),
    opt("disk_bytes", I64, "model-file bytes read from disk over the run"),
    opt("faults_model", I64, "page faults on model-file pages"),
    opt("faults_major", I64, "major faults"),
    opt("faults_minor", I64, "minor faults"),
    opt("loaded_bytes", I64, "distinct model bytes brought into the page cache"),
    opt("used_bytes", I64, "distinct model bytes some op read"),
    opt("loaded_unused_bytes", I64, "loaded (or read from disk) and never read by an op"),
    opt("cgroup_peak_bytes", I64, "the memory cgroup's peak charge"),
    opt("cgroup_limit_hits", I64, "times the cgroup hit its limit"),
    opt("lost_events", I64, "events lost in the ring buffer or skipped by the kernel"),
];

const UBATCHES: &[Column] = &[
    req("ubatch", I32, "index into `report --json` `ubatches`"),
    req("phase", Text, "`warmup`, `prompt`, `generate`, `aux`"),
    opt("token_index", I32, "which generated token (generate ubatches)"),
    opt("n_tokens", I32, "tokens in the ubatch"),
    req("start_ns", I64, "CLOCK_MONOTONIC"),
    req("duration_ns", I64, "the graph's time"),
    req("ops", I64, "ops executed"),
    req("weight_bytes", I64, "weight bytes charged (`report --json` `stats.ubatches[].weight_bytes`)"),
    opt("disk_bytes", I64, "model-file bytes read from disk during the graph"),
    opt("faults_major", I64, "major faults during the graph"),
    opt("faults_minor", I64, "minor faults during the graph"),
];

const TOKENS: &[Column] = &[
    req("ubatch", I32, "the ubatch it was decoded in"),
    req("row", I32, "its index in the ubatch"),
    req("phase", Text, "the ubatch's phase"),
    opt("token_index", I32, "which generated token (generate ubatches)"),
    opt("token_id", I32, "the vocabulary id fed to the graph"),
    opt("seq", I32, "sequence id"),
    opt("pos", I32, "position in its sequence"),
    opt("kind", Text, "`prompt`, `generated`, `warmup`"),
    opt("output", Bool, "llama.cpp computes logits for it"),
];

const TENSORS: &[Column] = &[
    req("tensor", Text, "GGUF tensor name"),
    opt("layer", I32, "its layer"),
    req("period", Text, "`load`, `warmup`, `prompt`, `generate`, `other`, or `run` (distinct bytes over the run)"),
    req("size_bytes", I64, "the tensor's size"),
    req("loaded_bytes", I64, "distinct bytes brought into the page cache"),
    req("disk_bytes", I64, "distinct bytes read from disk"),
    req("used_bytes", I64, "distinct bytes some op read"),
    req("disk_read_bytes", I64, "bytes read from disk counting re-reads"),
    req("faults", I64, "page faults on it"),
    opt("loaded_unused_bytes", I64, "`run` rows: loaded and never read by an op"),
    opt("generate_weight_bytes", I64, "`run` rows: weight bytes charged over the generate ubatches"),
];

const ROUTING: &[Column] = &[
    req("ubatch", I32, "the ubatch"),
    req("phase", Text, "the ubatch's phase"),
    opt("token_index", I32, "which generated token (generate ubatches)"),
    req("row", I32, "the layer's routing row (the token in the ubatch; a prompt's last layer: its outputs)"),
    req("layer", I32, "MoE layer"),
    req("rank", I32, "0 for the expert ranked first, up to k-1"),
    req("expert", I32, "expert id"),
];

/// The I/O events of `ttrace export`'s rows (kinds `fault`, `page_cache`,
/// `block`), named and typed as there.
const IO: &[Column] = &[
    req("seq", I64, "order in the trace file"),
    req("kind", Text, "`fault`, `page_cache`, `block`"),
    req("ts_ns", I64, "CLOCK_MONOTONIC"),
    req("tid", I32, "thread"),
    opt("ubatch", I32, "the ubatch running then"),
    opt("phase", Text, "its phase"),
    opt("token_index", I32, "which generated token (generate ubatches)"),
    req("name", Text, "`page_fault`, `issue`/`complete`, `add`/`filemap_fault`"),
    opt("address", I64, "fault: address"),
    opt("tensor", Text, "the model tensor of a fault's address or a page; block: the first tensor read"),
    opt("file_offset", I64, "fault, page_cache, block: the offset in the model file (block: where it starts)"),
    opt("op_seq", I64, "fault: `seq` of the op it happened in (the `ops` table's `seq`)"),
    opt("sector", I64, "block: first 512-byte sector"),
    opt("io_bytes", I64, "block: request bytes; page_cache: folio bytes"),
    opt("rwbs", Text, "block: blktrace's R/W/S/M flags"),
];

impl Table {
    pub fn name(self) -> &'static str {
        match self {
            Table::Runs => "runs",
            Table::Ubatches => "ubatches",
            Table::Tokens => "tokens",
            Table::Tensors => "tensors",
            Table::Routing => "routing",
            Table::Io => "io",
            Table::Ops => "ops",
        }
    }

    pub fn meaning(self) -> &'static str {
        match self {
            Table::Runs => "One row per run: its parameters, llama.cpp's own counters, the summary figures",
            Table::Ubatches => "One row per ubatch (graph): time, ops, weight and disk bytes, faults",
            Table::Tokens => "One row per token of each ubatch: id, sequence, position",
            Table::Tensors => "Per tensor and period: loaded vs used, disk bytes, faults",
            Table::Routing => "MoE routing: per ubatch, layer and routed token, the experts used by rank",
            Table::Io => "Page faults, page-cache fills and block requests on the model, with tensor, op and token",
            Table::Ops => {
                "With `--ops` only: the rows of `ttrace export --format parquet`, every op, marker, fault, \
             page-cache and block event"
            }
        }
    }

    /// `None` for [`Table::Ops`], whose columns are the row export's.
    pub fn columns(self) -> Option<&'static [Column]> {
        match self {
            Table::Runs => Some(RUNS),
            Table::Ubatches => Some(UBATCHES),
            Table::Tokens => Some(TOKENS),
            Table::Tensors => Some(TENSORS),
            Table::Routing => Some(ROUTING),
            Table::Io => Some(IO),
            Table::Ops => None,
        }
    }

    /// The Parquet message type of one file of this table.
    pub fn parquet_schema(self) -> String {
        let Some(columns) = self.columns() else { return super::super::columns::parquet_schema() };
        let mut schema = format!("message ttrace_{} {{\n", self.name());
        for c in columns {
            let repetition = if c.optional { "optional" } else { "required" };
            let ty = match c.ty {
                I32 => "int32",
                I64 => "int64",
                F64 => "double",
                Bool => "boolean",
                Text => "binary",
            };
            let logical = if c.ty == Text { " (STRING)" } else { "" };
            schema.push_str(&format!("  {repetition} {ty} {}{logical};\n", c.name));
        }
        schema.push('}');
        schema
    }
}

fn type_name(c: &Column) -> String {
    let ty = match c.ty {
        I32 => "int32",
        I64 => "int64",
        F64 => "double",
        Bool => "boolean",
        Text => "string",
    };
    format!("{ty}{}", if c.optional { "?" } else { "" })
}

/// The documentation table (docs/DATASET.md, between its markers).
pub fn markdown() -> String {
    let mut out = format!("Schema version {VERSION}. Every file also has the partition columns of its path:\n\n");
    out += "| column | type | meaning |\n|---|---|---|\n";
    for c in &PARTITIONS {
        out += &format!("| `{}` | {} | {} |\n", c.name, type_name(c), c.meaning);
    }
    for table in TABLES {
        out += &format!("\n### `{}`\n\n{}.\n\n", table.name(), table.meaning());
        let Some(columns) = table.columns() else {
            out += "Its columns are the row export's: `ttrace export --help`.\n";
            continue;
        };
        out += "| column | type | meaning |\n|---|---|---|\n";
        for c in columns {
            out += &format!("| `{}` | {} | {} |\n", c.name, type_name(c), c.meaning);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_snake_case_and_not_partitions() {
        for table in TABLES {
            let mut seen: std::collections::HashSet<&str> = PARTITIONS.iter().map(|c| c.name).collect();
            for c in table.columns().unwrap_or(&[]) {
                assert!(seen.insert(c.name), "{}.{} twice or a partition column", table.name(), c.name);
                assert!(c.name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'));
            }
        }
    }

    #[test]
    fn every_schema_parses() {
        for table in TABLES {
            parquet::schema::parser::parse_message_type(&table.parquet_schema()).unwrap();
        }
    }
}

#[cfg(test)]
mod doc_tests {
    const START: &str = "<!-- dataset-schema: generated by `cargo test -p tracer-user dataset_schema_doc`; \
                         TTRACE_BLESS=1 rewrites it -->\n";
    const END: &str = "<!-- end dataset-schema -->";

    /// docs/DATASET.md's schema table is [`super::TABLES`]'.
    #[test]
    fn dataset_schema_doc() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/DATASET.md");
        let doc = std::fs::read_to_string(&path).unwrap();
        let start = doc.find(START).map(|i| i + START.len()).expect("the start marker");
        let end = doc[start..].find(END).map(|i| start + i).expect("the end marker");
        let table = super::markdown();
        if std::env::var_os("TTRACE_BLESS").is_some() {
            std::fs::write(&path, format!("{}{table}{}", &doc[..start], &doc[end..])).unwrap();
            return;
        }
        assert_eq!(&doc[start..end], table, "docs/DATASET.md's schema differs; rerun with TTRACE_BLESS=1");
    }
}
