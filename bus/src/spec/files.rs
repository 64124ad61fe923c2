//! Job files: finding the YAML files of an apply, parsing them with line numbers and checking
//! every rule that needs no registry, all problems at once (`file:line: field: reason`).

use std::path::PathBuf;

use super::yaml::{self, LocatedError, LocatedJob};
use super::{check_documents, JobDocument};

/// The YAML files named by `paths` (directories give their `*.yaml` / `*.yml`, sorted).
fn job_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, Vec<LocatedError>> {
    let mut files = Vec::new();
    let mut errors = Vec::new();
    for path in paths {
        let error = |reason: String| LocatedError {
            file: path.display().to_string(),
            line: None,
            field: None,
            reason,
        };
        if path.is_dir() {
            match std::fs::read_dir(path) {
                Ok(entries) => {
                    let mut found: Vec<PathBuf> = entries
                        .filter_map(|e| e.ok().map(|e| e.path()))
                        .filter(|p| {
                            p.is_file()
                                && matches!(
                                    p.extension().and_then(|e| e.to_str()),
                                    Some("yaml" | "yml")
                                )
                        })
                        .collect();
                    found.sort();
                    if found.is_empty() {
                        errors.push(error("no .yaml or .yml file in this directory".into()));
                    }
                    files.extend(found);
                }
                Err(e) => errors.push(error(format!("cannot read directory: {e}"))),
            }
        } else {
            files.push(path.clone());
        }
    }
    if errors.is_empty() {
        Ok(files)
    } else {
        Err(errors)
    }
}

/// Reads and validates every job in `paths`: all problems, each `file:line: field: reason`.
pub fn load_files(paths: &[PathBuf]) -> Result<Vec<LocatedJob>, Vec<LocatedError>> {
    let files = job_files(paths)?;
    let mut jobs = Vec::new();
    let mut errors = Vec::new();
    for file in &files {
        let name = file.display().to_string();
        match std::fs::read_to_string(file) {
            Ok(text) => match yaml::parse_str(&name, &text) {
                Ok(found) if found.is_empty() => errors.push(LocatedError {
                    file: name,
                    line: None,
                    field: None,
                    reason: "no job document in this file".into(),
                }),
                Ok(found) => jobs.extend(found),
                Err(e) => errors.push(e),
            },
            Err(e) => errors.push(LocatedError {
                file: name,
                line: None,
                field: None,
                reason: format!("cannot read: {e}"),
            }),
        }
    }
    checked(jobs, errors)
}

/// Reads and validates the jobs of one text (an editor's) named `name` in the problems, as
/// [`load_files`] does a file's.
pub fn load_text(name: &str, text: &str) -> Result<Vec<LocatedJob>, Vec<LocatedError>> {
    match yaml::parse_str(name, text) {
        Ok(found) if found.is_empty() => Err(vec![LocatedError {
            file: name.to_string(),
            line: None,
            field: None,
            reason: "no job document".into(),
        }]),
        Ok(found) => checked(found, Vec::new()),
        Err(e) => Err(vec![e]),
    }
}

/// The jobs, once every document passed the checks of apply (and `errors` is empty).
fn checked(
    jobs: Vec<LocatedJob>,
    mut errors: Vec<LocatedError>,
) -> Result<Vec<LocatedJob>, Vec<LocatedError>> {
    let docs: Vec<&JobDocument> = jobs.iter().map(|j| &j.doc).collect();
    let first_at = |i: usize| format!("first at {}:{}", jobs[i].file, jobs[i].line_of("job.name"));
    for (i, e) in check_documents(&docs, first_at) {
        errors.push(jobs[i].locate(e));
    }
    if errors.is_empty() {
        Ok(jobs)
    } else {
        Err(errors)
    }
}
