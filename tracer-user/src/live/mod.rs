//! The live path: load the eBPF programs ([`load`]), attach them to a target
//! ([`target`], [`session`]), collect ring records ([`collect`]) and record
//! them into a trace file, resolving while recording ([`recorder`]), once
//! the struct layouts chosen for the target ([`layouts`]) check out on it
//! ([`check`]). Needs
//! root and the embedded eBPF object (feature `live`).

pub mod btf_index;
pub mod check;
pub mod collect;
pub mod copies;
pub mod features;
pub mod graphs;
pub mod kernel_btf;
pub mod layouts;
pub mod load;
pub mod op_times;
pub mod privileges;
pub mod recorder;
pub mod resolver;
pub mod selftest;
pub mod session;
pub mod target;
pub mod top;
pub mod tracefs;
pub mod values;
pub mod values_fingerprint;
pub mod verifier;
