//! llama.cpp's own counters from a run's output: the `common_perf_print`
//! lines llama-completion prints at exit. Its logger can drop them (a queue
//! not drained at exit), so every figure is optional.

use std::path::Path;

use crate::export::dataset::LlamaCounters;

pub fn counters(log: &Path) -> LlamaCounters {
    std::fs::read(log).map(|b| parse(&String::from_utf8_lossy(&b))).unwrap_or_default()
}

/// `common_perf_print: prompt eval time =  1.75 ms /  17 tokens (...)`.
pub fn parse(text: &str) -> LlamaCounters {
    let mut c = LlamaCounters::default();
    for line in text.lines() {
        let Some(rest) = line.split_once("common_perf_print:").map(|(_, r)| r.trim()) else { continue };
        let Some((what, value)) = rest.split_once('=') else { continue };
        let mut words = value.split_whitespace();
        let ms = words.next().and_then(|w| w.parse::<f64>().ok());
        let count = match (words.next(), words.next(), words.next()) {
            (Some("ms"), Some("/"), Some(n)) => n.parse::<u64>().ok(),
            _ => None,
        };
        match what.trim() {
            "load time" => c.load_ms = ms,
            "prompt eval time" => (c.prompt_ms, c.prompt_tokens) = (ms, count),
            "eval time" => (c.eval_ms, c.eval_runs) = (ms, count),
            _ => {}
        }
    }
    c
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_the_perf_lines() {
        let c = super::parse(
            "common_perf_print:        load time =     123.45 ms\n\
             common_perf_print: prompt eval time =       1.75 ms /    17 tokens (    0.10 ms per token)\n\
             common_perf_print:        eval time =       2.34 ms /     7 runs   (    0.33 ms per token)\n",
        );
        assert_eq!((c.load_ms, c.prompt_tokens, c.eval_runs), (Some(123.45), Some(17), Some(7)));
        assert_eq!((c.prompt_ms, c.eval_ms), (Some(1.75), Some(2.34)));
        assert_eq!(super::parse("nothing"), Default::default());
    }
}
