//! What a tensor is, from its GGUF name: layer, component and, for MoE
//! expert tensors, how the bytes split into experts.

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Component {
    TokenEmbd,
    AttnNorm,
    AttnQ,
    AttnK,
    AttnV,
    AttnQkv,
    AttnOutput,
    FfnNorm,
    FfnGate,
    FfnUp,
    FfnDown,
    /// The MoE router.
    FfnGateInp,
    FfnGateExps,
    FfnUpExps,
    FfnDownExps,
    FfnGateShexp,
    FfnUpShexp,
    FfnDownShexp,
    OutputNorm,
    Output,
    RopeFreqs,
    Other,
}

impl Component {
    pub const ALL: [Component; 22] = [
        Component::TokenEmbd,
        Component::AttnNorm,
        Component::AttnQ,
        Component::AttnK,
        Component::AttnV,
        Component::AttnQkv,
        Component::AttnOutput,
        Component::FfnNorm,
        Component::FfnGate,
        Component::FfnUp,
        Component::FfnDown,
        Component::FfnGateInp,
        Component::FfnGateExps,
        Component::FfnUpExps,
        Component::FfnDownExps,
        Component::FfnGateShexp,
        Component::FfnUpShexp,
        Component::FfnDownShexp,
        Component::OutputNorm,
        Component::Output,
        Component::RopeFreqs,
        Component::Other,
    ];

    /// The GGUF base name (`blk.N.` and `.weight`/`.bias` stripped).
    pub fn as_str(self) -> &'static str {
        match self {
            Component::TokenEmbd => "token_embd",
            Component::AttnNorm => "attn_norm",
            Component::AttnQ => "attn_q",
            Component::AttnK => "attn_k",
            Component::AttnV => "attn_v",
            Component::AttnQkv => "attn_qkv",
            Component::AttnOutput => "attn_output",
            Component::FfnNorm => "ffn_norm",
            Component::FfnGate => "ffn_gate",
            Component::FfnUp => "ffn_up",
            Component::FfnDown => "ffn_down",
            Component::FfnGateInp => "ffn_gate_inp",
            Component::FfnGateExps => "ffn_gate_exps",
            Component::FfnUpExps => "ffn_up_exps",
            Component::FfnDownExps => "ffn_down_exps",
            Component::FfnGateShexp => "ffn_gate_shexp",
            Component::FfnUpShexp => "ffn_up_shexp",
            Component::FfnDownShexp => "ffn_down_shexp",
            Component::OutputNorm => "output_norm",
            Component::Output => "output",
            Component::RopeFreqs => "rope_freqs",
            Component::Other => "other",
        }
    }

    /// Expert tensors hold one slice per expert along their last dimension.
    pub fn is_experts(self) -> bool {
        matches!(self, Component::FfnGateExps | Component::FfnUpExps | Component::FfnDownExps)
    }
}

impl std::fmt::Display for Component {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Classification {
    pub layer: Option<u32>,
    pub component: Component,
}

/// Classifies a tensor name such as `blk.3.ffn_up_exps.weight` (whisper.cpp's
/// `encoder.blocks.3.mlp.0.weight` has a layer and no llama.cpp component).
pub fn classify(name: &str) -> Classification {
    let (layer, rest) = match split_layer(name) {
        Some((layer, rest)) => (Some(layer), rest),
        None => (None, name),
    };
    let base = rest.strip_suffix(".weight").or_else(|| rest.strip_suffix(".bias")).unwrap_or(rest);
    let component =
        Component::ALL.into_iter().find(|c| *c != Component::Other && c.as_str() == base).unwrap_or(Component::Other);
    Classification { layer, component }
}

fn split_layer(name: &str) -> Option<(u32, &str)> {
    let rest = ["blk.", "encoder.blocks.", "decoder.blocks."].iter().find_map(|p| name.strip_prefix(p))?;
    let (num, rest) = rest.split_once('.')?;
    if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((num.parse().ok()?, rest))
}

/// Bytes per expert for an expert tensor of `shape` (ggml order) and
/// `size_bytes`: ggml lays experts out along the last (outermost) dimension.
pub fn expert_layout(component: Component, shape: &[u64], size_bytes: u64) -> Option<(u32, u64)> {
    if !component.is_experts() || shape.len() < 3 {
        return None;
    }
    let n = *shape.last()?;
    if n == 0 || !size_bytes.is_multiple_of(n) {
        return None;
    }
    Some((u32::try_from(n).ok()?, size_bytes / n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        let c = classify("blk.12.ffn_down_exps.weight");
        assert_eq!((c.layer, c.component), (Some(12), Component::FfnDownExps));
        assert_eq!(classify("token_embd.weight"), Classification { layer: None, component: Component::TokenEmbd });
        assert_eq!(classify("output.weight").component, Component::Output);
        assert_eq!(classify("output_norm.weight").component, Component::OutputNorm);
        assert_eq!(classify("blk.0.attn_q.bias").component, Component::AttnQ);
        assert_eq!(classify("blk.0.ffn_gate_inp.weight").component, Component::FfnGateInp);
        assert_eq!(classify("blk.0.ffn_up_shexp.weight").component, Component::FfnUpShexp);
        assert_eq!(classify("rope_freqs.weight").component, Component::RopeFreqs);
        assert_eq!(classify("blk.x.attn_q.weight"), Classification { layer: None, component: Component::Other });
        let whisper = classify("decoder.blocks.3.cross_attn.query.weight");
        assert_eq!(whisper, Classification { layer: Some(3), component: Component::Other });
        assert_eq!(classify("encoder.conv1.weight").layer, None);
        assert_eq!(classify("blk.99999999999.attn_q.weight").layer, None);
        assert_eq!(classify("blk.1.attn_q_norm.weight").component, Component::Other);
        assert_eq!(classify("").component, Component::Other);
    }

    #[test]
    fn experts() {
        assert_eq!(expert_layout(Component::FfnUpExps, &[64, 128, 4], 4 * 64 * 128 * 2), Some((4, 64 * 128 * 2)));
        assert_eq!(expert_layout(Component::FfnUp, &[64, 128, 4], 100), None);
        assert_eq!(expert_layout(Component::FfnUpExps, &[64, 128, 0], 0), None);
    }
}
