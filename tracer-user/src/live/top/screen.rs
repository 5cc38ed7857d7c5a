//! The full-screen view: draws the last [`Interval`] and reads keys. It
//! computes nothing; the interval is the aggregator's.

use std::io::{self, Stdout};

use ratatui::{
    Terminal,
    backend::CrosstermBackend,
    crossterm::{
        event::{self, Event, KeyCode, KeyEventKind, KeyModifiers},
        execute,
        terminal::{EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode},
    },
    layout::{Constraint, Layout},
    style::{Modifier, Style},
    text::Line,
    widgets::{Block, Borders, Paragraph, Row, Table},
};

use super::aggregate::{Interval, SortKey};
use crate::units::human_bytes;

/// The table under the header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pane {
    Tensors,
    Layers,
    Components,
    Experts,
    Sequences,
}

impl Pane {
    const ALL: [Pane; 5] = [Pane::Tensors, Pane::Layers, Pane::Components, Pane::Experts, Pane::Sequences];

    fn label(self) -> &'static str {
        match self {
            Pane::Tensors => "tensors",
            Pane::Layers => "layers",
            Pane::Components => "components",
            Pane::Experts => "experts",
            Pane::Sequences => "sequences",
        }
    }

    fn next(self) -> Self {
        let i = Self::ALL.iter().position(|&p| p == self).unwrap_or(0);
        Self::ALL[(i + 1) % Self::ALL.len()]
    }
}

/// What a key asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    None,
    Redraw,
    Quit,
}

pub struct Screen {
    terminal: Terminal<CrosstermBackend<Stdout>>,
    pub pane: Pane,
    pub sort: SortKey,
    pub paused: bool,
    /// What the target is, for the title.
    pub title: String,
    last: Option<Interval>,
}

impl Screen {
    /// Take over the terminal (raw mode, alternate screen) until dropped.
    pub fn open(title: String) -> io::Result<Self> {
        enable_raw_mode()?;
        let mut out = io::stdout();
        if let Err(e) = execute!(out, EnterAlternateScreen) {
            let _ = disable_raw_mode();
            return Err(e);
        }
        let terminal = Terminal::new(CrosstermBackend::new(out))?;
        Ok(Self { terminal, pane: Pane::Tensors, sort: SortKey::Disk, paused: false, title, last: None })
    }

    /// A new interval; shown unless paused.
    pub fn show(&mut self, interval: Interval) -> io::Result<()> {
        if !self.paused || self.last.is_none() {
            self.last = Some(interval);
        }
        self.draw()
    }

    /// Keys pressed since the last call, without waiting.
    pub fn poll_keys(&mut self) -> io::Result<Action> {
        let mut action = Action::None;
        while event::poll(std::time::Duration::ZERO)? {
            let Event::Key(key) = event::read()? else { continue };
            if key.kind != KeyEventKind::Press {
                continue;
            }
            match key.code {
                KeyCode::Char('q') | KeyCode::Esc => return Ok(Action::Quit),
                KeyCode::Char('c') if key.modifiers.contains(KeyModifiers::CONTROL) => return Ok(Action::Quit),
                KeyCode::Tab | KeyCode::Right => self.pane = self.pane.next(),
                KeyCode::Char('s') => self.sort = self.sort.next(),
                KeyCode::Char('p') | KeyCode::Char(' ') => self.paused = !self.paused,
                KeyCode::Char(c @ '1'..='5') => self.pane = Pane::ALL[(c as u8 - b'1') as usize],
                _ => continue,
            }
            action = Action::Redraw;
        }
        Ok(action)
    }

    pub fn draw(&mut self) -> io::Result<()> {
        let (pane, sort, paused, title) = (self.pane, self.sort, self.paused, self.title.clone());
        let last = self.last.as_ref();
        self.terminal.draw(|frame| {
            let [head, tabs, body] =
                Layout::vertical([Constraint::Length(6), Constraint::Length(1), Constraint::Min(3)])
                    .areas(frame.area());
            frame.render_widget(Paragraph::new(header(last, &title, paused)).block(Block::bordered()), head);
            frame.render_widget(Paragraph::new(tab_line(pane, sort)), tabs);
            let Some(i) = last else { return };
            let (heads, rows, widths) = table(i, pane, sort, body.height as usize);
            let bold = Style::default().add_modifier(Modifier::BOLD);
            let table =
                Table::new(rows, widths).header(Row::new(heads).style(bold)).block(Block::new().borders(Borders::TOP));
            frame.render_widget(table, body);
        })?;
        Ok(())
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        let _ = disable_raw_mode();
        let _ = execute!(self.terminal.backend_mut(), LeaveAlternateScreen);
        let _ = self.terminal.show_cursor();
    }
}

fn rate(bytes_per_s: f64) -> String {
    format!("{}/s", human_bytes(bytes_per_s.round() as u64))
}

fn header(i: Option<&Interval>, title: &str, paused: bool) -> Vec<Line<'static>> {
    let state = if paused { "  [paused]" } else { "" };
    let Some(i) = i else {
        return vec![Line::from(format!("ttrace top  {title}{state}")), Line::from("waiting for the first interval…")];
    };
    let share = if i.model_bytes > 0 { 100.0 * i.resident_bytes as f64 / i.model_bytes as f64 } else { 0.0 };
    let memory = i.memory.map_or_else(String::new, |m| {
        format!("  cgroup memory {} of {}", human_bytes(m.usage_bytes), human_bytes(m.limit_bytes))
    });
    vec![
        Line::from(format!("ttrace top  {title}  t {:.1} s  interval {:.2} s{state}", i.t, i.interval_s)),
        Line::from(format!(
            "tokens/s {:.1}  prompt {:.1}/s  generated {:.1}/s",
            i.tokens_per_s, i.prompt_per_s, i.generated_per_s
        )),
        Line::from(format!("tokens total  prompt {}  generated {}", i.prompt_total, i.generated_total)),
        Line::from(format!(
            "disk {}  faults {:.0}/s (model {:.0}/s)  weights {}  page cache {} of {} ({share:.1}%){memory}",
            rate(i.disk_bytes_per_s),
            i.faults_per_s,
            i.model_faults_per_s,
            rate(i.weight_bytes_per_s),
            human_bytes(i.resident_bytes),
            human_bytes(i.model_bytes),
        )),
    ]
}

fn tab_line(pane: Pane, sort: SortKey) -> Line<'static> {
    let tabs: Vec<String> = Pane::ALL
        .iter()
        .enumerate()
        .map(|(n, &p)| if p == pane { format!("[{}]", p.label()) } else { format!(" {} ", n + 1) })
        .collect();
    Line::from(format!("{}  sort: {}   tab: pane  s: sort  p: pause  q: quit", tabs.join(" "), sort.label()))
}

type TableParts = (Vec<String>, Vec<Row<'static>>, Vec<Constraint>);

fn table(i: &Interval, pane: Pane, sort: SortKey, height: usize) -> TableParts {
    let n = height.saturating_sub(2);
    let group_heads = || ["weights", "disk", "faults/s", "resident", "size"].map(String::from);
    match pane {
        Pane::Tensors => {
            let mut heads = vec!["tensor".to_string()];
            heads.extend(group_heads());
            let rows = i
                .top(sort, n)
                .into_iter()
                .map(|r| {
                    let rates = (r.weight_bytes_per_s, r.disk_bytes_per_s, r.faults_per_s);
                    stats_row(&r.name, rates, r.resident_bytes, r.size_bytes)
                })
                .collect();
            (heads, rows, widths(&[32, 12, 12, 9, 11, 11]))
        }
        Pane::Layers | Pane::Components => {
            let groups = if pane == Pane::Layers { &i.layers } else { &i.components };
            let mut heads = vec![if pane == Pane::Layers { "layer" } else { "component" }.to_string()];
            heads.extend(group_heads());
            let rows = groups
                .iter()
                .take(n)
                .map(|g| {
                    let rates = (g.weight_bytes_per_s, g.disk_bytes_per_s, g.faults_per_s);
                    stats_row(&g.name, rates, g.resident_bytes, g.size_bytes)
                })
                .collect();
            (heads, rows, widths(&[16, 12, 12, 9, 11, 11]))
        }
        Pane::Experts => {
            // One row per layer; a cell per expert, as a heat glyph of its share of the row's routings.
            let n_experts = i.experts.values().map(Vec::len).max().unwrap_or(0);
            let heads = vec!["layer".to_string(), format!("experts 0..{n_experts} (share of the layer's routings)")];
            let rows = i
                .experts
                .iter()
                .take(n)
                .map(|(layer, counts)| {
                    let total: u64 = counts.iter().sum::<u64>().max(1);
                    let cells: String =
                        (0..n_experts).map(|e| heat(counts.get(e).copied().unwrap_or(0), total)).collect();
                    Row::new(vec![layer.to_string(), cells])
                })
                .collect();
            (heads, rows, vec![Constraint::Length(6), Constraint::Min(10)])
        }
        Pane::Sequences => {
            let heads = ["sequence", "tokens/s", "prompt", "generated"].map(String::from).to_vec();
            let rows = i
                .sequences
                .iter()
                .take(n)
                .map(|s| {
                    Row::new(vec![
                        s.seq.to_string(),
                        format!("{:.1}", s.tokens_per_s),
                        s.prompt.to_string(),
                        s.generated.to_string(),
                    ])
                })
                .collect();
            (heads, rows, widths(&[10, 10, 10, 10]))
        }
    }
}

/// A tensor's or a group's row: (weights, disk, faults) per second, then bytes.
fn stats_row(name: &str, (weights, disk, faults): (f64, f64, f64), resident: u64, size: u64) -> Row<'static> {
    Row::new(vec![
        name.to_string(),
        rate(weights),
        rate(disk),
        format!("{faults:.0}"),
        human_bytes(resident),
        human_bytes(size),
    ])
}

fn widths(w: &[u16]) -> Vec<Constraint> {
    w.iter().map(|&w| Constraint::Length(w)).collect()
}

/// ` .:-=+*#%@` by share: the expert grid's cells.
fn heat(count: u64, total: u64) -> char {
    const RAMP: &[u8] = b" .:-=+*#%@";
    let share = count as f64 / total as f64;
    // Twice the uniform share (of 8 experts, say) already saturates little.
    let level = ((share * 4.0).sqrt() * (RAMP.len() - 1) as f64).round() as usize;
    RAMP[level.min(RAMP.len() - 1)] as char
}
