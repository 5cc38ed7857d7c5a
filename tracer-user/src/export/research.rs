//! Report sections for access-pattern research: MoE routing and loaded vs
//! used, as text (the HTML page shows the same text).

use std::fmt::Write as _;

use crate::{
    analyze::{
        Phase,
        moe::MoeStats,
        usage::{Figures, LoadMode, Usage},
    },
    units::human_bytes,
};

const TOP: usize = 10;

pub fn render_moe(m: &MoeStats) -> String {
    let mut out = String::from("\nMoE routing (warm-up left out)\n");
    for l in &m.layers {
        let _ = writeln!(out, "  layer {:<3} {} experts, {} used per token", l.layer, l.n_expert, l.k);
        for p in &l.phases {
            let mut order: Vec<usize> = (0..p.activations.len()).collect();
            order.sort_by_key(|&e| (std::cmp::Reverse(p.activations[e]), e));
            let top: Vec<String> = order
                .iter()
                .take(5)
                .filter(|&&e| p.activations[e] > 0)
                .map(|&e| format!("{e}×{}", p.activations[e]))
                .collect();
            let unused = p.activations.iter().filter(|&&n| n == 0).count();
            let pair = p.pairs.first().map_or_else(|| "-".to_string(), |&(a, b, n)| format!("{a}+{b}×{n}"));
            let sticky = p.stickiness.map_or_else(|| "-".to_string(), |s| format!("{s:.2}"));
            let _ = writeln!(
                out,
                "    {:<9} {:>5} tokens  stickiness {sticky:<5}  most routed {}  never {unused}  top pair {pair}",
                phase_name(p.phase),
                p.tokens,
                top.join(" "),
            );
        }
        let mut read: Vec<_> = l.experts.iter().filter(|e| e.figures.disk_read > 0 || e.figures.faults > 0).collect();
        read.sort_by_key(|e| (std::cmp::Reverse(e.figures.disk_read), e.expert));
        if !read.is_empty() {
            let shown: Vec<String> = read
                .iter()
                .take(5)
                .map(|e| format!("{} {} ({} faults)", e.expert, human_bytes(e.figures.disk_read), e.figures.faults))
                .collect();
            let _ = writeln!(out, "    disk read per expert: {}", shown.join(", "));
        }
    }
    for note in &m.notes {
        let _ = writeln!(out, "  note: {note}");
    }
    out
}

fn phase_name(p: Phase) -> &'static str {
    match p {
        Phase::Warmup => "warmup",
        Phase::Prompt => "prompt",
        Phase::Generate => "generate",
        Phase::Aux => "aux",
    }
}

fn load_mode(m: LoadMode) -> &'static str {
    match m {
        LoadMode::Default => "default (mmap, MAP_POPULATE prefetch)",
        LoadMode::Mmap => "mmap",
        LoadMode::NoMmap => "no mmap (read into buffers)",
        LoadMode::Mlock => "mlock",
        LoadMode::MmapMlock => "mmap+mlock",
        LoadMode::DirectIo => "direct I/O",
    }
}

fn row(out: &mut String, key: &str, f: &Figures) {
    let _ = writeln!(
        out,
        "  {key:<36} {:>10} {:>10} {:>10} {:>10} {:>12} {:>10}",
        human_bytes(f.size_bytes),
        human_bytes(f.loaded),
        human_bytes(f.disk),
        human_bytes(f.used),
        human_bytes(f.loaded_unused),
        human_bytes(f.disk_read),
    );
}

pub fn render_usage(u: &Usage) -> String {
    let mut out = format!(
        "\nloaded vs used (load mode: {}; page cache {})\n",
        load_mode(u.load_mode),
        if u.caches_dropped { "dropped before the run" } else { "not dropped" }
    );
    let header = "        size     loaded       disk       used  never used  disk reads";
    let _ = writeln!(out, "  {:<36}{header}", "");
    row(&mut out, "total", &u.total);
    for (p, b) in &u.total.periods {
        let _ = writeln!(
            out,
            "    {:<10} loaded {:>10}  disk {:>10}  used {:>10}  disk reads {:>10}  faults {}",
            format!("{p:?}").to_lowercase(),
            human_bytes(b.loaded),
            human_bytes(b.disk),
            human_bytes(b.used),
            human_bytes(b.disk_read),
            b.faults
        );
    }
    for l in &u.layers {
        let key = l.layer.map_or_else(|| "non-layer".to_string(), |l| format!("layer {l}"));
        row(&mut out, &key, &l.figures);
    }
    let mut tensors: Vec<_> = u.tensors.iter().filter(|t| t.figures.loaded_unused > 0).collect();
    tensors.sort_by_key(|t| std::cmp::Reverse(t.figures.loaded_unused));
    if !tensors.is_empty() {
        let _ = writeln!(out, "  tensors loaded but never used, most first");
        for t in tensors.iter().take(TOP) {
            row(&mut out, &t.name, &t.figures);
        }
    }
    let mut experts: Vec<_> = u.experts.iter().filter(|e| e.figures.loaded_unused > 0).collect();
    experts.sort_by_key(|e| std::cmp::Reverse(e.figures.loaded_unused));
    if !experts.is_empty() {
        let never = u.experts.iter().filter(|e| e.figures.used == 0).count();
        let _ =
            writeln!(out, "  experts loaded but never used ({never} of {} never routed), most first", u.experts.len());
        for e in experts.iter().take(TOP) {
            row(&mut out, &format!("layer {} expert {}", e.layer, e.expert), &e.figures);
        }
    }
    for note in &u.notes {
        let _ = writeln!(out, "  note: {note}");
    }
    out
}
