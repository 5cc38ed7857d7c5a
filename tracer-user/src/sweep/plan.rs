//! A sweep plan (TOML) and the runs it expands to: every model × prompt ×
//! thread count × memory limit × repeat, in that nesting order. A run's id
//! hashes its parameters, so editing a plan keeps the ids (and the finished
//! runs) of the combinations that did not change.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::export::dataset::{Params, partition_value};

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("reading {path}")]
    Read { path: String, source: std::io::Error },
    #[error("{path}: {message}")]
    Toml { path: String, message: String },
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
}

/// Warm or cold page cache at the start of every run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheMode {
    /// The model as the plan names it, read through once before each run.
    #[default]
    Warm,
    /// A private copy of the model (its own inode, so no other process
    /// keeps its pages), evicted from the page cache before each run.
    Cold,
}

impl CacheMode {
    pub fn name(self) -> &'static str {
        match self {
            CacheMode::Warm => "warm",
            CacheMode::Cold => "cold",
        }
    }
}

/// What is traced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CommandKind {
    /// `llama-completion -m MODEL -p PROMPT -n N -t T -no-cnv [-c CTX] ARGS…`.
    #[default]
    Completion,
    /// `llama-server -m MODEL --host 127.0.0.1 --port P -t T -np CLIENTS [-c CTX] ARGS…`, sent one
    /// `/completion` of the prompt per client at once, then stopped.
    Server,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct CommandSpec {
    #[serde(default)]
    kind: CommandKind,
    /// The program; default `llama-completion` (`llama-server`) from PATH.
    program: Option<PathBuf>,
    /// `server`: concurrent clients (and slots, `-np`).
    clients: Option<u32>,
    /// `server`: more fields of each `/completion` request (`ignore_eos`, `temperature`, ...).
    request: Option<toml::Table>,
    /// Extra arguments after the plan's own.
    #[serde(default)]
    args: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PromptSpec {
    domain: String,
    text: Option<String>,
    /// Relative to the plan's directory.
    file: Option<PathBuf>,
}

/// A model: its path, or a table with the memory limits for it alone (a
/// small model and a large one rarely share useful limits).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ModelSpec {
    Path(PathBuf),
    Table { path: PathBuf, mem_limits: Vec<String> },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PlanFile {
    models: Vec<ModelSpec>,
    prompts: Vec<PromptSpec>,
    #[serde(default = "default_threads")]
    threads: Vec<u32>,
    /// Sizes (`160M`) or `none`; empty: no limit.
    #[serde(default)]
    mem_limits: Vec<String>,
    #[serde(default)]
    cache: CacheMode,
    #[serde(default = "one")]
    repeats: u32,
    #[serde(default = "default_n_predict")]
    n_predict: u32,
    /// `-c`: the context size (Gemma 3's default of 32768 needs a KV cache
    /// too large for small memory limits).
    ctx: Option<u32>,
    #[serde(default)]
    command: CommandSpec,
}

fn default_threads() -> Vec<u32> {
    vec![std::thread::available_parallelism().map_or(1, |n| n.get() as u32)]
}

fn one() -> u32 {
    1
}

fn default_n_predict() -> u32 {
    16
}

/// One run of the plan.
#[derive(Clone, Debug)]
pub struct RunSpec {
    pub id: String,
    /// The `model=` partition: the model file's name without `.gguf`.
    pub model: String,
    pub model_path: PathBuf,
    pub cache: CacheMode,
    pub params: Params,
    pub ctx: Option<u32>,
    pub program: PathBuf,
    pub args: Vec<String>,
    pub kind: CommandKind,
    /// `server`: concurrent clients.
    pub clients: u32,
    /// `server`: each client's `/completion` request.
    pub request: serde_json::Value,
}

impl RunSpec {
    /// The command line, with `model` (the plan's path, or a private copy)
    /// after `-m`, and for a server the port it listens on (`None`: a
    /// placeholder, so a run's id does not depend on it).
    pub fn argv(&self, model: &Path, port: Option<u16>) -> Vec<String> {
        let p = &self.params;
        let mut argv = vec![self.program.display().to_string(), "-m".into(), model.display().to_string()];
        match self.kind {
            CommandKind::Completion => {
                argv.extend(["-p".into(), p.prompt.clone(), "-n".into(), p.n_predict.to_string()]);
                argv.extend(["-t".into(), p.threads.to_string(), "-no-cnv".into()]);
            }
            CommandKind::Server => {
                let port = port.map_or_else(|| "PORT".to_string(), |p| p.to_string());
                argv.extend(["--host".into(), "127.0.0.1".into(), "--port".into(), port]);
                argv.extend(["-t".into(), p.threads.to_string(), "-np".into(), self.clients.to_string()]);
            }
        }
        if let Some(ctx) = self.ctx {
            argv.extend(["-c".into(), ctx.to_string()]);
        }
        argv.extend(self.args.iter().cloned());
        argv
    }
}

pub struct Plan {
    pub runs: Vec<RunSpec>,
}

impl Plan {
    pub fn load(path: &Path) -> Result<Plan, PlanError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| PlanError::Read { path: shown.clone(), source })?;
        let base = path.parent().unwrap_or(Path::new("."));
        Plan::parse(&text, base).map_err(|e| match e {
            PlanError::Toml { message, .. } => PlanError::Toml { path: shown.clone(), message },
            PlanError::Invalid { message, .. } => PlanError::Invalid { path: shown.clone(), message },
            other => other,
        })
    }

    /// `base`: where prompt files are found.
    pub fn parse(text: &str, base: &Path) -> Result<Plan, PlanError> {
        let invalid = |message: String| PlanError::Invalid { path: String::new(), message };
        let file: PlanFile =
            toml::from_str(text).map_err(|e| PlanError::Toml { path: String::new(), message: e.to_string() })?;
        if file.models.is_empty() || file.prompts.is_empty() || file.threads.is_empty() {
            return Err(invalid("`models`, `prompts` and `threads` must not be empty".into()));
        }
        if file.repeats == 0 || file.n_predict == 0 || file.threads.contains(&0) {
            return Err(invalid("`repeats`, `n_predict` and `threads` must be at least 1".into()));
        }
        let plan_limits = limits(&file.mem_limits).map_err(invalid)?;
        let mut prompts = Vec::new();
        for p in &file.prompts {
            let text = match (&p.text, &p.file) {
                (Some(t), None) => t.clone(),
                (None, Some(f)) => std::fs::read_to_string(base.join(f))
                    .map_err(|source| PlanError::Read { path: base.join(f).display().to_string(), source })?,
                _ => return Err(invalid(format!("prompt `{}`: give exactly one of `text` and `file`", p.domain))),
            };
            prompts.push((p.domain.clone(), text));
        }
        let kind = file.command.kind;
        let program = file.command.program.clone().unwrap_or_else(|| {
            PathBuf::from(if kind == CommandKind::Server { "llama-server" } else { "llama-completion" })
        });
        if kind == CommandKind::Completion && (file.command.clients.is_some() || file.command.request.is_some()) {
            return Err(invalid("`clients` and `request` are for `kind = \"server\"`".into()));
        }
        let clients = file.command.clients.unwrap_or(1);
        if clients == 0 {
            return Err(invalid("`clients` must be at least 1".into()));
        }
        let mut request = serde_json::Map::new();
        request.insert("n_predict".into(), file.n_predict.into());
        request.insert("cache_prompt".into(), false.into());
        if let Some(extra) = &file.command.request {
            let extra = serde_json::to_value(extra).map_err(|e| invalid(format!("request: {e}")))?;
            request.extend(extra.as_object().cloned().unwrap_or_default());
        }
        let mut runs = Vec::new();
        for spec in &file.models {
            let (model_path, limits) = match spec {
                ModelSpec::Path(p) => (p, plan_limits.clone()),
                ModelSpec::Table { path, mem_limits } => (path, limits(mem_limits).map_err(invalid)?),
            };
            let stem = model_path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default();
            let model = partition_value(stem.strip_suffix(".gguf").unwrap_or(&stem));
            for (domain, prompt) in &prompts {
                for &threads in &file.threads {
                    for &mem_limit_bytes in &limits {
                        for repeat in 0..file.repeats {
                            let params = Params {
                                model_path: model_path.display().to_string(),
                                domain: domain.clone(),
                                prompt: prompt.clone(),
                                threads,
                                mem_limit_bytes,
                                cache: file.cache.name().into(),
                                repeat,
                                n_predict: file.n_predict,
                                command: Vec::new(),
                                clients: None,
                            };
                            let mut run = RunSpec {
                                id: String::new(),
                                model: model.clone(),
                                model_path: model_path.clone(),
                                cache: file.cache,
                                params,
                                ctx: file.ctx,
                                program: program.clone(),
                                args: file.command.args.clone(),
                                kind,
                                clients,
                                request: serde_json::Value::Null,
                            };
                            if kind == CommandKind::Server {
                                run.request = serde_json::Value::Object(request.clone());
                                run.request["prompt"] = prompt.clone().into();
                                run.params.clients = Some(clients);
                            }
                            run.params.command = run.argv(model_path, None);
                            run.id = run_id(&run);
                            runs.push(run);
                        }
                    }
                }
            }
        }
        // The partition value (and a cold run's private copy) is the file name.
        let mut named: std::collections::BTreeMap<&str, &Path> = std::collections::BTreeMap::new();
        for r in &runs {
            if let Some(other) = named.insert(&r.model, &r.model_path)
                && other != r.model_path
            {
                return Err(invalid(format!(
                    "models {} and {} have the same file name: the dataset's `model` needs them apart (rename one)",
                    other.display(),
                    r.model_path.display()
                )));
            }
        }
        let mut ids: Vec<&str> = runs.iter().map(|r| r.id.as_str()).collect();
        ids.sort_unstable();
        if ids.windows(2).any(|w| w[0] == w[1]) {
            return Err(invalid("two runs have the same parameters (a model or prompt listed twice?)".into()));
        }
        Ok(Plan { runs })
    }
}

/// Sizes or `none`; none given: one run without a limit.
fn limits(texts: &[String]) -> Result<Vec<Option<u64>>, String> {
    let mut out = Vec::new();
    for text in texts {
        out.push(match text.as_str() {
            "none" => None,
            _ => Some(crate::units::parse_size(text).map_err(|e| format!("mem_limits: `{text}`: {e}"))?),
        });
    }
    if out.is_empty() {
        out.push(None);
    }
    Ok(out)
}

/// `r` and 12 hex digits of blake3 over the parameters (a leading letter:
/// Spark would read an all-digit partition value as a number).
fn run_id(run: &RunSpec) -> String {
    let key = serde_json::json!({
        "params": &run.params,
        "cache": run.cache.name(),
        "kind": format!("{:?}", run.kind),
        "request": &run.request,
    });
    let hash = blake3::hash(key.to_string().as_bytes());
    format!("r{}", &hash.to_hex()[..12])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_minimal_plan_expands_to_its_matrix() {
        let plan = Plan::parse(
            "models = [\"/m/a.gguf\", \"/m/b.gguf\"]\nthreads = [2]\nmem_limits = [\"160M\", \"none\"]\n\
             repeats = 2\nn_predict = 8\n[[prompts]]\ndomain = \"code\"\ntext = \"fn main\"\n",
            Path::new("."),
        )
        .unwrap();
        assert_eq!(plan.runs.len(), 2 * 2 * 2);
        let r = &plan.runs[0];
        assert_eq!((r.model.as_str(), r.params.mem_limit_bytes, r.params.repeat), ("a", Some(160 << 20), 0));
        assert_eq!(r.params.command[..3], ["llama-completion", "-m", "/m/a.gguf"]);
        assert!(r.id.starts_with('r') && r.id.len() == 13);
        // Same plan, same ids; another n_predict, other ids.
        let again = Plan::parse(
            "models = [\"/m/a.gguf\"]\nthreads = [2]\nmem_limits = [\"160M\"]\nn_predict = 8\n\
             [[prompts]]\ndomain = \"code\"\ntext = \"fn main\"\n",
            Path::new("."),
        )
        .unwrap();
        assert_eq!(again.runs[0].id, r.id);
        // A model with limits of its own.
        let own = Plan::parse(
            "models = [\"/m/a.gguf\", { path = \"/m/b.gguf\", mem_limits = [\"32M\", \"48M\", \"none\"] }]\n\
             mem_limits = [\"160M\"]\n[[prompts]]\ndomain = \"code\"\ntext = \"fn main\"\n",
            Path::new("."),
        )
        .unwrap();
        let limits: Vec<_> = own.runs.iter().map(|r| (r.model.as_str(), r.params.mem_limit_bytes)).collect();
        assert_eq!(limits, [("a", Some(160 << 20)), ("b", Some(32 << 20)), ("b", Some(48 << 20)), ("b", None)]);
    }

    #[test]
    fn a_server_plan_has_clients_and_requests() {
        let plan = Plan::parse(
            "models = [\"/m/a.gguf\"]\nn_predict = 8\n[command]\nkind = \"server\"\nclients = 3\n\
             request = { ignore_eos = true }\n[[prompts]]\ndomain = \"code\"\ntext = \"fn main\"\n",
            Path::new("."),
        )
        .unwrap();
        let r = &plan.runs[0];
        assert_eq!((r.kind, r.clients, r.params.clients), (CommandKind::Server, 3, Some(3)));
        assert_eq!(r.params.command[..7], ["llama-server", "-m", "/m/a.gguf", "--host", "127.0.0.1", "--port", "PORT"]);
        assert_eq!(r.argv(Path::new("/m/a.gguf"), Some(8080))[6], "8080");
        let want = serde_json::json!({"n_predict": 8, "cache_prompt": false, "ignore_eos": true, "prompt": "fn main"});
        assert_eq!(r.request, want);
    }

    #[test]
    fn bad_plans_say_what_is_wrong() {
        let err = |t: &str| Plan::parse(t, Path::new(".")).err().unwrap().to_string();
        assert!(err("models = []\n[[prompts]]\ndomain = \"a\"\ntext = \"b\"").contains("must not be empty"));
        assert!(err("models = [\"m\"]\nmodles = 1").contains("modles"));
        assert!(
            err("models = [\"m\"]\nmem_limits = [\"lots\"]\n[[prompts]]\ndomain = \"a\"\ntext = \"b\"")
                .contains("lots")
        );
        assert!(err("models = [\"m\"]\n[[prompts]]\ndomain = \"a\"").contains("exactly one"));
        assert!(
            err("models = [\"/a/m.gguf\", \"/b/m.gguf\"]\n[[prompts]]\ndomain = \"a\"\ntext = \"b\"")
                .contains("the same file name")
        );
        assert!(
            err("models = [\"m\"]\n[command]\nclients = 2\n[[prompts]]\ndomain = \"a\"\ntext = \"b\"")
                .contains("for `kind = \"server\"`")
        );
        assert!(
            err("models = [\"m\"]\ncache = \"tepid\"\n[[prompts]]\ndomain = \"a\"\ntext = \"b\"").contains("tepid")
        );
    }
}
