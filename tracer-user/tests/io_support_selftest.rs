//! Self-tests of the I/O test support: the block-tracer parser, the blk
//! tracer as an oracle for a cold read (root), and the `touch` fault
//! generator.
// Traces real processes (or uses the live side): needs the default `live` feature.
#![cfg(feature = "live")]

mod io_support;

use std::{process::Command, time::Instant};

use io_support::{BlkTrace, covered_bytes, overlapping, overlapping_final, parse_trace};
use ttrace::model::FileExtents;

const SAMPLE: &str = "# tracer: blk
#
         cat-30939   [000] d..1.  2787.653510: 254,0    D  RA 320561152 + 1024 [cat]
       rustc-30477   [001] d.s1.  2787.654088: 254,0    C  RA 320561152 + 1024 [0]
  opt cgu.10-30930   [001] d.s1.  2787.650157: 254,0    C  RA 10486280 + 112 [-5]
         cat-30939   [000] d..1.  2787.646086: 254,0    P   N [cat]
       rustc-30477   [001] dN.1.  2787.670047: 254,0    X  RA 10142072 / 10144336 [rustc]
 weird-[x]-name-7 [003] 12.5: 8,16 Q WS 8 + 8 [weird-[x]-name]
CPU:1 [LOST 42 EVENTS]
something else entirely
";

#[test]
fn parses_blk_lines() {
    let log = parse_trace(SAMPLE);
    assert_eq!(log.records.len(), 4, "{log:?}");
    let d = &log.records[0];
    assert_eq!(
        (d.ts_ns, d.cpu, d.pid, d.comm.as_str(), d.action, d.rwbs.as_str()),
        (2_787_653_510_000, 0, 30939, "cat", 'D', "RA")
    );
    assert_eq!((d.sector, d.nr_sectors, d.dev, d.error), (320561152, 1024, (254, 0), None));
    assert_eq!(log.records[1].error, Some(0));
    assert_eq!((log.records[2].comm.as_str(), log.records[2].error), ("opt cgu.10", Some(-5)));
    let w = &log.records[3];
    assert_eq!((w.comm.as_str(), w.pid, w.cpu, w.ts_ns, w.dev), ("weird-[x]-name", 7, 3, 12_500_000_000, (8, 16)));
    assert_eq!(log.lost_events, 42);
    assert_eq!(log.unrecognised, vec!["something else entirely".to_string()]);
    assert_eq!(log.skipped, 6);
}

fn record(action: char, sector: u64, nr_sectors: u64) -> io_support::BlkRecord {
    io_support::BlkRecord {
        ts_ns: 0,
        cpu: 0,
        pid: 1,
        comm: "t".into(),
        action,
        rwbs: "R".into(),
        sector,
        nr_sectors,
        dev: (8, 0),
        error: None,
    }
}

#[test]
fn overlap_arithmetic() {
    use ttrace::model::{BlockDevice, FileExtents, extents::Extent};
    // A partition starting at sector 2048 of disk 8:0; two extents of 8 KiB.
    let device = BlockDevice {
        major: 8,
        minor: 1,
        name: Some("sda1".into()),
        disk: Some("sda".into()),
        disk_major: Some(8),
        disk_minor: Some(0),
        partition_start_sector: 2048,
    };
    let extents = vec![
        Extent { logical: 0, physical: 4096, length: 8192, flags: 0 },
        Extent { logical: 8192, physical: 1 << 20, length: 8192, flags: 0 },
    ];
    let ext = FileExtents::new("f".into(), device, extents);
    // First extent: disk sectors 2056..2072; second: 4096..4112.
    let mut other_disk = record('D', 2056, 16);
    other_disk.dev = (8, 16);
    let records = [
        record('D', 2050, 10), // 4 sectors overlap
        record('Q', 2056, 16), // not an issue
        record('D', 2060, 8),  // inside, 8 sectors, overlaps the first one
        record('D', 2064, 8),  // requeued, so not counted
        record('R', 2064, 8),
        record('D', 4104, 100), // last 8 sectors of the second extent
        record('D', 3000, 8),   // elsewhere
        other_disk,
    ];
    assert_eq!(overlapping(&records, &ext), (4, (4 + 8 + 8 + 8) * 512));
    assert_eq!(overlapping_final(&records, &ext), (3, (4 + 8 + 8) * 512));
    // Distinct: 2056..2060 and 2060..2068 merge to 12 sectors, plus 8.
    assert_eq!(covered_bytes(&records, &ext), (12 + 8) * 512);
}

/// The kernel's block tracer sees a cold 32 MiB read as D records covering
/// the file's extents, stamped with CLOCK_MONOTONIC.
#[test]
fn blk_tracer_covers_a_cold_read() {
    io_support::require_root("the kernel's block tracer and drop_caches");
    let dir = io_support::scratch("blk-selftest");
    let file = dir.join("cold.bin");
    let len = 32 << 20;
    io_support::write_file(&file, len);
    let ext = FileExtents::read(&file).unwrap();
    let disk = ext.device.disk.clone().expect("the test file is not on a block device");
    ttrace::live::target::drop_caches().unwrap();
    assert!(io_support::resident_bytes(&file).0 < len / 100, "drop_caches left the file resident");

    let trace = BlkTrace::start(&disk);
    let before = monotonic_ns();
    let read = std::fs::read(&file).unwrap();
    let after = monotonic_ns();
    let records = trace.stop();
    assert_eq!(read.len() as u64, len);

    let (requests, bytes) = overlapping_final(&records, &ext);
    let (raw_requests, raw_bytes) = overlapping(&records, &ext);
    let covered = covered_bytes(&records, &ext);
    eprintln!(
        "{} records; D in the file: {raw_requests} ({raw_bytes} bytes), without requeued ones {requests} \
         ({bytes} bytes); {covered} distinct bytes",
        records.len()
    );
    assert!(raw_requests >= requests && raw_bytes >= bytes);
    assert!(covered * 100 >= len * 99, "D records cover {covered} of {len} bytes ({requests} requests)");
    // A cold sequential read reads each byte once: requeued issues are not
    // counted twice.
    assert!(bytes <= len + (1 << 20), "{bytes} bytes issued for a {len}-byte file");
    let (lo, hi) = (before.saturating_sub(1000), after + 1000);
    for r in records.iter().filter(|r| r.action == 'D' && overlapping(std::slice::from_ref(r), &ext).0 == 1) {
        assert!(r.rwbs.starts_with('R'), "not a read: {r:?}");
        assert!((lo..=hi).contains(&r.ts_ns), "{r:?} outside the read's CLOCK_MONOTONIC window {before}..{after}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: writes into the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[test]
fn touch_reads_the_offsets_in_order() {
    let touch = io_support::build_touch();
    let dir = io_support::scratch("touch-selftest");
    let file = dir.join("data.bin");
    io_support::write_file(&file, 1 << 20);
    let offsets = ["8192", "0", "0x3000", "1048575", "8192"];
    let start = Instant::now();
    let out = Command::new(&touch).arg(&file).args(offsets).output().unwrap();
    assert!(out.status.success(), "touch failed: {}", String::from_utf8_lossy(&out.stderr));
    let touched = io_support::parse_touched(&String::from_utf8(out.stdout).unwrap());
    let got: Vec<u64> = touched.iter().map(|t| t.offset).collect();
    assert_eq!(got, [8192, 0, 0x3000, 1048575, 8192]);
    // One mapping: every address is base + offset, with a page-aligned base.
    let base = touched[0].addr - touched[0].offset;
    assert_eq!(base % 4096, 0, "{touched:?}");
    assert!(touched.iter().all(|t| t.addr - t.offset == base), "{touched:?}");
    eprintln!("touch ran in {:?}", start.elapsed());

    for bad in [&["1048576"][..], &["12abc"], &["-1"]] {
        let out = Command::new(&touch).arg(&file).args(bad).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "touch {bad:?} should fail");
        assert!(out.stdout.is_empty(), "touch {bad:?} touched something before failing");
    }
    let out = Command::new(&touch).arg(dir.join("missing")).arg("0").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot open"));
    let _ = std::fs::remove_dir_all(&dir);
}
