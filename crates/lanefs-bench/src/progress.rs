//! A progress bar on a terminal; plain stderr lines otherwise (CI logs, pipes).

use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;

/// One line on stderr. Unlike `eprintln!`, a closed terminal (SIGHUP) is not a panic: the
/// cleanup that follows an interrupt must still run to its end.
pub fn say(line: &str) {
    use std::io::Write;
    let mut e = std::io::stderr().lock();
    let _ = writeln!(e, "{line}");
}

pub struct Progress(Option<ProgressBar>);

impl Progress {
    pub fn new(total: u64) -> Progress {
        if !std::io::stderr().is_terminal() {
            return Progress(None);
        }
        let b = ProgressBar::new(total);
        b.set_style(
            ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        Progress(Some(b))
    }

    /// Names the run that starts now.
    pub fn start(&self, what: &str) {
        if let Some(b) = &self.0 {
            b.set_message(what.to_string());
        }
    }

    pub fn done_one(&self) {
        if let Some(b) = &self.0 {
            b.inc(1);
        }
    }

    /// A line for the user that must not be overdrawn by the bar.
    pub fn note(&self, line: &str) {
        match &self.0 {
            Some(b) => b.println(line),
            None => say(line),
        }
    }

    pub fn finish(&self) {
        if let Some(b) = &self.0 {
            b.finish_and_clear();
        }
    }
}
