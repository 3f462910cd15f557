//! IREE VM bytecode modules (`.vmfb`, bytecode version 17.0).

pub mod archive;
