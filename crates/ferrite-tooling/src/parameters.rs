//! `--parameters=[scope=]path` and `--parameter_mode`: parameter files the
//! `io_parameters` module serves to programs (upstream's flags).

use ferrite_base::{bail, Result};
use ferrite_modules::io_parameters::{
    self, create_io_parameters_module, formats, FileHandle, ParameterIndex, ParameterProvider,
};
use ferrite_vm::Module;
use std::sync::Arc;

/// Parameter flags shared by the commands that run programs.
#[derive(clap::Args, Debug, Clone)]
pub struct ParameterArgs {
    /// A parameter file (`.irpa`, `.gguf`, `.safetensors`) for programs,
    /// in the anonymous scope (`file.irpa`) or a named one
    /// (`model=file.irpa`); repeat for several.
    #[arg(long = "parameters")]
    pub parameters: Vec<String>,
    /// `file` maps parameter files and reads them as needed; `preload`
    /// reads whole files into memory at startup.
    #[arg(long = "parameter_mode", default_value = "file")]
    pub parameter_mode: String,
}

impl ParameterArgs {
    /// The `io_parameters` module over the flags' files (one provider per
    /// scope), or nothing when no `--parameters` was given.
    pub fn modules(&self) -> Result<Vec<Arc<dyn Module>>> {
        let preload = match self.parameter_mode.as_str() {
            "file" => false,
            "preload" => true,
            other => bail!(
                InvalidArgument,
                "unrecognized --parameter_mode= value '{other}'; expected 'file' or 'preload'"
            ),
        };
        if self.parameters.is_empty() {
            return Ok(Vec::new());
        }
        let mut scopes: Vec<(String, ParameterIndex)> = Vec::new();
        for flag in &self.parameters {
            let (scope, path) = io_parameters::parse_flag(flag);
            let i = match scopes.iter().position(|(s, _)| s == scope) {
                Some(i) => i,
                None => {
                    scopes.push((scope.to_string(), ParameterIndex::new()));
                    scopes.len() - 1
                }
            };
            let handle = if preload {
                FileHandle::preload(path)
            } else {
                FileHandle::open(path)
            };
            handle
                .and_then(|h| formats::parse_into(&mut scopes[i].1, &h, None))
                .map_err(|e| e.annotate(format!("--parameters={flag}")))?;
        }
        let providers = scopes
            .into_iter()
            .map(|(s, i)| ParameterProvider::new(&s, i))
            .collect();
        Ok(vec![
            create_io_parameters_module(providers)? as Arc<dyn Module>
        ])
    }
}
