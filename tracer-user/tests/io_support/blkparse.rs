//! `ttrace export --format blkparse` lines, parsed and checked against the
//! model's extents, its tensor table and the trace's ubatches.

use ttrace::{analyze::Analysis, model::FileExtents};

/// One line of `ttrace export --format blkparse`.
#[derive(Debug)]
pub struct BlkLine {
    pub dev: (u32, u32),
    pub ts_ns: u64,
    pub action: char,
    pub rwbs: String,
    pub sector: u64,
    pub sectors: u64,
    /// The bracket: the command of an issue, the error of a completion.
    pub last: String,
    /// ttrace's suffix: `key=value` pairs.
    pub suffix: std::collections::BTreeMap<String, String>,
    pub line: String,
}

/// blkparse's `%D %2c %8s %5T.%9t %5p %2a %3d %S + %n [%C]`, then the suffix.
pub fn parse_blkparse(line: &str) -> BlkLine {
    // The bracket is the last field before the suffix; a command may hold
    // spaces (`opt cgu.0`), so it is cut out before splitting on them.
    let (blk, suffix) = line.split_once("] ").unwrap_or((line, ""));
    let (head, bracket) = blk.rsplit_once(" [").unwrap_or_else(|| panic!("no [..] in {line}"));
    let mut f: Vec<&str> = head.split_whitespace().collect();
    let bracket = format!("[{bracket}]");
    f.push(&bracket);
    assert!(f.len() == 11 && f[0].contains(',') && f[3].contains('.') && f[8] == "+", "not blkparse: {line}");
    let (major, minor) = f[0].split_once(',').unwrap();
    let (secs, nanos) = f[3].split_once('.').unwrap();
    assert_eq!(nanos.len(), 9, "nanosecond times: {line}");
    let action = f[5].chars().next().unwrap();
    assert_eq!(f[5].len(), 1, "{line}");
    let last = f[10].strip_prefix('[').unwrap_or_else(|| panic!("no [..] in {line}"));
    let last = last.strip_suffix(']').unwrap_or(last).to_string();
    let suffix = suffix
        .split_whitespace()
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or_else(|| panic!("suffix `{kv}` is not key=value: {line}"));
            (k.to_string(), v.to_string())
        })
        .collect();
    BlkLine {
        dev: (major.parse().unwrap(), minor.parse().unwrap()),
        ts_ns: secs.parse::<u64>().unwrap() * 1_000_000_000 + nanos.parse::<u64>().unwrap(),
        action,
        rwbs: f[6].to_string(),
        sector: f[7].parse().unwrap(),
        sectors: f[9].parse().unwrap(),
        last,
        suffix,
        line: line.to_string(),
    }
}

/// What ttrace appends to each line, checked against the model's FIEMAP
/// extents and tensor table and the trace's ubatches: the first tensor the
/// request read, the file offset where it starts, its layer, the ubatch it
/// was issued (or completed) in; a completion carries the issue's tensor and
/// offset, its error in brackets, and follows its issue. Returns the
/// completions whose issue is not in the export, as (sector, sectors): the
/// caller holds them against the issues the kernel skipped ttrace's program
/// for.
pub fn check_blkparse_lines(lines: &[BlkLine], a: &Analysis, extents: &FileExtents) -> Vec<(u64, u64)> {
    let table = &a.models[0];
    let base = extents.device.partition_start_sector * 512;
    let disk = (extents.device.disk_major.unwrap(), extents.device.disk_minor.unwrap());
    let start = a.header.start_monotonic_ns;
    // The request's file byte ranges, in disk order.
    let file_ranges = |sector: u64, sectors: u64| -> Vec<(u64, u64)> {
        let (from, to) = (sector * 512, (sector + sectors) * 512);
        let mut v: Vec<(u64, u64, u64)> = extents
            .extents
            .iter()
            .filter_map(|e| {
                let (s, end) = (base + e.physical, base + e.physical + e.length);
                (to.min(end) > from.max(s)).then(|| (s, e.logical + from.max(s) - s, e.logical + to.min(end) - s))
            })
            .collect();
        v.sort_unstable();
        v.into_iter().map(|(_, f, t)| (f, t)).collect()
    };
    let mut by_offset: Vec<_> = table.tensors.iter().collect();
    by_offset.sort_by_key(|t| t.file_offset);
    let layer_of = |name: &str| {
        name.strip_prefix("blk.")
            .and_then(|r| r.split_once('.'))
            .map_or_else(|| "-".to_string(), |(n, _)| n.to_string())
    };
    let mut issued: std::collections::HashMap<(u64, u64), &BlkLine> = std::collections::HashMap::new();
    let mut issues_by_when: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
    let mut without_issue = Vec::new();
    for l in lines {
        let line = &l.line;
        assert_eq!(l.dev, disk, "the model's disk: {line}");
        assert!(matches!(l.action, 'D' | 'C'), "{line}");
        assert!(l.rwbs.contains('R'), "model reads: {line}");
        let ranges = file_ranges(l.sector, l.sectors);
        assert!(!ranges.is_empty(), "only requests in the model's extents: {line}");
        assert_eq!(l.suffix["file_off"], ranges[0].0.to_string(), "{line}");
        let first = ranges
            .iter()
            .find_map(|&(f, t)| by_offset.iter().find(|x| x.file_offset < t && x.file_offset + x.size_bytes > f));
        let (name, layer) = first.map_or(("-".to_string(), "-".to_string()), |t| (t.name.clone(), layer_of(&t.name)));
        assert_eq!(l.suffix["tensor"], name, "{line}");
        assert_eq!(l.suffix["layer"], layer, "{line}");
        if let Some(t) = first {
            assert_eq!(t.layer.map_or_else(|| "-".to_string(), |n| n.to_string()), layer, "{line}");
        }
        // The ubatch: by time, against the trace's graphs.
        let ts = start + l.ts_ns;
        let when = &l.suffix["ubatch"];
        match when.as_str() {
            "load" => assert!(a.ubatches.first().is_none_or(|u| ts <= u.start_ns), "{line}"),
            "between" => {
                assert!(a.ubatches.first().is_some_and(|u| ts >= u.start_ns), "{line}");
                let inside = a.ubatches.iter().any(|u| u.start_ns < ts && u.end_ns.is_some_and(|e| ts < e));
                assert!(!inside, "between graphs, yet inside one: {line}");
            }
            k => {
                let u = &a.ubatches[k.parse::<usize>().unwrap_or_else(|_| panic!("ubatch={k}: {line}"))];
                assert!(u.start_ns <= ts && u.end_ns.is_none_or(|e| ts <= e), "{line} outside ubatch {k}");
            }
        }
        for k in l.suffix.keys() {
            assert!(["tensor", "file_off", "ubatch", "layer", "op", "tensors"].contains(&k.as_str()), "{line}");
        }
        if let Some(op) = l.suffix.get("op") {
            assert!(a.header.op_names.contains(op) && when.parse::<u32>().is_ok(), "{line}");
        }
        if l.action == 'D' {
            assert!(!l.last.is_empty(), "an issue names its command: {line}");
            let key = if when.parse::<u32>().is_ok() { format!("ubatch {when}") } else { when.clone() };
            *issues_by_when.entry(key).or_default() += 1;
            issued.insert((l.sector, l.sectors), l);
        } else {
            assert_eq!(l.last, "0", "a completion's error: {line}");
            assert!(!l.suffix.contains_key("op"), "op= only on issues: {line}");
            let Some(d) = issued.get(&(l.sector, l.sectors)) else {
                without_issue.push((l.sector, l.sectors));
                continue;
            };
            assert!(d.ts_ns <= l.ts_ns, "{line}");
            for k in ["tensor", "file_off", "layer"] {
                assert_eq!(d.suffix[k], l.suffix[k], "{line} vs its issue {}", d.line);
            }
        }
    }
    // Per ubatch (and load, between), the issues are the ones the correlator counted.
    let counted: std::collections::BTreeMap<String, u64> =
        a.io.by_when.iter().filter(|(_, w)| w.disk.issues > 0).map(|(k, w)| (k.to_string(), w.disk.issues)).collect();
    assert_eq!(issues_by_when, counted, "D lines per ubatch vs report --json io.by_when");
    without_issue
}
