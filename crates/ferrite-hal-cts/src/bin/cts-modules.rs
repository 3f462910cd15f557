//! `cts-modules <folder>`: compiles the CTS programs for every target into
//! `<folder>` (with their workgroup counts), for a machine without the
//! compiler (`FERRITE_CTS_MODULES=<folder>` there).

fn main() {
    let Some(dir) = std::env::args().nth(1) else {
        eprintln!("usage: cts-modules <folder>");
        std::process::exit(2);
    };
    for target in [ferrite_hal_cts::Target::Cpu, ferrite_hal_cts::Target::Cuda] {
        for name in ferrite_hal_cts::MODULES {
            let p = ferrite_hal_cts::compile_into(name, target, std::path::Path::new(&dir));
            println!("{}", p.display());
        }
    }
}
