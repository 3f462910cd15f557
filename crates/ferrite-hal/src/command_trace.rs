//! Command buffers in the execution trace: while a trace is recorded, the
//! first execution of a command buffer records what it holds, so profile
//! bundles can describe it the way upstream's command-buffer and
//! command-operation records do (`iree-profile command`), and dispatch
//! spans can name the command they ran.
//!
//! One `command_buffer` instant (its id, mode, categories, queue affinity
//! and command count) and one `command` instant per recorded command (its
//! index, kind, flags, and what kind it is: executable, function and
//! workgroups of a dispatch; offsets, length and binding-table slots of a
//! transfer), on the executing device's track. Executables are named by
//! the address of the loaded executable, as the CPU devices name them in
//! their dispatch spans.

use crate::command_buffer::{BufferRef, Command, CommandBuffer};
use crate::executable::Executable;
use ferrite_base::trace::{self, Arg};

/// Command flags (upstream's command-operation flag bits).
const FLAG_EXECUTION_BARRIER: u64 = 1;
const FLAG_INDIRECT_PARAMETERS: u64 = 1 << 1;
const FLAG_DYNAMIC_BINDINGS: u64 = 1 << 2;
const FLAG_STATIC_BINDINGS: u64 = 1 << 3;

/// While recording: describes `cb` (executed on the device called
/// `device`) the first time it is executed in the recording, and returns
/// its id (only the id when it is not finalized: the execution fails on
/// its own). Not recording: 0, at the cost of one relaxed load.
#[inline]
pub fn describe(cb: &CommandBuffer, device: &str) -> u64 {
    if !trace::enabled() {
        return 0;
    }
    let id = cb.id();
    if !cb.first_use_in(trace::session()) {
        return id;
    }
    let Ok(commands) = cb.finalized_commands() else {
        return id;
    };
    let track = trace::device_track(device);
    trace::instant(
        "command_buffer",
        format!("command buffer {id}"),
        track,
        vec![
            ("command_buffer", Arg::U64(id)),
            ("mode", Arg::U64(cb.mode() as u64)),
            ("categories", Arg::U64(cb.categories() as u64)),
            ("queue_affinity", Arg::U64(cb.queue_affinity())),
            ("commands", Arg::U64(commands.len() as u64)),
        ],
    );
    for (index, c) in commands.iter().enumerate() {
        let (name, args) = command_args(c);
        let mut all = vec![
            ("command_buffer", Arg::U64(id)),
            ("index", Arg::U64(index as u64)),
        ];
        all.extend(args);
        trace::instant("command", name, track, all);
    }
    id
}

/// A range's offset, length, and binding-table slot (`u32::MAX` for a
/// buffer fixed at recording); the flag bit for its kind of binding.
fn range(r: &BufferRef) -> (u64, u64, u64, u64) {
    match r {
        BufferRef::Direct { offset, length, .. } => {
            (*offset, *length, u32::MAX as u64, FLAG_STATIC_BINDINGS)
        }
        BufferRef::Slot {
            slot,
            offset,
            length,
        } => (*offset, *length, *slot as u64, FLAG_DYNAMIC_BINDINGS),
    }
}

/// The name and arguments of one command's `command` instant.
fn command_args(c: &Command) -> (String, Vec<(&'static str, Arg)>) {
    let mut args: Vec<(&'static str, Arg)> = Vec::new();
    let target = |args: &mut Vec<(&'static str, Arg)>, r: &BufferRef| {
        let (offset, length, slot, flag) = range(r);
        args.push(("target_offset", Arg::U64(offset)));
        args.push(("length", Arg::U64(length)));
        args.push(("target_slot", Arg::U64(slot)));
        flag
    };
    let (name, op, flags) = match c {
        Command::Barrier => ("barrier".to_string(), "barrier", FLAG_EXECUTION_BARRIER),
        Command::Fill { target: t, .. } => {
            let flag = target(&mut args, t);
            ("fill".to_string(), "fill", flag)
        }
        Command::Update { target: t, data } => {
            let flag = target(&mut args, t);
            // The length is what was captured, whatever the range says.
            args.retain(|(k, _)| *k != "length");
            args.push(("length", Arg::U64(data.len() as u64)));
            ("update".to_string(), "update", flag)
        }
        Command::Copy { source, target: t } => {
            let (offset, _, slot, source_flag) = range(source);
            let flag = target(&mut args, t);
            args.push(("source_offset", Arg::U64(offset)));
            args.push(("source_slot", Arg::U64(slot)));
            ("copy".to_string(), "copy", flag | source_flag)
        }
        Command::Dispatch {
            executable,
            function,
            workgroups,
            indirect,
            bindings,
            ..
        } => {
            let exports = executable.0.exports();
            let export = exports.get(*function as usize);
            // What the devices name the executable by in their dispatch
            // spans ([`executable_args`]).
            args.push(("executable", Arg::U64(executable_id(&*executable.0))));
            args.push(("function", Arg::U64(*function as u64)));
            args.push(("functions", Arg::U64(exports.len() as u64)));
            args.push((
                "workgroups",
                Arg::List(if indirect.is_some() {
                    vec![0, 0, 0]
                } else {
                    workgroups.iter().map(|&w| w as u64).collect()
                }),
            ));
            if let Some(e) = export {
                args.push((
                    "workgroup_size",
                    Arg::List(e.workgroup_size.iter().map(|&w| w as u64).collect()),
                ));
                args.push(("constants", Arg::U64(e.constant_count as u64)));
            }
            args.push(("bindings", Arg::U64(bindings.len() as u64)));
            let mut flags = bindings.iter().fold(0, |f, b| f | range(b).3);
            if indirect.is_some() {
                flags |= FLAG_INDIRECT_PARAMETERS;
            }
            let name = export.map_or_else(|| format!("export {function}"), |e| e.name.clone());
            (name, "dispatch", flags)
        }
        Command::Collective { op, send, recv, .. } => (
            format!("collective {}", op.kind.name()),
            "collective",
            send.iter()
                .chain(recv.iter())
                .fold(0, |f, b| f | range(b).3),
        ),
    };
    args.insert(0, ("op", Arg::Str(op.to_string())));
    args.insert(1, ("flags", Arg::U64(flags)));
    (name, args)
}

/// The loaded executable's address: unique while it lives, what dispatch
/// spans and command descriptions name an executable by.
pub fn executable_id(executable: &dyn Executable) -> u64 {
    executable as *const dyn Executable as *const () as usize as u64
}

/// What a profile bundle needs to know of a dispatch's executable, as every
/// device puts it in its dispatch spans: the executable
/// ([`executable_id`]), the function's ordinal, the export count, and the
/// export's workgroup size and constant and binding counts (those three
/// left out for an ordinal the executable does not export).
pub fn executable_args(executable: &dyn Executable, function: u32) -> Vec<(&'static str, Arg)> {
    let exports = executable.exports();
    let mut args = vec![
        ("executable", Arg::U64(executable_id(executable))),
        ("function", Arg::U64(function as u64)),
        ("functions", Arg::U64(exports.len() as u64)),
    ];
    if let Some(e) = exports.get(function as usize) {
        args.push((
            "workgroup_size",
            Arg::List(e.workgroup_size.iter().map(|&w| w as u64).collect()),
        ));
        args.push(("constants", Arg::U64(e.constant_count as u64)));
        args.push(("bindings", Arg::U64(e.binding_count as u64)));
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::executable::ExportInfo;
    use std::sync::Arc;

    struct Exports(Vec<ExportInfo>);
    impl Executable for Exports {
        fn exports(&self) -> &[ExportInfo] {
            &self.0
        }
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
    }

    #[test]
    fn executable_args_name_the_executable_and_its_export() {
        let exe: Arc<dyn Executable> = Arc::new(Exports(vec![ExportInfo {
            name: "k".to_string(),
            workgroup_size: [64, 2, 1],
            constant_count: 3,
            binding_count: 2,
        }]));
        let id = Arc::as_ptr(&exe) as *const () as usize as u64;
        assert_eq!(executable_id(&*exe), id);
        assert_eq!(
            executable_args(&*exe, 0),
            vec![
                ("executable", Arg::U64(id)),
                ("function", Arg::U64(0)),
                ("functions", Arg::U64(1)),
                ("workgroup_size", Arg::List(vec![64, 2, 1])),
                ("constants", Arg::U64(3)),
                ("bindings", Arg::U64(2)),
            ]
        );
        // An ordinal past the exports: only what is known.
        assert_eq!(executable_args(&*exe, 5).len(), 3);
    }

    #[test]
    fn described_once_per_recording_with_each_command() {
        // The only test of this crate's library that records a trace.
        let cb = CommandBuffer::new(0, 3, u64::MAX, 2);
        cb.fill_buffer(
            BufferRef::Slot {
                slot: 1,
                offset: 16,
                length: 64,
            },
            7,
            4,
        )
        .unwrap();
        cb.execution_barrier().unwrap();
        cb.finalize().unwrap();
        assert_eq!(describe(&cb, "test"), 0, "nothing while not recording");
        let other = CommandBuffer::new(0, 3, u64::MAX, 0);
        assert!(other.id() != 0 && other.id() == other.id());
        assert_ne!(cb.id(), other.id());

        let count = |t: &trace::Trace, cat: &str| t.events.iter().filter(|e| e.cat == cat).count();
        for _ in 0..2 {
            trace::start().unwrap();
            assert_eq!(describe(&cb, "test"), cb.id());
            assert_eq!(describe(&cb, "test"), cb.id());
            let t = trace::stop().unwrap();
            // Each recording describes it once, with both commands.
            assert_eq!(count(&t, "command_buffer"), 1);
            assert_eq!(count(&t, "command"), 2);
            let fill = t.events.iter().find(|e| e.name == "fill").unwrap();
            let arg = |k: &str| {
                fill.args
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.clone())
            };
            assert_eq!(arg("index"), Some(Arg::U64(0)));
            assert_eq!(arg("target_slot"), Some(Arg::U64(1)));
            assert_eq!(arg("target_offset"), Some(Arg::U64(16)));
            assert_eq!(arg("length"), Some(Arg::U64(64)));
            assert_eq!(arg("flags"), Some(Arg::U64(FLAG_DYNAMIC_BINDINGS)));
        }
    }
}
