//! `llama_ubatch` read from libllama's code. The struct has no accessor,
//! but each graph input's `set_input(const llama_ubatch *)` reads its
//! fields at once: `llm_graph_input_embd` tests `token` and reads
//! `n_tokens`, `llm_graph_input_pos` tests `pos`, `llm_graph_input_out_ids`
//! reads `output`. `seq_id` has no reader as plain; it follows from its
//! neighbours (`pos, n_seq_id, seq_id, seq_id_unq, seq_idx, output`, as
//! llama.cpp has declared them since Jul 2025), and only if `output` lands
//! where they put it. The live check (`check::ubatch`) still compares the
//! arrays read with every graph's token ids.

use iced_x86::Register;
use tracer_common::layout::UbatchLayout;

use super::derive::{Code, Gap};
use crate::live::target::code::{Use, accesses_of};

pub const EMBD_SET_INPUT: &str = "_ZN20llm_graph_input_embd9set_inputEPK12llama_ubatch";
pub const POS_SET_INPUT: &str = "_ZN19llm_graph_input_pos9set_inputEPK12llama_ubatch";
pub const OUT_IDS_SET_INPUT: &str = "_ZN23llm_graph_input_out_ids9set_inputEPK12llama_ubatch";
/// Functions whose code gives `llama_ubatch`'s offsets.
pub const UBATCH_FROM: [&str; 3] = [EMBD_SET_INPUT, POS_SET_INPUT, OUT_IDS_SET_INPUT];

/// `pos` to `output`: five pointers (`pos`, `n_seq_id`, `seq_id`,
/// `seq_id_unq`, `seq_idx`); `seq_id` is the third.
const POS_TO_OUTPUT: u32 = 40;
const POS_TO_SEQ_ID: u32 = 16;

pub fn from_code(code: &Code<'_>) -> Result<UbatchLayout, Gap> {
    // `this` is in RDI; the ubatch is the next argument.
    let uses = |field: &'static str, function: &str| {
        code.get(function)
            .map(|c| accesses_of(c, Register::RSI))
            .ok_or_else(|| gap(field, format!("the build has no {}", demangled(function))))
    };
    let first = |field: &'static str, function: &str, width: u32| {
        uses(field, function)?
            .iter()
            .find(|a| a.how == Use::Read && a.width == width)
            .map(|a| a.offset)
            .ok_or_else(|| gap(field, format!("{} reads no {width}-byte field of it", demangled(function))))
    };
    let n_tokens = first("llama_ubatch.n_tokens", EMBD_SET_INPUT, 4)?;
    let token = first("llama_ubatch.token", EMBD_SET_INPUT, 8)?;
    let pos = first("llama_ubatch.pos", POS_SET_INPUT, 8)?;
    let output = first("llama_ubatch.output", OUT_IDS_SET_INPUT, 8)?;
    if !(n_tokens < token && token < pos) {
        return Err(gap(
            "llama_ubatch.pos",
            format!("n_tokens at {n_tokens}, token at {token} and pos at {pos} are not in llama.cpp's order"),
        ));
    }
    if output != pos + POS_TO_OUTPUT {
        return Err(gap(
            "llama_ubatch.seq_id",
            format!(
                "pos at {pos} and output at {output} leave room for something else than n_seq_id, seq_id, \
                 seq_id_unq and seq_idx"
            ),
        ));
    }
    let layout = UbatchLayout { size: output + 8, n_tokens, token, pos, seq_id: pos + POS_TO_SEQ_ID, output };
    layout.check().map_err(|e| gap("llama_ubatch.(size)", e.to_string()))?;
    Ok(layout)
}

fn gap(field: &'static str, why: String) -> Gap {
    Gap { field, why }
}

/// `llm_graph_input_pos::set_input` for a message.
fn demangled(function: &str) -> &'static str {
    match function {
        EMBD_SET_INPUT => "llm_graph_input_embd::set_input",
        POS_SET_INPUT => "llm_graph_input_pos::set_input",
        _ => "llm_graph_input_out_ids::set_input",
    }
}

#[cfg(test)]
mod tests {
    use tracer_common::layout::known::UBATCH_2025;

    use super::*;

    /// The three methods' heads as xllamacpp's ggml 0.26 build compiles
    /// them (Debian's adds an `endbr64`), with the offsets `token`, `pos`
    /// and `output` given.
    fn methods(token: u8, pos: u8, output: u8, endbr: bool) -> Code<'static> {
        // cmpq $0,TOKEN(%rsi); mov 0x4(%rsi),%ebx; ret
        let embd = vec![0x48, 0x83, 0x7e, token, 0x00, 0x8b, 0x5e, 0x04, 0xc3];
        // cmpq $0,POS(%rsi); ret
        let pos = vec![0x48, 0x83, 0x7e, pos, 0x00, 0xc3];
        // mov 0x10(%rdi),%rax; mov 0x4(%rsi),%ebx; mov %rsi,%r12; call; mov OUTPUT(%r12),%rcx; ret
        let out_ids = vec![
            0x48, 0x8b, 0x47, 0x10, 0x8b, 0x5e, 0x04, 0x49, 0x89, 0xf4, 0xe8, 0, 0, 0, 0, 0x49, 0x8b, 0x4c, 0x24,
            output, 0xc3,
        ];
        let cet = |c: Vec<u8>| if endbr { [tracer_common::ENDBR64.to_vec(), c].concat() } else { c };
        [(EMBD_SET_INPUT, embd), (POS_SET_INPUT, pos), (OUT_IDS_SET_INPUT, out_ids)]
            .into_iter()
            .map(|(name, c)| (name, cet(c)))
            .collect()
    }

    #[test]
    fn the_graph_inputs_give_the_table_and_ggml_0_26s_offsets() {
        let table = UBATCH_2025.layout;
        assert_eq!(from_code(&methods(0x18, 0x28, 0x50, true)), Ok(table));
        // ggml 0.26 (xllamacpp): a pointer more after embd, a byte array after output.
        let newer = from_code(&methods(0x18, 0x30, 0x58, false)).unwrap();
        assert_eq!(
            (newer.n_tokens, newer.token, newer.pos, newer.seq_id, newer.output, newer.size),
            (4, 0x18, 0x30, 0x40, 0x58, 0x60)
        );
    }

    #[test]
    fn a_field_out_of_place_or_a_missing_method_is_a_gap() {
        let gap = from_code(&methods(0x18, 0x28, 0x58, false)).unwrap_err();
        assert_eq!(gap.field, "llama_ubatch.seq_id");
        assert_eq!(from_code(&methods(0x30, 0x28, 0x50, false)).unwrap_err().field, "llama_ubatch.pos");
        let mut code = methods(0x18, 0x28, 0x50, false);
        code.remove(OUT_IDS_SET_INPUT);
        let gap = from_code(&code).unwrap_err();
        assert!(gap.why.contains("no llm_graph_input_out_ids::set_input"), "{gap}");
    }
}
