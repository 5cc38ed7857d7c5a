//! Unit tests of `elf.rs`.

use super::*;

#[test]
fn ident_parses_self() {
    let ident = ElfIdent::read(Path::new("/proc/self/exe")).unwrap().unwrap();
    assert!(ident.class64 && ident.little_endian);
    assert_eq!(ident.machine, elf::EM_X86_64);
}

#[test]
fn ident_rejects_non_elf() {
    assert_eq!(ElfIdent::parse(b"#!/bin/sh\n"), None);
    assert_eq!(ElfIdent::parse(b"\x7fELF"), None);
}

#[test]
fn op_name_shape() {
    assert!(is_op_name(b"MUL_MAT") && is_op_name(b"CONV_TRANSPOSE_1D"));
    assert!(!is_op_name(b"x+y") && !is_op_name(b"") && !is_op_name(b"none") && !is_op_name(b"1D"));
}

#[test]
fn unknown_ids_are_named() {
    let names = OpNames { ops: vec!["NONE".into()], unary: vec![], glu: vec![] };
    assert_eq!(names.op(0), "NONE");
    assert_eq!(names.op(7), "op#7");
    assert_eq!(names.op(-1), "op#-1");
    assert_eq!(names.unary(2), "unary#2");
}
