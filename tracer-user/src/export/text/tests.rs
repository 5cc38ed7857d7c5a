use super::*;
use crate::export::rows::{Row, Srcs};

/// The CSV writer this module replaced, as the reference for its bytes.
fn reference_csv(r: &Row) -> String {
    use std::fmt::Write as _;
    fn push_field(line: &mut String, s: &str) {
        if s.contains([',', '"', '\n', '\r']) {
            line.push('"');
            line.push_str(&s.replace('"', "\"\""));
            line.push('"');
        } else {
            line.push_str(s);
        }
    }
    let mut line = String::new();
    let opt = |v: Option<u64>| v.map_or(String::new(), |v| v.to_string());
    let o32 = |v: Option<u32>| v.map_or(String::new(), |v| v.to_string());
    let _ = write!(
        line,
        "{},{},{},{},{},{},{},{},{},",
        r.seq,
        r.kind,
        r.ts_ns,
        r.rel_ns,
        opt(r.dur_ns),
        r.tid,
        o32(r.ubatch),
        r.phase.unwrap_or(""),
        o32(r.token_index)
    );
    push_field(&mut line, &r.name);
    let _ = write!(line, ",{},", o32(r.layer));
    push_field(&mut line, r.dst.as_deref().unwrap_or(""));
    let _ = write!(line, ",{},", r.dst_memory.unwrap_or(""));
    push_field(&mut line, r.srcs.as_deref().unwrap_or(""));
    let _ = write!(
        line,
        ",{},{},{},{},{},{},{},{},{},",
        r.n_srcs,
        r.weights_file,
        r.weights_copy,
        r.weight_bytes,
        o32(r.ith),
        o32(r.nth),
        opt(r.address),
        opt(r.ip),
        opt(r.error_code)
    );
    push_field(&mut line, r.fault_tensor.as_deref().unwrap_or(""));
    let _ =
        write!(line, ",{},{},{},{},{},", opt(r.file_offset), opt(r.op_seq), o32(r.dev), opt(r.sector), opt(r.io_bytes));
    push_field(&mut line, r.rwbs.as_deref().unwrap_or(""));
    line.push(',');
    push_field(&mut line, r.seq_ids.as_deref().unwrap_or(""));
    line.push(',');
    push_field(&mut line, r.positions.as_deref().unwrap_or(""));
    line.push('\n');
    line
}

const AWKWARD: &[&str] = &[
    "",
    "Qcur-0",
    "a,\"b\"",
    "x (view)",
    "tab\tnl\ncr\r",
    "\u{0}\u{1}\u{8}\u{b}\u{c}\u{1f}\u{7f}",
    "\\ é 😀",
    "\"",
    ";",
];

fn full<'a>(name: &'a str, srcs: &[&'a str]) -> Cells<'a> {
    Cells {
        seq: u64::MAX,
        kind: "op",
        ts_ns: 1,
        rel_ns: 0,
        dur_ns: Some(12_345),
        tid: u32::MAX,
        ubatch: Some(7),
        phase: Some("generate"),
        token_index: Some(0),
        name: name.into(),
        layer: Some(3),
        dst: Some(name),
        dst_memory: Some("model_file"),
        srcs: Some(Srcs::from_names(srcs)),
        n_srcs: srcs.len() as u32,
        weights_file: 1,
        weights_copy: 2,
        weight_bytes: 1 << 40,
        ith: Some(1),
        nth: Some(2),
        address: Some(0x7fff_0000_1234),
        ip: Some(9),
        error_code: Some(-5i64 as u64),
        fault_tensor: Some(name),
        file_offset: Some(4096),
        op_seq: Some(10),
        dev: Some(8 << 20),
        sector: Some(99),
        io_bytes: Some(512),
        rwbs: Some(name),
        seq_ids: Some("0;3"),
        positions: Some("0-15;16"),
    }
}

#[test]
fn lines_match_serde_json_and_the_former_csv() {
    let mut cases = vec![Cells::default(), Cells { kind: "marker", name: "marker#77".into(), ..Default::default() }];
    for &name in AWKWARD {
        cases.push(full(name, &[]));
        cases.push(full(name, AWKWARD));
        cases.push(full("MUL_MAT", &["blk.0.attn_q.weight", name]));
    }
    for c in &cases {
        let row = c.to_row();
        let mut out = Vec::new();
        json_line(c, &mut out);
        assert_eq!(String::from_utf8(out).unwrap(), serde_json::to_string(&row).unwrap() + "\n");
        let mut out = Vec::new();
        csv_line(c, &mut out);
        assert_eq!(String::from_utf8(out).unwrap(), reference_csv(&row));
    }
}

#[test]
fn csv_has_every_column_and_quotes() {
    let c = Cells { kind: "op", name: "MUL_MAT".into(), dst: Some("a,\"b\""), ..Default::default() };
    let mut line = Vec::new();
    csv_line(&c, &mut line);
    let line = String::from_utf8(line).unwrap();
    assert!(line.contains("\"a,\"\"b\"\"\""));
    let unquoted = line.replace("\"a,\"\"b\"\"\"", "x");
    assert_eq!(unquoted.trim_end().split(',').count(), crate::export::columns::COLUMNS.len());
}
