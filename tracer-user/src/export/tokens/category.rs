//! The thesis web UI's words for what a tensor is: a category (colours the
//! graph and groups the heatmap), a role and a human-readable type. Weights
//! get them from their [`Component`]; the graph's intermediate tensors from
//! the names llama.cpp gives them (`Qcur-3`, `ffn_out-3`, `result_norm`).

use serde::{Serialize, Serializer};

use crate::model::{Component, classify::classify};

/// One vocabulary for both files: the memory map calls the token embedding
/// `embedding`, the graph calls the embedding lookup's side `input`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Category {
    Input,
    Embedding,
    Attention,
    Ffn,
    Norm,
    Output,
    Other,
}

impl Serialize for Category {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl Category {
    pub fn as_str(self) -> &'static str {
        match self {
            Category::Input => "input",
            Category::Embedding => "embedding",
            Category::Attention => "attention",
            Category::Ffn => "ffn",
            Category::Norm => "norm",
            Category::Output => "output",
            Category::Other => "other",
        }
    }

    /// A weight's category in the memory map: by its component, by its name
    /// for the ones ttrace has no component for (`blk.0.attn_q_norm`).
    pub fn of_weight(name: &str) -> Category {
        match classify(name).component {
            Component::Other => Category::of_node_name(name),
            c => Category::of_component(c),
        }
    }

    fn of_component(c: Component) -> Category {
        use Component::*;
        match c {
            TokenEmbd => Category::Embedding,
            AttnNorm | FfnNorm | OutputNorm => Category::Norm,
            AttnQ | AttnK | AttnV | AttnQkv | AttnOutput => Category::Attention,
            FfnGate | FfnUp | FfnDown | FfnGateInp | FfnGateExps | FfnUpExps | FfnDownExps | FfnGateShexp
            | FfnUpShexp | FfnDownShexp => Category::Ffn,
            Output => Category::Output,
            RopeFreqs | Other => Category::Other,
        }
    }

    /// A weight's category as a graph node: the graph has no `embedding`.
    pub fn of_weight_node(name: &str) -> Category {
        match Category::of_weight(name) {
            Category::Embedding => Category::Input,
            other => other,
        }
    }

    /// An intermediate tensor's category, from its llama.cpp name.
    pub fn of_node_name(name: &str) -> Category {
        let n = name.to_ascii_lowercase();
        let any = |keys: &[&str]| keys.iter().any(|k| n.contains(k));
        // Norms first: `attn_norm-3` is a norm, not attention.
        if n.contains("norm") {
            Category::Norm
        } else if n.starts_with("inp_") || n.contains("embd") {
            // `inp_tokens`, and the lookup's output (`inp_embd`, `embd`).
            Category::Input
        } else if n.starts_with("result_output") || n == "output" {
            Category::Output
        } else if any(&["ffn", "moe", "swiglu", "geglu"]) {
            Category::Ffn
        } else if any(&["qcur", "kcur", "vcur", "kq", "attn", "fattn", "cache_k", "cache_v"]) {
            Category::Attention
        } else {
            Category::Other
        }
    }
}

/// The UI's `component`: what a weight does within its block.
pub fn role(c: Component) -> &'static str {
    use Component::*;
    match c {
        TokenEmbd => "embedding",
        AttnNorm | FfnNorm | OutputNorm => "norm",
        AttnQ => "query",
        AttnK => "key",
        AttnV => "value",
        AttnQkv => "qkv",
        AttnOutput | Output => "output",
        FfnGate | FfnGateExps | FfnGateShexp => "gate",
        FfnUp | FfnUpExps | FfnUpShexp => "up",
        FfnDown | FfnDownExps | FfnDownShexp => "down",
        FfnGateInp => "router",
        RopeFreqs => "rope",
        Other => "other",
    }
}

/// The UI's `component_type`, e.g. `Attention Q`; one expert's slice of an
/// expert tensor is `FFN Down Expert 3`, as the thesis tables named them.
pub fn component_type(c: Component, expert: Option<u32>) -> String {
    use Component::*;
    let base = match c {
        TokenEmbd => "Token Embeddings",
        AttnNorm => "Attention Norm",
        AttnQ => "Attention Q",
        AttnK => "Attention K",
        AttnV => "Attention V",
        AttnQkv => "Attention QKV",
        AttnOutput => "Attention Output",
        FfnNorm => "FFN Norm",
        FfnGate | FfnGateExps => "FFN Gate",
        FfnUp | FfnUpExps => "FFN Up",
        FfnDown | FfnDownExps => "FFN Down",
        FfnGateInp => "FFN Router",
        FfnGateShexp => "FFN Gate Shared Expert",
        FfnUpShexp => "FFN Up Shared Expert",
        FfnDownShexp => "FFN Down Shared Expert",
        OutputNorm => "Output Norm",
        Output => "Output Projection",
        RopeFreqs => "RoPE Frequencies",
        Other => "Other",
    };
    match expert {
        Some(e) => format!("{base} Expert {e}"),
        None if c.is_experts() => format!("{base} Experts"),
        None => base.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_and_intermediates() {
        assert_eq!(Category::of_weight("token_embd.weight"), Category::Embedding);
        assert_eq!(Category::of_weight_node("token_embd.weight"), Category::Input);
        assert_eq!(Category::of_weight("blk.3.ffn_down_exps.weight"), Category::Ffn);
        assert_eq!(Category::of_weight("output_norm.weight"), Category::Norm);
        assert_eq!(Category::of_weight("blk.0.attn_q_norm.weight"), Category::Norm);
        assert_eq!(Category::of_weight("rope_freqs.weight"), Category::Other);
        for (name, want) in [
            ("inp_embd", Category::Input),
            ("embd", Category::Input),
            ("attn_norm-0", Category::Norm),
            ("Qcur-3", Category::Attention),
            ("__fattn__-3", Category::Attention),
            ("ffn_moe_topk-1", Category::Ffn),
            ("result_output", Category::Output),
            ("l_out-2", Category::Other),
            ("", Category::Other),
        ] {
            assert_eq!(Category::of_node_name(name), want, "{name}");
        }
        assert_eq!(serde_json::to_value(Category::Ffn).unwrap(), "ffn");
    }

    #[test]
    fn names_of_experts() {
        assert_eq!(component_type(Component::FfnDownExps, Some(3)), "FFN Down Expert 3");
        assert_eq!(component_type(Component::FfnDownExps, None), "FFN Down Experts");
        assert_eq!(component_type(Component::AttnQ, None), "Attention Q");
        assert_eq!(role(Component::FfnUpExps), "up");
    }
}
